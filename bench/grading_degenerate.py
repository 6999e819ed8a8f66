"""Degenerate model outputs through every built-in grader step: seconds per (input, step).

Each measurement runs in a fresh child process killed after --cap seconds (reported as
{"timed_out": true}), so a super-linear pattern shows as a cap instead of hanging the bench.
Prints one JSON object: {step: {input: seconds | "timeout>cap"}}.

    .venv/bin/python bench/grading_degenerate.py [--cap 10] [--only choice,numeric] [--inputs a,b]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.degenerate when run as a script

from evalstream.common.messages import Item
from tests.degenerate import DEGENERATE

ITEMS = {
    "exact": Item(id="x", question="q", answer="Paris"),
    "numeric": Item(id="x", question="q", answer="42"),
    "choice": Item(id="x", question="q", answer="B", choices=["red", "green", "blue"]),
    "contains": Item(id="x", question="q", answer="the capital"),
    "json": Item(id="x", question="q", answer="1"),
    "regex": Item(id="x", question="q", answer="Paris"),
    "regex:Answer:\\s*(\\w+)": Item(id="x", question="q", answer="Paris"),
    "code": Item(id="x", question="def f():\n", answer=None, entry_point="f", test="def check(c): pass"),
}


def _steps() -> dict[str, Callable[[str], Any]]:
    from evalstream.worker.grading import clean, get_grader, judge
    from evalstream.worker.grading.code_exec import candidate_program

    def grader_step(spec: str, item: Item) -> Callable[[str], Any]:
        return lambda text: get_grader(spec, item)(text, item)

    steps = {f"grader:{spec}": grader_step(spec, item) for spec, item in ITEMS.items() if spec != "code"}
    steps["code:candidate_program"] = lambda text: candidate_program(text, ITEMS["code"])
    steps["judge:parse_verdict"] = judge.parse_verdict
    steps["judge:judge_messages"] = lambda text: judge.judge_messages(text, ITEMS["exact"])
    steps["clean:clean_response"] = clean.clean_response
    steps["clean:extract_code"] = clean.extract_code
    steps["clean:extract_json"] = clean.extract_json
    return steps


def _measure(step: str, text: str, out: Any) -> None:
    fn = _steps()[step]
    started = time.perf_counter()
    try:
        fn(text)
        out.send(("ok", time.perf_counter() - started))
    except Exception as exc:  # a grader's clear error counts as finishing
        out.send((f"{type(exc).__name__}", time.perf_counter() - started))


def measure(step: str, text: str, cap: float) -> float | str:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_measure, args=(step, text, child))
    proc.start()
    if parent.poll(cap):
        _, seconds = parent.recv()
        proc.join()
        return round(seconds, 4)
    proc.kill()
    proc.join()
    return f"timeout>{cap:g}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=10.0, help="seconds before a step counts as hung")
    parser.add_argument("--only", default="", help="comma-separated substrings of step names")
    parser.add_argument("--inputs", default="", help="comma-separated input names (default: all)")
    args = parser.parse_args()
    wanted = [w for w in args.only.split(",") if w]
    inputs = {k: v for k, v in DEGENERATE.items() if not args.inputs or k in args.inputs.split(",")}
    table: dict[str, dict[str, float | str]] = {}
    for step in _steps():
        if wanted and not any(w in step for w in wanted):
            continue
        table[step] = {name: measure(step, text, args.cap) for name, text in inputs.items()}
        slowest = max(table[step].items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else 1e9)
        print(json.dumps({"step": step, "slowest": slowest}), flush=True)
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
