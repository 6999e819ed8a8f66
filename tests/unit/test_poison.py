"""PoisonGuard: a record that keeps failing is dead-lettered after the limit, whatever the
exception; failures during an outage count for nothing; a failed batch is handled again
one record at a time, so that only the poison one is dead-lettered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from evalstream.common import service
from evalstream.common.poison import PoisonGuard


@dataclass
class Record:
    value: bytes
    offset: int
    topic: str = "eval.results"
    partition: int = 0
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = 0


class Broker:
    def __init__(self) -> None:
        self.published: list[tuple[bytes, str, dict[str, str]]] = []

    async def publish(
        self, payload: bytes, topic: str, key: bytes | None = None, headers: Any = None
    ) -> None:
        self.published.append((payload, topic, headers or {}))


class Handler:
    """Fails on records whose value is b"poison" (or on everything while `down`)."""

    def __init__(self) -> None:
        self.handled: list[int] = []
        self.down = False

    async def __call__(self, records: Sequence[Any]) -> None:
        if self.down:
            raise ConnectionError("the database is away")
        if any(r.value == b"poison" for r in records):
            raise KeyError("a forged id")
        self.handled += [r.offset for r in records]


async def deliver(guard: PoisonGuard, records: list[Record], handler: Handler) -> bool:
    """One delivery; whether it succeeded (else the records come again)."""
    try:
        await guard.run(records, handler)
        return True
    except Exception:
        return False


async def test_a_poison_record_is_dead_lettered_after_the_limit_and_the_others_go_on() -> None:
    broker, handler = Broker(), Handler()
    up = True

    async def healthy() -> bool:
        return up

    guard = PoisonGuard(broker, "test", limit=3, probes=[healthy])  # type: ignore[arg-type]
    batch = [Record(b"ok", 1), Record(b"poison", 2), Record(b"ok", 3)]
    deliveries = 0
    while not await deliver(guard, batch, handler):
        deliveries += 1
        assert deliveries < 10, "never got past the poison"
    # the batch failed once; redelivered, one record at a time: the others went through and
    # the poison failed again; the third time it failed, it was dead-lettered there and then
    assert deliveries == 2
    assert sorted(set(handler.handled)) == [1, 3]
    [(payload, topic, headers)] = broker.published
    assert payload == b"poison" and topic.endswith("eval.dlq")
    assert "failed 3 times" in headers["x-error"] and "KeyError" in headers["x-error"]
    assert headers["x-original-offset"] == "2"


async def test_failures_during_an_outage_count_for_nothing() -> None:
    broker, handler = Broker(), Handler()
    up = False

    async def healthy() -> bool:
        return up

    guard = PoisonGuard(broker, "test", limit=2, probes=[healthy])  # type: ignore[arg-type]
    handler.down = True
    for _ in range(20):  # the outage lasts: no record is ever blamed
        assert not await deliver(guard, [Record(b"ok", 7)], handler)
    assert broker.published == [] and guard.failures == {}
    up, handler.down = True, False
    assert await deliver(guard, [Record(b"ok", 7)], handler)
    assert handler.handled == [7] and broker.published == []


async def test_a_counted_failure_is_redelivered_at_once_an_outage_after_the_backoff() -> None:
    broker, handler = Broker(), Handler()

    async def healthy() -> bool:
        return True

    guard = PoisonGuard(broker, "test", limit=5, probes=[healthy])  # type: ignore[arg-type]
    with pytest.raises(service.MessageAtFault):
        await guard.run([Record(b"poison", 1)], handler)
    never = PoisonGuard(broker, "test", limit=5, probes=[], never_counted=(KeyError,))  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        await never.run([Record(b"poison", 1)], handler)
    assert never.failures == {}


async def test_a_discarding_guard_never_publishes() -> None:
    broker, handler = Broker(), Handler()
    discarded: list[str] = []

    async def discard(record: Any, why: str) -> None:
        discarded.append(why)

    guard = PoisonGuard(broker, "dlq", limit=1, discard=discard)  # type: ignore[arg-type]
    assert not await deliver(guard, [Record(b"poison", 4)], handler)
    assert await deliver(guard, [Record(b"poison", 4)], handler)
    assert broker.published == [] and len(discarded) == 1
