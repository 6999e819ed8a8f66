"""Interference from other programs on a shared machine: CPU not ours, quiet repeats, the
headline figure."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.procstat import CLK_TCK, cpu_seconds, pid_of
from bench.harness.pure import fmt_num, summarize

STACK_PROCESSES = ("kafka", "postgres", "s3", "prometheus", "producer", "router", "aggregator", "worker-0")


def parse_cpu_busy_ticks(stat: str) -> int:
    """Busy ticks of all CPUs from /proc/stat's first line (everything but idle and iowait)."""
    fields = stat.splitlines()[0].split()
    assert fields[0] == "cpu"
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return user + nice + system + irq + softirq + steal


def own_cpu_s() -> float:
    """CPU seconds of the bench stack's processes and of this process with its children."""
    total = cpu_seconds(os.getpid())
    for name in STACK_PROCESSES:
        pid = pid_of(name)
        if pid is not None:
            total += cpu_seconds(pid)
    return total


class Interference:
    """How many cores other work on the machine kept busy while a measurement ran: all CPU
    time (/proc/stat) less this benchmark's own (its stack and this process tree)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.machine0 = parse_cpu_busy_ticks(Path("/proc/stat").read_text()) / CLK_TCK
        self.own0 = own_cpu_s()

    def cores(self) -> float:
        elapsed = time.monotonic() - self.t0
        machine = parse_cpu_busy_ticks(Path("/proc/stat").read_text()) / CLK_TCK - self.machine0
        own = own_cpu_s() - self.own0
        return round(max(0.0, machine - own) / elapsed, 3) if elapsed > 0 else 0.0


def quiet_pairs(foreign: Sequence[tuple[float, float]], tolerance: float = 0.25) -> list[int]:
    """Indices of the repeats whose two arms ran under about the same outside load (other
    work on the machine, in cores, differing by at most `tolerance`): their ratio compares
    like with like."""
    return [i for i, (a, b) in enumerate(foreign) if abs(a - b) <= tolerance]


def headline(values: Sequence[float], foreign: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """The median of the repeats whose arms saw the same outside load when there are at
    least two of them, else of all repeats (flagged)."""
    quiet = quiet_pairs(foreign)
    chosen = [values[i] for i in quiet] if len(quiet) >= 2 else list(values)
    return {
        **summarize(chosen),
        "of_repeats": quiet if len(quiet) >= 2 else list(range(len(values))),
        "all_repeats": summarize(values),
        "noisy": len(quiet) < 2,
    }


def headline_text(h: Mapping[str, Any], unit: str = "") -> str:
    """`1.02× (median of 3 repeats under equal outside load, 0.98–1.10; all 5: 1.05×)`."""
    n_all = h["all_repeats"]["n"]
    which = (
        f"median of {h['n']}, outside load too uneven to pick"
        if h["noisy"]
        else f"median of {h['n']} of {n_all} repeats under equal outside load"
    )
    text = f"{fmt_num(h['median'])}{unit} ({which}; {fmt_num(h['min'])}–{fmt_num(h['max'])}"
    if not h["noisy"] and h["n"] != n_all:
        text += f"; all {n_all}: {fmt_num(h['all_repeats']['median'])}{unit}"
    return text + ")"
