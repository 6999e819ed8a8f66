"""The fault suite's tools: drive runs, break things, and check the invariant.

The invariant, checked after every scenario: the run completes; the item ids in the
dataset equal the result rows in PostgreSQL, with no duplicates; the Parquet files in S3
hold the same items, each once; every failure is a recorded failed item with its error.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pyarrow.parquet as pq

from evalstream.common import storage
from evalstream.common.messages import GenerationParams, JobSpec, RetryPolicy, encode
from evalstream.common.settings import Settings
from tests.support import ROOT, STACK, upload_dataset

REPORT = ROOT / "bench" / "results" / "faults.json"


@dataclass
class Invariant:
    run_id: str
    status: str | None
    expected: int
    rows: int
    lost: int
    duplicated: int
    parquet_items: int
    parquet_duplicated: int
    parquet_missing: int
    failures: int
    failures_without_error: int
    problems: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.problems


async def check_invariant(settings: Settings, run_id: str, expected_ids: set[str]) -> Invariant:
    conn = await asyncpg.connect(settings.database_url)
    try:
        status = await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
        rows = await conn.fetch("SELECT item_id, error FROM item_results WHERE run_id = $1", run_id)
    finally:
        await conn.close()
    ids = [r["item_id"] for r in rows]
    s3 = storage.client(settings)
    names = [
        o.object_name
        for o in s3.list_objects(settings.s3_bucket_results, prefix=f"runs/{run_id}/results/", recursive=True)
    ]
    parquet_ids: list[str] = []
    for name in names:
        table = pq.read_table(io.BytesIO(storage.get_bytes(s3, settings.s3_bucket_results, name)))
        parquet_ids += table.column("item_id").to_pylist()
    failures = [r for r in rows if r["error"] is not None]
    inv = Invariant(
        run_id=run_id,
        status=status,
        expected=len(expected_ids),
        rows=len(rows),
        lost=len(expected_ids - set(ids)),
        duplicated=len(ids) - len(set(ids)),
        parquet_items=len(parquet_ids),
        parquet_duplicated=len(parquet_ids) - len(set(parquet_ids)),
        parquet_missing=len(expected_ids - set(parquet_ids)),
        failures=len(failures),
        failures_without_error=sum(1 for r in failures if not r["error"].strip()),
    )
    if status != "completed":
        inv.problems.append(f"run status {status}")
    if set(ids) != expected_ids:
        inv.problems.append(f"rows: {inv.lost} lost, {len(set(ids) - expected_ids)} unexpected")
    if inv.duplicated or inv.parquet_duplicated:
        inv.problems.append(f"duplicates: {inv.duplicated} rows, {inv.parquet_duplicated} in Parquet")
    if set(parquet_ids) != expected_ids:
        inv.problems.append(f"Parquet: {inv.parquet_missing} items missing")
    if inv.failures_without_error:
        inv.problems.append(f"{inv.failures_without_error} failures without an error")
    return inv


def record(scenario: str, inv: Invariant, recover_s: float | None, total_s: float, **extra: Any) -> None:
    """Appends the scenario's row to bench/results/faults.json (the note's table)."""
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    rows[scenario] = {
        "items": inv.expected,
        "lost": inv.lost,
        "duplicated": inv.duplicated + inv.parquet_duplicated,
        "failed_items": inv.failures,
        "recover_s": None if recover_s is None else round(recover_s, 2),
        "total_s": round(total_s, 2),
        "holds": inv.holds,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **extra,
    }
    REPORT.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- the stack


def stack_cmd(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [sys.executable, "ops/local/stack.py", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )


def stack_pid(name: str) -> int:
    if name == "postgres":
        return int((STACK / "postgres" / "postmaster.pid").read_text().splitlines()[0])
    return int((STACK / "run" / f"{name}.pid").read_text())


def kill(name: str, sig: int = signal.SIGKILL) -> None:
    pid = stack_pid(name)
    if name == "postgres":
        os.kill(pid, sig)  # the postmaster; its children follow
    else:
        os.killpg(pid, sig)


# --------------------------------------------------------------------------- runs


def items(n: int, prefix: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{prefix}{i:06d}", "question": f"What is {i} plus {i % 13}?", "answer": str(i + i % 13)}
        for i in range(n)
    ]


def write_dataset(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def submit(
    settings: Settings,
    dataset: Path,
    run_id: str,
    *,
    group: str | None = None,
    shard_size: int = 20,
    max_attempts: int = 3,
    base_delay_s: float = 0.5,
    multiplier: float = 2.0,
) -> None:
    """Publishes the job straight to eval.jobs, as any Kafka client may."""
    from aiokafka import AIOKafkaProducer

    job = JobSpec(
        dataset=upload_dataset(settings, dataset),
        model="null",
        run_id=run_id,
        worker_group=group,
        shard_size=shard_size,
        retry=RetryPolicy(max_attempts=max_attempts, base_delay_s=base_delay_s, multiplier=multiplier),
        generation=GenerationParams(max_tokens=8),
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait("eval.jobs", encode(job), key=run_id.encode())
    finally:
        await producer.stop()


async def count_rows(settings: Settings, run_id: str) -> int:
    conn = await asyncpg.connect(settings.database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id))
    finally:
        await conn.close()


async def run_status(settings: Settings, run_id: str) -> str | None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        return await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
    finally:
        await conn.close()


async def wait_rows(settings: Settings, run_id: str, at_least: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await count_rows(settings, run_id) >= at_least:
                return
        except (OSError, asyncpg.PostgresError):
            pass  # the database may be the thing that is down
        await asyncio.sleep(0.2)
    raise AssertionError(f"run {run_id}: fewer than {at_least} results after {timeout}s")


async def wait_completed(settings: Settings, run_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await run_status(settings, run_id) == "completed":
                return
        except (OSError, asyncpg.PostgresError):
            pass
        await asyncio.sleep(0.3)
    raise AssertionError(
        f"run {run_id} not completed after {timeout}s ({await count_rows(settings, run_id)} results)"
    )


async def time_to_progress(settings: Settings, run_id: str, timeout: float) -> float:
    """Seconds until a new result is recorded (or the run completes): recovery time."""
    t0 = time.monotonic()
    before = await _rows_or_none(settings, run_id)
    while time.monotonic() - t0 < timeout:
        now = await _rows_or_none(settings, run_id)
        if now is not None and (before is None or now > before):
            return time.monotonic() - t0
        if now is not None and await run_status(settings, run_id) == "completed":
            return time.monotonic() - t0
        await asyncio.sleep(0.1)
    raise AssertionError(f"no progress within {timeout}s")


async def _rows_or_none(settings: Settings, run_id: str) -> int | None:
    try:
        return await count_rows(settings, run_id)
    except (OSError, asyncpg.PostgresError):
        return None


def summary(inv: Invariant) -> str:
    return json.dumps(asdict(inv), indent=1)
