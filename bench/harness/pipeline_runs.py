"""Runs through the whole pipeline: submit with evalctl, wait for every result."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.data import data_dir, write_jsonl


class Unfinished(TimeoutError):
    """A run that had not every result in PostgreSQL when its time was up."""

    def __init__(self, run_id: str, done: int, total: int, timeout: float) -> None:
        super().__init__(f"run {run_id}: {done}/{total} results after {timeout:.0f}s")
        self.run_id, self.done, self.total, self.timeout = run_id, done, total, timeout


@dataclass
class PipelineRun:
    run_id: str
    items: int
    submit_s: float  # validation + upload + publish (in-process evalctl submit)
    elapsed_s: float  # submit start -> every result in PostgreSQL
    failed: int
    cache_hits: int

    @property
    def items_per_s(self) -> float:
        return self.items / self.elapsed_s if self.elapsed_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "items": self.items,
            "submit_s": round(self.submit_s, 3),
            "elapsed_s": round(self.elapsed_s, 3),
            "items_per_s": round(self.items_per_s, 3),
            "failed": self.failed,
            "cache_hits": self.cache_hits,
        }


def submit(dataset: Path, *extra: str) -> str:
    """`evalctl submit DATASET EXTRA...` in this process (no interpreter start in the
    timing): validates, uploads and publishes exactly as the command does; returns the run id."""
    from evalstream.cli.main import build_parser
    from evalstream.cli.submit import cmd_submit
    from evalstream.common.settings import Settings

    args = build_parser().parse_args(["submit", str(dataset), *extra])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        asyncio.run(cmd_submit(args, Settings.from_env()))
    run_id = out.getvalue().strip().splitlines()[-1].strip()
    if not run_id.startswith("run-"):
        raise RuntimeError(f"evalctl submit printed {out.getvalue()!r} {err.getvalue()!r}")
    return run_id


async def wait_results(run_id: str, total: int, timeout: float, poll_s: float) -> tuple[float, int, int]:
    import asyncpg

    conn = await asyncpg.connect(os.environ["DATABASE_URL"])
    try:
        deadline = time.monotonic() + timeout
        while True:
            # runs.recorded counts the rows in the writing transaction: one row to read, where
            # counting 150,000 rows every poll would load the database being measured
            n = await conn.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) or 0
            if n >= total:
                seen = time.time()
                row = await conn.fetchrow(
                    "SELECT count(*) FILTER (WHERE error IS NOT NULL) AS failed,"
                    " count(*) FILTER (WHERE cache_hit) AS hits FROM item_results WHERE run_id = $1",
                    run_id,
                )
                assert row is not None
                return seen, int(row["failed"]), int(row["hits"])
            status = await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
            if status == "rejected":
                raise RuntimeError(f"run {run_id} was rejected")
            if time.monotonic() > deadline:
                raise Unfinished(run_id, int(n), total, timeout)
            await asyncio.sleep(poll_s)
    finally:
        await conn.close()


async def wait_status(run_id: str, status: str, timeout: float) -> None:
    """Until the run has `status` (its rows come first: completion follows them)."""
    import asyncpg

    conn = await asyncpg.connect(os.environ["DATABASE_URL"])
    try:
        deadline = time.monotonic() + timeout
        while await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) != status:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} not {status} after {timeout:.0f}s")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


def run_pipeline(
    rows: Sequence[Mapping[str, Any]] | Path,
    *extra: str,
    total: int | None = None,
    name: str = "bench",
    timeout: float = 1800,
    poll_s: float = 0.05,
) -> PipelineRun:
    """Submits a data set (rows, or a JSONL file already written) and waits until every
    item has its row in PostgreSQL. The clock runs from the start of `submit` to the poll
    that saw the last row."""
    if isinstance(rows, Path):
        path = rows
        assert total is not None
    else:
        path = write_jsonl(data_dir() / f"{name}-{time.time_ns()}.jsonl", rows)
        total = len(rows)
    t0 = time.time()
    run_id = submit(path, "--name", name, *extra)
    submitted = time.time()
    done, failed, hits = asyncio.run(wait_results(run_id, total, timeout, poll_s))
    if not isinstance(rows, Path):
        path.unlink(missing_ok=True)
    return PipelineRun(run_id, total, submitted - t0, done - t0, failed, hits)
