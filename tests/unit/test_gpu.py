"""Device metrics: the CPU fallback here (this machine has no GPU); NVML where one exists."""

from __future__ import annotations

import sys
import time

import pytest

from evalstream.common.messages import Heartbeat
from evalstream.worker import gpu


def test_metrics_are_in_range() -> None:
    gpu.sample_device_metrics()
    time.sleep(0.2)
    m = gpu.sample_device_metrics()
    assert m.cpu_utilization is None or 0.0 <= m.cpu_utilization <= 1.0
    assert m.memory_used_bytes is not None and m.memory_used_bytes > 10_000_000  # a Python process
    assert m.memory_free_bytes is not None and m.memory_free_bytes > 0
    if m.device == "cpu":
        assert (m.gpu_utilization, m.gpu_memory_used_bytes, m.gpu_memory_free_bytes) == (None, None, None)
        assert (m.gpu_temperature_c, m.gpu_power_w) == (None, None)
    else:
        assert m.gpu_utilization is None or 0.0 <= m.gpu_utilization <= 1.0
        assert m.gpu_memory_free_bytes is None or m.gpu_memory_free_bytes >= 0
    hb = Heartbeat(
        worker_id="w", group="g", model="null", ts=m.sampled_at, device=m.device, **m.heartbeat_fields()
    )
    assert hb.cpu_utilization == m.cpu_utilization


def test_missing_nvml_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    monkeypatch.setattr(gpu, "_nvml", None)
    m = gpu.sample_device_metrics()
    assert m.device == "cpu" and m.gpu_utilization is None
    monkeypatch.setattr(gpu, "_nvml", None)  # the next sample re-initialises for real
