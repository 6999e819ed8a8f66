"""The producer's shards: bounded publishing, sizes, messages built from the stored copy
byte for byte as Shard encodes them, and one run spread over every partition."""

from __future__ import annotations

import asyncio
import io
from collections import Counter

import pytest

from evalstream.common import publishing, spread
from evalstream.common.messages import Item, JobSpec, Shard, decode, encode
from evalstream.producer import sharding


async def test_publishing_keeps_a_bounded_number_of_sends_in_flight() -> None:
    in_flight = peak = 0
    sent: list[bytes] = []

    async def publish(payload: bytes, key: bytes) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        sent.append(payload)
        in_flight -= 1

    shards = [(f"shard-{i}".encode(), b"k") for i in range(1000)]
    await publishing.publish_all(shards, publish, window=50)
    assert sorted(sent) == sorted(p for p, _ in shards) and peak == 50
    # and by bytes: 10 messages of 1 MiB in windows of at most 4
    peak = 0
    await publishing.publish_all(((b"x" * 2**20, b"k") for _ in range(10)), publish, window_bytes=4 * 2**20)
    assert peak == 4


async def test_a_failed_send_fails_the_publishing_and_stops_the_sends_in_flight() -> None:
    started: list[int] = []
    finished: list[int] = []

    async def publish(payload: bytes, key: bytes) -> None:
        n = int(payload)
        started.append(n)
        if n == 3:
            raise RuntimeError("broker refused shard 3")
        await asyncio.sleep(0.01 * (n % 5))
        finished.append(n)

    with pytest.raises(RuntimeError, match="shard 3"):
        await publishing.publish_all(((str(i).encode(), b"k") for i in range(1000)), publish)
    assert 3 in started and len(started) < 1000  # the generator was not drained
    await asyncio.sleep(0.1)
    assert 3 not in finished and len(finished) < len(started)  # the sends in flight were cancelled


def test_a_job_without_a_shard_size_gets_shards_sized_by_its_set() -> None:
    assert [sharding.auto_shard_size(n) for n in (1, 48, 8_192, 8_193, 15_000, 65_536, 150_000)] == [
        32,
        32,
        32,
        33,
        59,
        256,
        256,
    ]
    items = [Item(id=str(i), question="What is 1 + 1?", answer="2") for i in range(20_000)]
    shards = sharding.make_shards("run", JobSpec(dataset="x.jsonl"), items)
    assert len(shards) == 254 and {len(s.items) for s in shards[:-1]} == {79}
    assert sum(len(s.items) for s in shards) == 20_000
    # a size the job names wins
    assert len(sharding.make_shards("run", JobSpec(dataset="x.jsonl", shard_size=1000), items)) == 20


def test_shard_messages_from_the_stored_copy_are_the_shards_byte_for_byte() -> None:
    items = [
        Item(id=f"q{i}", question=f'What is {i} + 1? \u00e9\n"quoted"', answer=str(i + 1), meta={"k": [i]})
        for i in range(250)
    ]
    job = JobSpec(dataset="x.jsonl", shard_size=40, system_prompt="be brief", name="n")
    copy = io.BytesIO(b"".join(encode(i) + b"\n" for i in items))
    chunks = sharding.plan_chunks([len(encode(i)) for i in items], 40, sharding.max_chunk_bytes(job))
    messages = list(sharding.ShardMessages("run-x", job, chunks, copy))
    expected = sharding.make_shards("run-x", job, items)
    assert [payload for payload, _ in messages] == [encode(s) for s in expected]
    assert decode(messages[3][0], Shard) == expected[3]
    assert [key for _, key in messages] == [spread.shard_key("run-x", s.shard_index) for s in expected]


@pytest.mark.parametrize(
    ("shards", "partitions"), [(1, 6), (4, 6), (6, 6), (7, 6), (254, 6), (40, 12), (5, 1)]
)
def test_one_runs_shards_cover_min_partitions_shards_evenly(shards: int, partitions: int) -> None:
    for run_id in ("run-a", "run-20261202-0001", "x"):
        placed = Counter(
            spread.partitioner(spread.shard_key(run_id, i), list(range(partitions)), list(range(partitions)))
            for i in range(shards)
        )
        assert len(placed) == min(partitions, shards)
        assert max(placed.values()) - min(placed.values()) <= 1  # ⌊s/n⌋ or ⌈s/n⌉ each


def test_other_keys_go_where_kafkas_default_partitioner_puts_them() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    default = DefaultPartitioner()
    parts = list(range(6))
    for key in (b"run-a-s00001", b"worker-1", b"a#b", b"#3", b"run#99999999999"):
        assert spread.partitioner(key, parts, parts) == default(key, parts, parts)
