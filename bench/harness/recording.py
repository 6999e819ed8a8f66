"""The machine's description and the result files (bench/results/<name>.json), the common
command line, logging and timing."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness.paths import RESULTS, ROOT
from bench.harness.pure import cpu_model, git_commit, mem_total_bytes


def machine() -> dict[str, Any]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    load = os.getloadavg()
    return {
        "cpu_model": cpu_model(read("/proc/cpuinfo")),
        "cores": cores,
        "ram_bytes": mem_total_bytes(read("/proc/meminfo")),
        "torch": torch_version,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "git_commit": git_commit(ROOT / ".git"),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def write_result(name: str, payload: dict[str, Any], *, started: float, quick: bool) -> dict[str, Any]:
    """bench/results/<name>.json (quick runs: <name>.quick.json) with the machine's
    description; also printed."""
    doc = {
        "benchmark": name,
        "quick": quick,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "wall_s": round(time.monotonic() - started, 1),
        "machine": machine(),
        **payload,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / (f"{name}.quick.json" if quick else f"{name}.json")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    print(json.dumps(doc, indent=2, default=str))
    return doc


def arg_parser(description: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="a small smoke-test version")
    return ap


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Timer:
    """with Timer() as t: ...; t.s is the wall time in seconds (perf_counter)."""

    def __init__(self) -> None:
        self.s = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self._t0
