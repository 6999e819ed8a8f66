"""The fault suite's tools: the suite's scale, datasets and jobs published straight to
eval.jobs, a stack process killed, waits that have a deadline and say what they waited for,
and the time the pipeline took to recover from a fault. A scenario's runs, its fault window
and its verdict: tests/faults/scenario.py; what it reads: tests/faults/evidence.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from evalstream.common import topics
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.messages import GenerationParams, JobSpec, RetryPolicy, encode
from evalstream.common.settings import Settings
from tests.faults.evidence import count_rows, run_status, stack_pid
from tests.support import ROOT, unique, wait_until

# make test-faults runs the large sizes (1.0); make test runs every scenario scaled down.
SCALE = float(os.environ.get("FAULTS_SCALE", "1"))
REPORT = Path(
    os.environ.get(
        "FAULTS_REPORT",
        ROOT / "bench" / "results" / "faults.json"
        if SCALE >= 1
        else ROOT / "tests" / "artifacts" / "faults.json",
    )
)


def scaled(n: int, floor: int) -> int:
    """A scenario's size at this suite's scale, never below what its point needs."""
    return max(floor, int(n * SCALE))


def run_ids(prefix: str, n: int) -> list[str]:
    """n fresh run ids, drawn at random: nothing may depend on where a run's messages land
    (one run spreads over every partition whatever its id, spread.py)."""
    return [unique(f"run-{prefix}") for _ in range(n)]


# --------------------------------------------------------------------------- the stack


def kill(name: str, sig: int = signal.SIGKILL) -> None:
    pid = stack_pid(name)
    if name == "postgres":
        os.kill(pid, sig)  # the postmaster; its children follow
    else:
        os.killpg(pid, sig)


# --------------------------------------------------------------------------- datasets, jobs


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
    dataset: str,
    run_id: str,
    *,
    group: str | None = None,
    shard_size: int = 20,
    max_attempts: int = 3,
    base_delay_s: float = 0.5,
    multiplier: float = 2.0,
) -> None:
    """Publishes the job straight to eval.jobs, as any Kafka client may. Retries while the
    broker is away (a run submitted mid-outage), up to five minutes."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    job = JobSpec(
        dataset=dataset,
        model="null",
        run_id=run_id,
        worker_group=group,
        shard_size=shard_size,
        retry=RetryPolicy(max_attempts=max_attempts, base_delay_s=base_delay_s, multiplier=multiplier),
        generation=GenerationParams(max_tokens=8),
    )
    deadline = time.monotonic() + 300
    while True:
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")  # the users' principal
        try:
            await producer.start()
            await producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)
        finally:
            await producer.stop()


# --------------------------------------------------------------------------- waits


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.25
) -> float:
    """tests.support.wait_until, returning the seconds it took, where a check that raises
    OSError or a database error counts as not yet (the thing it reads may be what is down)."""
    t0 = time.monotonic()

    async def tolerant() -> bool:
        try:
            return await check()
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False

    await wait_until(tolerant, timeout, interval, what=what)
    return time.monotonic() - t0


async def wait_rows(settings: Settings, run_id: str, at_least: int, timeout: float) -> None:
    async def enough() -> bool:
        return await count_rows(settings, run_id) >= at_least

    await wait_for(enough, timeout, f"{at_least} results of run {run_id}")


async def wait_completed(settings: Settings, run_id: str, timeout: float) -> None:
    async def done() -> bool:
        return await run_status(settings, run_id) == "completed"

    await wait_for(done, timeout, f"run {run_id} to complete")


# --------------------------------------------------------------------------- recovery


def recovery_s(
    recorded: list[tuple[str, str, float]], fault_end: float, in_flight: set[tuple[str, str]]
) -> float | None:
    """Seconds from the fault's end to the first row (run_id, item_id, recorded at) of an
    item that was not in flight when the fault began (None: no such row came after it).
    Rows, not Kafka records: an outage of the aggregator's stores does not stop workers from
    publishing, only the pipeline from recording."""
    fresh = [t for run_id, item_id, t in recorded if t >= fault_end and (run_id, item_id) not in in_flight]
    return round(min(fresh) - fault_end, 2) if fresh else None
