"""Process accounting from /proc: pids of the stack's processes, CPU seconds, resident memory."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.benchstack import stack_dir
from bench.harness.pure import parse_proc_stat, parse_status_kib


def pid_of(name: str) -> int | None:
    """The pid of a stack process from its pid file (PostgreSQL: its postmaster.pid)."""
    path = (
        stack_dir() / "postgres" / "postmaster.pid"
        if name == "postgres"
        else stack_dir() / "run" / f"{name}.pid"
    )
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = parse_proc_stat((d / "stat").read_text())["ppid"]
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def tree(pid: int, kids: Mapping[int, list[int]] | None = None) -> list[int]:
    kids = kids if kids is not None else children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, *, include_tree: bool = True) -> float:
    """User + system CPU seconds of a process, its reaped children (cutime/cstime) and,
    with `include_tree`, its live descendants (PostgreSQL's backends)."""
    total = 0
    pids = tree(pid) if include_tree else [pid]
    for i, p in enumerate(pids):
        try:
            st = parse_proc_stat(Path(f"/proc/{p}/stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
        total += st["utime"] + st["stime"] + (st["cutime"] + st["cstime"] if i == 0 else 0)
    return total / CLK_TCK


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM: the most resident memory the process ever had (restart it to reset)."""
    try:
        kib = parse_status_kib(Path(f"/proc/{pid}/status").read_text(), "VmHWM")
    except OSError:
        return None
    return kib * 1024 if kib is not None else None


def rss_bytes(pid: int) -> int | None:
    try:
        kib = parse_status_kib(Path(f"/proc/{pid}/status").read_text(), "VmRSS")
    except OSError:
        return None
    return kib * 1024 if kib is not None else None


@dataclass
class CpuMeter:
    """CPU seconds each named stack process spent between start() and stop()."""

    names: Sequence[str]
    before: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self.before = {n: cpu_seconds(p) for n in self.names if (p := pid_of(n)) is not None}

    def stop(self) -> dict[str, float]:
        for n, b in self.before.items():
            p = pid_of(n)
            if p is not None:
                self.used[n] = round(cpu_seconds(p) - b, 3)
        return self.used


CONTROL_ROWS = 20_000


def cpu_control_us() -> float:
    """The machine's speed now, as µs per row of a fixed workload in this process (stdlib
    JSON and SHA-256 over the same rows, best of 3): it shares no code with the project, so
    runs of any commit compare on it. These machines are shared and their speed drifts by a
    fifth within an hour; a run's rate read beside this says how much was the machine."""
    import hashlib
    import json
    import time

    rows = [
        {"id": f"n{i:07d}", "question": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)}
        for i in range(CONTROL_ROWS)
    ]
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for row in rows:
            hashlib.sha256(json.dumps(row, sort_keys=True).encode()).digest()
            json.loads(json.dumps(row))
        best = min(best, time.perf_counter() - started)
    return round(best / CONTROL_ROWS * 1e6, 3)
