"""Helpers for driving a router of a test's own on the real broker (tests/e2e/test_router_e2e.py,
tests/e2e/test_observability.py, bench/router_lag.py): a private input topic, the router's
settings for it, runs created by the producer's own intake code with their shards published
there, heartbeats, and fake groups (heartbeats with no worker behind them)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from evalstream.common import db, storage, topics
from evalstream.common.messages import GenerationParams, Heartbeat, Item, JobSpec, Shard, encode
from evalstream.common.topics_admin import ensure_topics
from evalstream.producer.intake import Intake
from tests.e2e.helpers import run_status, write_jsonl
from tests.support import admin_kafka, admin_settings, principal_settings, wait_until


async def create_topic(name: str, partitions: int = 3) -> None:
    admin = AIOKafkaAdminClient(**admin_kafka())
    await admin.start()
    try:
        if name not in await admin.list_topics():
            await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


def replay_answers(path: Path, items: list[dict[str, Any]]) -> str:
    """A replay model answering every item right; its SPEC is unique to `path`."""
    write_jsonl(path, [{"id": it["id"], "response": f"The answer is {it['answer']}."} for it in items])
    return f"replay:{path}"


def router_env(shards_topic: str, groups: list[str], **overrides: str) -> dict[str, str]:
    return {
        "ROUTER_SHARDS_TOPIC": shards_topic,
        "ROUTER_RETRY_TOPIC": "none",
        "ROUTER_GROUPS": ",".join(groups),
        "ROUTER_LAG_INTERVAL_S": "0.5",
        **overrides,
    }


async def submit_private(shards_topic: str, job: JobSpec) -> str:
    """Creates a run exactly as the producer does (with its database role and S3 key pair),
    publishing its shards to `shards_topic`."""
    assert job.run_id
    settings = principal_settings("producer")
    pool = await db.create_pool(settings.database_url, max_size=2)
    producer = AIOKafkaProducer(**admin_kafka(), acks="all")
    await producer.start()
    try:

        async def publish(payload: bytes, key: bytes) -> None:
            await producer.send_and_wait(shards_topic, payload, key=key)

        status = await Intake(settings, pool, storage.client(settings)).handle(job, job.run_id, publish)
        assert status == "running", status
        return job.run_id
    finally:
        await producer.stop()
        await pool.close()


async def publish_heartbeats(beats: list[Heartbeat | tuple[str, None]]) -> None:
    """Heartbeats (a `(worker_id, None)` pair is a tombstone: routers forget that worker)."""
    producer = AIOKafkaProducer(**admin_kafka(), acks="all")
    await producer.start()
    try:
        for hb in beats:
            if isinstance(hb, Heartbeat):
                await producer.send_and_wait(topics.HEARTBEATS, encode(hb), key=hb.worker_id.encode())
            else:
                await producer.send_and_wait(topics.HEARTBEATS, None, key=hb[0].encode())
    finally:
        await producer.stop()


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name} not exported"
    return float(found.group(1))


async def wait_completed(pg: asyncpg.Connection, run_id: str, timeout: float) -> None:
    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, timeout, interval=0.5, what=f"run {run_id} to complete")


# --------------------------------------------------------------------------- fake groups


class FakeGroup:
    """Heartbeats for a group with no worker behind it: its queue only grows, unless the
    test consumes it. Forgotten (tombstoned) at the end."""

    def __init__(self, name: str, model: str, p95_ms: float = 100.0) -> None:
        self.name, self.model, self.p95_ms = name, model, p95_ms
        self.task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            hb = Heartbeat(
                worker_id=f"{self.name}-0",
                group=self.name,
                model=self.model,
                ts=time.time(),
                device="cpu",
                latency_p95_ms=self.p95_ms,
            )
            await publish_heartbeats([hb])
            await asyncio.sleep(1.0)

    async def __aenter__(self) -> FakeGroup:
        await ensure_topics(admin_settings(), [self.name])
        self.task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task
        self.task.cancel()
        # a beat in flight must land before the tombstone, not after it: a heartbeat after
        # the tombstone keeps the group known (and dead) to every router started later
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await publish_heartbeats([(f"{self.name}-0", None)])


def shards_for(run_id: str, model: str, n: int, opt_in: bool = False) -> list[Shard]:
    return [
        Shard(
            run_id=run_id,
            shard_id=f"{run_id}-{i}",
            shard_index=i,
            shard_count=n,
            model=model,
            grader="auto",
            generation=GenerationParams(),
            items=[Item(id=f"{i}", question="1+1?", answer="2")],
            sla_fallback=opt_in,
        )
        for i in range(n)
    ]


async def publish_shards(topic: str, shards: list[Shard]) -> None:
    producer = AIOKafkaProducer(**admin_kafka(), acks="all")
    await producer.start()
    try:
        for s in shards:
            await producer.send_and_wait(topic, encode(s), key=s.run_id.encode())
    finally:
        await producer.stop()
