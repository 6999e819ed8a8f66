"""Helpers for end-to-end tests: submit runs through evalctl (a replay run among them) or
straight to Kafka, and read back what the pipeline stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from tests.replay_files import replay_dir

ROOT = Path(__file__).resolve().parents[2]
EVALCTL = [sys.executable, "-m", "evalstream.cli"]


def evalctl(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*EVALCTL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"evalctl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def submit_wait(dataset: Path, *extra: str, timeout: float = 600) -> dict[str, Any]:
    proc = evalctl(
        "submit", str(dataset), "--wait", "--json", "--timeout", str(timeout), *extra, timeout=timeout + 60
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def replay_run(tmp: Path, name: str, items: list[dict[str, Any]], answers: dict[str, str]) -> dict[str, Any]:
    replay = write_jsonl(
        replay_dir() / f"{name}-answers.jsonl", [{"id": k, "response": v} for k, v in answers.items()]
    )
    summary = submit_wait(
        write_jsonl(tmp / f"{name}.jsonl", items),
        "--model",
        f"replay:{replay}",
        "--shard-size",
        "5",
        "--max-attempts",
        "1",
        "--name",
        name,
        timeout=240,
    )
    assert summary["status"] == "completed", summary
    return summary


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def arithmetic_items(n: int, prefix: str = "q") -> list[dict[str, Any]]:
    return [
        {
            "id": f"{prefix}{i:05d}",
            "question": f"What is {i} + {i % 7}?",
            "answer": str(i + i % 7),
            "category": "arithmetic",
        }
        for i in range(n)
    ]


async def result_rows(conn: asyncpg.Connection, run_id: str) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM item_results WHERE run_id = $1 ORDER BY item_id", run_id)


async def run_status(conn: asyncpg.Connection, run_id: str) -> str | None:
    return await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)


def results_jsonl(run_id: str) -> list[dict[str, Any]]:
    out = evalctl("results", run_id).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
