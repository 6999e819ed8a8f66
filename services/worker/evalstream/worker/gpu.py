"""Device metrics for heartbeats and Prometheus gauges: NVML when an NVIDIA GPU is present,
/proc otherwise. Never raises: a missing driver or library means the CPU fallback."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from evalstream.common.settings import GpuSettings


@dataclass(frozen=True)
class DeviceMetrics:
    device: str  # "NVIDIA H100 80GB HBM3" or "cpu"
    gpu_utilization: float | None = None  # 0..1
    gpu_memory_used_bytes: int | None = None
    gpu_memory_free_bytes: int | None = None
    gpu_temperature_c: float | None = None
    gpu_power_w: float | None = None
    cpu_utilization: float | None = None  # 0..1, whole machine, since the previous sample
    memory_used_bytes: int | None = None  # this process's resident set
    memory_free_bytes: int | None = None  # MemAvailable of the host
    sampled_at: float = 0.0

    def heartbeat_fields(self) -> dict[str, Any]:
        """The fields that messages.Heartbeat has, by the same names."""
        names = (
            "gpu_utilization",
            "gpu_memory_used_bytes",
            "gpu_memory_free_bytes",
            "gpu_temperature_c",
            "gpu_power_w",
            "cpu_utilization",
        )
        values = asdict(self)
        return {n: values[n] for n in names}


class _Nvml:
    """NVML, initialised once per process; `handle` is None when there is no usable GPU."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.name = "cpu"
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() < 1:
                return
            self.handle = _visible_gpu_handle(pynvml)
            name = pynvml.nvmlDeviceGetName(self.handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self.handle = None
            self.name = "cpu"

    def sample(self) -> dict[str, Any]:
        import pynvml

        h = self.handle
        out: dict[str, Any] = {}
        # each query on its own: some devices (MIG slices, some boards) lack power or temperature
        queries = {
            "gpu_utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
            "gpu_memory_used_bytes": lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).used),
            "gpu_memory_free_bytes": lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).free),
            "gpu_temperature_c": lambda: float(
                pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            ),
            "gpu_power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }
        for key, query in queries.items():
            try:
                out[key] = query()
            except Exception:
                out[key] = None
        return out


def _visible_gpu_handle(pynvml: Any) -> Any:
    """The GPU that CUDA calls device 0: NVML numbers all GPUs, ignoring CUDA_VISIBLE_DEVICES."""
    first = GpuSettings.from_env().cuda_visible_devices.split(",")[0].strip()
    if first.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(first))
    if first.startswith("GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    return pynvml.nvmlDeviceGetHandleByIndex(0)


class _CpuSampler:
    """Machine CPU utilisation from /proc/stat deltas between calls (the first call reports
    the average since boot)."""

    def __init__(self) -> None:
        self._previous: tuple[int, int] = (0, 0)
        self._lock = threading.Lock()

    def utilization(self) -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # guest time is already counted in user
        with self._lock:
            prev_idle, prev_total = self._previous
            self._previous = (idle, total)
        busy_delta, total_delta = (total - idle) - (prev_total - prev_idle), total - prev_total
        if total_delta <= 0:
            return None
        return min(1.0, max(0.0, busy_delta / total_delta))


def _proc_bytes(path: str, field: str) -> int | None:
    """A "Field:   1234 kB" line of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _meminfo_available() -> int | None:
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def _process_rss() -> int | None:
    return _proc_bytes("/proc/self/status", "VmRSS")


_nvml: _Nvml | None = None
_nvml_lock = threading.Lock()
_cpu = _CpuSampler()


def _get_nvml() -> _Nvml:
    global _nvml
    with _nvml_lock:
        if _nvml is None:
            _nvml = _Nvml()
        return _nvml


def nvidia_gpu_present() -> bool:
    """Whether NVML sees a GPU (CUDA may still not be usable: torch has the last word)."""
    return _get_nvml().handle is not None


def sample_device_metrics() -> DeviceMetrics:
    nvml = _get_nvml()
    gpu = nvml.sample() if nvml.handle is not None else {}
    return DeviceMetrics(
        device=nvml.name,
        cpu_utilization=_cpu.utilization(),
        memory_used_bytes=_process_rss(),
        memory_free_bytes=_meminfo_available(),
        sampled_at=time.time(),
        **gpu,
    )
