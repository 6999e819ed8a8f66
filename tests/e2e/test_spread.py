"""One run spreads over every worker of a group, and over several aggregators (issue 23):
a group of three workers of the test's own, a second aggregator beside the stack's, one run
pinned to the group. Every worker answers part of the run, every partition of the group's
work topic carries some of its shards, and both aggregators record some of its results,
while the run ends with exactly one row per item."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.group import MemberAssignment

from evalstream.common import topics
from evalstream.common.messages import JobSpec, Shard, ShardResult, decode, encode
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import arithmetic_items, result_rows, run_status, write_jsonl
from tests.support import (
    admin_kafka,
    admin_settings,
    read_records,
    topic_end_offsets,
    unique,
    upload_dataset,
    wait_until,
)

pytestmark = pytest.mark.stack

WORKERS = 3
ITEMS = 600


async def members_holding_partitions(group: str) -> tuple[str, int]:
    """(state, members holding a partition) of a worker group's consumer group."""
    admin = AIOKafkaAdminClient(**admin_kafka())
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([topics.worker_consumer_group(group)])
    finally:
        await admin.close()
    for response in described:
        for g in response.groups:  # (error, id, state, protocol type, protocol, members, ...)
            return g[2], sum(1 for m in g[5] if m[-1] and MemberAssignment.decode(m[-1]).assignment)
    return "Dead", 0


def run_items_counted(port: int, run_id: str) -> float:
    """The rows of the run an aggregator process wrote itself (its per-run counters)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    pattern = rf'^evalstream_run_items_total{{run_id="{re.escape(run_id)}",status="\w+"}} ([0-9.e+-]+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def _payload(value: bytes, kind: type[Any]) -> Any:
    try:
        return decode(value, kind)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def test_every_worker_of_a_group_and_both_aggregators_serve_one_run(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path, kafka_producer: Any, spawn: Any
) -> None:
    group = unique("spread")
    await ensure_topics(admin_settings(), [group])
    for i in range(WORKERS):
        proc, port = spawn(
            "evalstream.worker",
            WORKER_GROUP=group,
            WORKER_ID=f"{group}-{i}",
            WORKER_MODEL="null",
            ENGINE_DELAY_MS="5",  # the run lasts a few seconds: a GPU's pace, not an instant
        )
        await asyncio.to_thread(proc.wait_healthy, port)
    second, aggregator_port = spawn("evalstream.aggregator")
    await asyncio.to_thread(second.wait_healthy, aggregator_port)

    async def group_settled() -> bool:
        state, holding = await members_holding_partitions(group)
        return state == "Stable" and holding == WORKERS

    await wait_until(group_settled, 120, what=f"{WORKERS} workers holding partitions of {group}")

    run_id = unique("run-spread")
    job = JobSpec(
        dataset=upload_dataset(stack, write_jsonl(tmp_path / "d.jsonl", arithmetic_items(ITEMS, prefix="s"))),
        model="null",
        run_id=run_id,
        worker_group=group,
        shard_size=20,
    )
    work, results = topics.work_topic(group), topics.RESULTS
    starts = {t: await topic_end_offsets(t) for t in (work, results)}
    await kafka_producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())

    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, 240, what=f"run {run_id} to complete")
    rows = await result_rows(pg, run_id)
    assert len(rows) == ITEMS and len({r["item_id"] for r in rows}) == ITEMS

    # every partition of the group's work topic carried shards of the run
    shard_partitions = {
        r.partition
        for r in await read_records(work, starts[work])
        if (s := _payload(r.value or b"", Shard)) is not None and s.run_id == run_id
    }
    assert shard_partitions == set(range(len(starts[work]))), shard_partitions

    # every worker answered part of it
    served: dict[str, int] = {}
    for record in await read_records(results, starts[results]):
        if (r := _payload(record.value or b"", ShardResult)) is not None and r.run_id == run_id:
            served[r.worker_id] = served.get(r.worker_id, 0) + len(r.results)
    assert set(served) == {f"{group}-{i}" for i in range(WORKERS)}, served
    assert min(served.values()) >= ITEMS / WORKERS / 2, served  # none starved: 2 partitions each

    # and both aggregators recorded part of it, the two together every row once
    mine = run_items_counted(aggregator_port, run_id)
    assert 0 < mine < ITEMS, f"the second aggregator recorded {mine} of {ITEMS} rows"
