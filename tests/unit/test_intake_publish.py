"""The producer publishes a large run in bounded windows, never all shards at once."""

from __future__ import annotations

import asyncio

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
