"""The producer publishes a large run in bounded windows, never all shards at once."""

from __future__ import annotations

import asyncio

from evalstream.common.messages import Item, JobSpec
from evalstream.producer import intake


async def test_publishing_keeps_a_bounded_number_of_sends_in_flight(monkeypatch) -> None:
    in_flight = peak = 0
    sent: list[bytes] = []

    async def publish(payload: bytes, key: str) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        sent.append(payload)
        in_flight -= 1

    monkeypatch.setattr(intake, "PUBLISH_WINDOW", 50)
    shards = [f"shard-{i}".encode() for i in range(1000)]
    await intake.publish_all(shards, "run", publish)
    assert sorted(sent) == sorted(shards) and peak == 50


def test_a_job_without_a_shard_size_gets_shards_sized_by_its_set() -> None:
    assert [intake.auto_shard_size(n) for n in (1, 48, 8_192, 8_193, 15_000, 65_536, 150_000)] == [
        32,
        32,
        32,
        33,
        59,
        256,
        256,
    ]
    items = [Item(id=str(i), question="What is 1 + 1?", answer="2") for i in range(20_000)]
    shards = intake.make_shards("run", JobSpec(dataset="x.jsonl"), items)
    assert len(shards) == 254 and {len(s.items) for s in shards[:-1]} == {79}
    assert sum(len(s.items) for s in shards) == 20_000
    # a size the job names wins
    assert len(intake.make_shards("run", JobSpec(dataset="x.jsonl", shard_size=1000), items)) == 20
