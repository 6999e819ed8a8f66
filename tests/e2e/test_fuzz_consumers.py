"""Fuzzing every consumer on the real stack (issue 26): 1,000 random and mutated messages on
each topic a principal may write (truncated, nested thousands deep, huge, wrong types,
NULs, invalid UTF-8, random bytes, valid messages with one field made hostile), then one
valid job. The job completes with every item, and every consumer group's lag comes back to
0: no message stopped a partition. The messages are seeded: a failure names the seed.

The dev stack's default worker group serves `null`, so valid shards among the mutations are
answered at once (their results, of runs nobody made, end as dead letters); jobs name a
dataset that does not exist, so none becomes a run that does work."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common import topics
from evalstream.common.lag import group_lag
from evalstream.common.messages import (
    GenerationParams,
    Heartbeat,
    Item,
    ItemResult,
    JobSpec,
    Redrive,
    Shard,
    ShardResult,
    encode,
)
from evalstream.common.settings import Settings
from tests.e2e.helpers import arithmetic_items, result_rows, run_status, write_jsonl
from tests.support import admin_kafka, admin_settings, unique, upload_dataset, wait_until

pytestmark = pytest.mark.stack

PER_TOPIC = 1000
SEED = 26
MISSING = "s3://evalstream-datasets/fuzz/no-such-dataset.jsonl"


def samples() -> dict[str, bytes]:
    """A valid message of each topic's type, for the mutations to start from."""
    shard = Shard(
        run_id="run-fuzz",
        shard_id="run-fuzz-s00000",
        shard_index=0,
        shard_count=1,
        model="null",
        grader="exact",
        generation=GenerationParams(max_tokens=4),
        items=[Item(id="f1", question="What is 1 + 1?", answer="2", meta={"k": [1, {"a": "b"}]})],
    )
    result = ShardResult(
        run_id="run-fuzz",
        shard_id=shard.shard_id,
        worker_id="w",
        group="default",
        results=[
            ItemResult(
                run_id="run-fuzz",
                item_id="f1",
                shard_id=shard.shard_id,
                response="2",
                extracted="2",
                correct=True,
                score=1.0,
            )
        ],
    )
    heartbeat = Heartbeat(worker_id="fuzz-w", group="fuzz-group", model="null", ts=0.0, device="cpu")
    return {
        topics.JOBS: encode(JobSpec(dataset=MISSING, model="null", name="fuzz")),
        topics.SHARDS: encode(shard),
        topics.RETRY: encode(shard),
        topics.work_topic("default"): encode(shard),
        topics.RESULTS: encode(result),
        topics.DLQ: encode(shard),
        topics.CONTROL: encode(Redrive(run_id="run-fuzz")),
        topics.HEARTBEATS: encode(heartbeat),
    }


def hostile_value(rng: random.Random) -> Any:
    choice = rng.randrange(8)
    if choice == 0:
        return "x\x00y"
    if choice == 1:
        return "é" * rng.randrange(1, 50_000)
    if choice == 2:
        value: Any = 1
        for _ in range(rng.randrange(40, 900)):  # json.dumps recurses; deeper ones are made as bytes
            value = {"a": value} if rng.random() < 0.5 else [value]
        return value
    if choice == 3:
        return rng.choice([None, True, -1, 2**70, 1e308, [], {}, ""])
    if choice == 4:
        return "../../etc/passwd"
    if choice == 5:
        return "a/../R"
    if choice == 6:
        return {"\x00": "\x00"}
    return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(1, 200)))


def mutations(base: bytes, rng: random.Random) -> Iterator[bytes]:
    """Endless hostile variants of `base`."""
    obj = json.loads(base)
    makers: list[Callable[[], bytes]] = [
        lambda: base[: rng.randrange(len(base))],  # truncated
        lambda: b'{"a":' * rng.randrange(100, 6000) + b"1" + b"}" * rng.randrange(100, 6000),  # nested
        lambda: b"[" * rng.randrange(100, 6000),
        lambda: b'{"x":"' + b"a" * rng.randrange(100_000, 900_000) + b'"}',  # huge
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))),  # random bytes
        lambda: base.replace(b'"', b'"\xff\xfe', 1),  # invalid UTF-8
        lambda: base.replace(b"fuzz", b"fu\\u0000zz"),  # NUL in a string
        lambda: b'{"kind":"regrade","run_id":"run-fuzz","new_run_id":"x/slash","grader":"exact"}',
        lambda: json.dumps(rng.choice([[], "job", 3, None, [obj]])).encode(),  # wrong shape
    ]

    def one_field_hostile() -> bytes:
        mutated = dict(obj)
        key = rng.choice([*mutated, "unknown_field"])
        mutated[key] = hostile_value(rng)
        return json.dumps(mutated).encode()

    makers.append(one_field_hostile)
    while True:
        yield rng.choice(makers)()


GROUPS = {
    topics.PRODUCER_GROUP: topics.JOBS,
    topics.ROUTER_GROUP: topics.SHARDS,
    topics.RETRY_GROUP: topics.RETRY,
    topics.worker_consumer_group("default"): topics.work_topic("default"),
    topics.AGGREGATOR_GROUP: topics.RESULTS,
    topics.AGGREGATOR_DLQ_GROUP: topics.DLQ,
    topics.AGGREGATOR_CONTROL_GROUP: topics.CONTROL,
}


async def test_a_thousand_hostile_messages_per_topic_stop_no_consumer(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    producer = AIOKafkaProducer(**admin_kafka(), acks="all", max_request_size=1024 * 1024)
    await producer.start()
    sent = 0
    try:
        for topic, base in samples().items():
            variants = mutations(base, rng)
            batch = []
            for _ in range(PER_TOPIC):
                value = next(variants)[: 1000 * 1024]  # the broker's limit: larger is refused at the door
                key = rng.choice([None, b"k", bytes(rng.randrange(256) for _ in range(8))])
                if topic == topics.HEARTBEATS:
                    key = key or b"fuzz"  # a compacted topic takes keyed records only
                batch.append(await producer.send(topic, value, key=key))
            for future in batch:
                await future
                sent += 1
    finally:
        await producer.stop()
    assert sent == PER_TOPIC * len(samples())

    # then a valid job, behind every poison
    run_id = unique("run-after-fuzz")
    items = arithmetic_items(40, prefix="z")
    job = JobSpec(
        dataset=upload_dataset(stack, write_jsonl(tmp_path / "d.jsonl", items)), model="null", run_id=run_id
    )
    producer = AIOKafkaProducer(**admin_kafka(), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())
    finally:
        await producer.stop()

    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, 300, what=f"the valid job behind the fuzz (seed {SEED}) to complete")
    rows = await result_rows(pg, run_id)
    assert {r["item_id"] for r in rows} == {i["id"] for i in items} and len(rows) == len(items)

    async def drained() -> bool:
        lags = {g: sum((await group_lag(admin_settings(), g, t)).values()) for g, t in GROUPS.items()}
        drained.last = lags  # type: ignore[attr-defined]
        return all(v == 0 for v in lags.values())

    await wait_until(drained, 300, interval=2.0, what="every consumer group's lag back to 0")
