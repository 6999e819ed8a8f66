"""Services started as stack.py would start them, but under a sampler (bench/harness/sampler.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.benchstack import client_env, metrics, service_port, stack, stack_dir, wait_http
from bench.harness.paths import BENCH, PY, ROOT
from bench.harness.procstat import CLK_TCK
from bench.harness.pure import metric_sum
from bench.harness.recording import log


def service_env(name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ops/local/stack.py gives a service."""
    env = {
        **os.environ,
        "HTTP_PORT": str(service_port(name)),
        "PYTHONUNBUFFERED": "1",
        **client_env(name.split("-")[0]),
    }
    if name.startswith("worker-"):
        env["WORKER_ID"] = name
    env.update(extra or {})
    return env


def spawn(name: str, argv: Sequence[str], extra_env: Mapping[str, str] | None = None) -> int:
    """Starts a stack service as stack.py would (its environment, pid file and log), without
    waiting for it; returns its pid. Stop it with `stack("stop", name)`."""
    run_dir, log_dir = stack_dir() / "run", stack_dir() / "logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{name}.log").open("ab") as out:
        p = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=service_env(name, extra_env),
            start_new_session=True,
            cwd=ROOT,
        )
    (run_dir / f"{name}.pid").write_text(str(p.pid))
    return p.pid


def start_sampled(name: str, out_prefix: Path, extra_env: Mapping[str, str] | None = None) -> None:
    """(Re)starts a stack service under bench/harness/sampler.py (CPU-weighted stack samples of
    every thread), with the pid file and log where stack.py keeps them."""
    stack("stop", name)
    module = f"evalstream.{name.split('-')[0]}"
    spawn(
        name,
        [str(PY), str(BENCH / "harness" / "sampler.py"), "--out", str(out_prefix), "-m", module],
        extra_env,
    )
    wait_http(f"http://127.0.0.1:{service_port(name)}/healthz", 180)


def boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime"):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def process_start_epoch(pid: int) -> float:
    """When a process started (Unix time), from /proc/<pid>/stat's starttime."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return boot_time() + int(rest[19]) / CLK_TCK


def wait_pipeline_ready(timeout: float = 120, workers: int = 1) -> float:
    """Seconds until the `workers` workers are ready and the router counts them live."""
    t0 = time.monotonic()
    for i in range(workers):
        wait_http(f"http://127.0.0.1:{service_port(f'worker-{i}')}/readyz", timeout)
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(OSError, urllib.error.URLError):
            if (
                metric_sum(metrics("router"), "evalstream_router_group_live_members", worker_group="default")
                >= workers
            ):
                return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(f"the router never saw {workers} live workers")


class Budget:
    """Wall-time allowance of a benchmark's repeats, so that `make bench` stays within its
    30 minutes on a machine shared with other work: once spent, no further repeat starts
    (after the minimum). BENCH_TIME_SCALE multiplies every allowance."""

    def __init__(self, seconds: float, min_repeats: int) -> None:
        self.seconds = seconds * float(os.environ.get("BENCH_TIME_SCALE", "1"))
        self.min_repeats = min_repeats
        self.t0 = time.monotonic()
        self.stopped_early = False

    def another(self, done: int, wanted: int) -> bool:
        """Whether repeat number `done` (0-based) should run."""
        if done >= wanted:
            return False
        if done >= self.min_repeats and time.monotonic() - self.t0 > self.seconds:
            log(f"time allowance of {self.seconds:.0f} s spent: stopping after {done} repeats")
            self.stopped_early = True
            return False
        return True

    def range(self, wanted: int) -> Iterator[int]:
        """0, 1, … up to `wanted` repeats, fewer once the allowance is spent."""
        done = 0
        while self.another(done, wanted):
            yield done
            done += 1
        self.done = done

    def as_dict(self) -> dict[str, Any]:
        return {
            "allowance_s": self.seconds,
            "repeats_done": getattr(self, "done", None),
            "stopped_early": self.stopped_early,
        }


def read_profiles(folder: Path, names: Sequence[str]) -> dict[str, Any]:
    """The top of each service's sampled profile (`folder`/<name>.json, written by
    bench/harness/sampler.py when the service stops): busy seconds, the functions most often
    on top of the stack (self) and anywhere on it (inclusive), and the packages."""
    out: dict[str, Any] = {}
    for name in names:
        path = folder / f"{name}.json"
        if path.exists():
            data = json.loads(path.read_text())
            out[name] = {
                "sampled_busy_s": data["sampled_busy_s"],
                "self_top": data["self"][:12],
                "inclusive_top": data["inclusive"][:25],
                "by_package": data.get("by_package", []),
            }
    return out


# frames every sample of a service passes through: they say nothing about where time goes
ENTRY_POINTS = ("<module> (", "main (", "run (evalstream/common/service.py")


def _short(label: str) -> str:
    return label.split(" (")[0]


def profile_note(services: Mapping[str, Any]) -> str:
    """One line per service of read_profiles: by package, the project's own functions, and
    the leaves, each with its share of the busy samples."""
    parts = []
    for name, p in services.items():
        owners = ", ".join(f"{f['package']} {f['share']:.0%}" for f in p.get("by_package", [])[:5])
        hot = [
            f
            for f in p["inclusive_top"]
            if "evalstream" in f["function"] and not f["function"].startswith(ENTRY_POINTS)
        ]
        own = ", ".join(f"{_short(f['function'])} {f['share']:.0%}" for f in hot[:3])
        leaf = ", ".join(f"{_short(f['function'])} {f['share']:.0%}" for f in p["self_top"][:3])
        parts.append(
            f"{name} ({p['sampled_busy_s']:.1f} s busy): by package {owners}; project functions {own or '–'}; "
            f"leaves {leaf}"
        )
    return " | ".join(parts)
