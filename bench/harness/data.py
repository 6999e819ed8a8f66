"""Data sets the benchmarks generate (arithmetic questions with known answers)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.harness.benchstack import stack_dir


def arithmetic_rows(n: int, seed: int, prefix: str = "q") -> list[dict[str, Any]]:
    """`n` distinct short questions with one-line answers (distinct, so that no item of a
    run is served from the answer cache by another). A different seed gives different
    questions of the same shape and length."""
    import random

    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    # two-digit numbers while they leave room (3 ops × 90 × 8 questions), larger beyond
    hi = 99 if n <= 1000 else 10 ** (len(str(n)) + 1) - 1
    while len(rows) < n:
        a, b = rnd.randint(10, hi), rnd.randint(2, 9)
        op = ("+", "-", "*")[len(rows) % 3]
        question = f"What is {a} {op} {b}?"
        if question in seen:
            continue
        seen.add(question)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append(
            {"id": f"{prefix}{len(rows):05d}", "question": question, "answer": str(answer), "category": op}
        )
    return rows


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def data_dir() -> Path:
    d = stack_dir() / "bench-data"
    d.mkdir(parents=True, exist_ok=True)
    return d
