"""A message that keeps failing its handler costs one dead letter, never its partition.

Handlers run with NACK_ON_ERROR: a failure seeks back and the message comes again. A message
that fails for a reason of its own (it breaks a database constraint, names an object the
store refuses, trips a bug) would come back for ever and hold every message behind it. The
guard counts failures per record (topic, partition, offset) and, once a record has failed
CONSUMER_MAX_FAILURES times, dead-letters it (eval.dlq, the error in its headers) instead of
handling it again; whatever the exception.

Only failures that are the message's count. When a handler fails, the service's probes ask
its dependencies (the database answers, the bucket exists, the broker answers): if one of
them is down, the failure is an outage, not the message's fault, and nothing is counted; the
message waits for the outage to end, like every other. A batch that failed is handled again
one record at a time, so that the poison is told apart from the records beside it.

Counts live in the process (bounded, oldest forgotten first): a record that a crash or a
rebalance moved to another process starts again from zero there, which costs at most
another few deliveries.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faststream.kafka import KafkaBroker

from evalstream.common import service
from evalstream.common.messages import DeadLetterHeaders as H
from evalstream.common.metrics import SHARDS

log = logging.getLogger("evalstream.poison")

CAPACITY = 10_000  # records whose failures are remembered
Probe = Callable[[], Awaitable[bool]]
Process = Callable[[Sequence[service.Record]], Awaitable[None]]
Discard = Callable[[service.Record, str], Awaitable[None]]


def _key(record: service.Record) -> tuple[str, int, int]:
    return (record.topic, record.partition, record.offset)


class PoisonGuard:
    def __init__(
        self,
        broker: KafkaBroker,
        name: str,
        *,
        limit: int,
        probes: Sequence[Probe] = (),
        never_counted: tuple[type[BaseException], ...] = (),
        discard: Discard | None = None,
    ) -> None:
        """`never_counted`: exceptions that are never a message's fault (a shutdown);
        `discard`: what to do with a poison record instead of dead-lettering it (the dead
        letters' own consumer must not put a letter back on its own topic)."""
        if limit < 1:
            raise ValueError(f"CONSUMER_MAX_FAILURES must be ≥ 1, got {limit}")
        self.broker = broker
        self.name = name
        self.limit = limit
        self.probes = list(probes)
        self.never_counted = never_counted
        self.discard = discard
        self.failures: OrderedDict[tuple[str, int, int], tuple[int, str]] = OrderedDict()

    async def run(self, records: Sequence[service.Record], process: Process) -> None:
        """Handles `records` with `process`, dead-lettering the worn-out ones first; raises
        (the records come again) when a record failed without being worn out."""
        fresh = []
        for record in records:
            count, error = self.failures.get(_key(record), (0, ""))
            if count >= self.limit:
                await self._poison(record, count, error)
            else:
                fresh.append(record)
        if not fresh:
            return
        if len(fresh) == 1 or not any(_key(r) in self.failures for r in fresh):
            try:
                await process(fresh)
            except Exception as exc:
                if await self._blame(fresh, exc):
                    raise service.MessageAtFault(f"{type(exc).__name__}: {exc}") from exc
                raise
            self._forget(fresh)
            return
        # Redelivered after a failure: one at a time, to find which record it was.
        failed: Exception | None = None  # an outage: redelivered after the backoff
        counted: Exception | None = None  # a record's own failure, not yet worn out
        for record in fresh:
            try:
                await process([record])
            except Exception as exc:
                if not await self._blame([record], exc):
                    failed = exc
                elif self.failures[_key(record)][0] >= self.limit:
                    count, error = self.failures[_key(record)]
                    await self._poison(record, count, error)
                else:
                    counted = exc
            else:
                self._forget([record])
        if failed is not None:
            raise failed
        if counted is not None:
            raise service.MessageAtFault(f"{type(counted).__name__}: {counted}") from counted

    async def _blame(self, records: Sequence[service.Record], exc: Exception) -> bool:
        """Counts a failure against `records`, unless it is an outage; whether it counted."""
        if isinstance(exc, self.never_counted):
            return False
        for probe in self.probes:
            try:
                healthy = await probe()
            except Exception:
                healthy = False
            if not healthy:
                log.warning("%s: %s failed during an outage (%s): not counted", self.name, len(records), exc)
                return False
        error = f"{type(exc).__name__}: {exc}"[:1000]
        for record in records:
            count = self.failures.pop(_key(record), (0, ""))[0] + 1
            self.failures[_key(record)] = (count, error)
        while len(self.failures) > CAPACITY:
            self.failures.popitem(last=False)
        return True

    def _forget(self, records: Sequence[service.Record]) -> None:
        for record in records:
            self.failures.pop(_key(record), None)

    async def _poison(self, record: service.Record, count: int, error: str) -> None:
        why = f"failed {count} times in {self.name}; last error: {error}"
        log.error("%s[%d]@%d: %s", record.topic, record.partition, record.offset, why)
        self.failures.pop(_key(record), None)
        if self.discard is not None:
            await self.discard(record, why)
        else:
            headers = service.dead_letter_headers(record, why, attempts=count)
            headers[H.ERROR_TYPE] = "FailuresExceeded"
            await service.dead_letter(
                self.broker, record.value or b"", headers, key=record.key, reason="failures"
            )
        SHARDS.labels(service=self.name, outcome="poison").inc()


def database_probe(pool: Callable[[], Any]) -> Probe:
    """The database answers (through the pool `pool()` returns)."""

    async def database() -> bool:
        return bool(await pool().fetchval("SELECT 1"))

    return database


def bucket_probe(s3: Callable[[], Any], bucket: str) -> Probe:
    """The object store answers and has `bucket`."""
    import asyncio

    async def store() -> bool:
        return bool(await asyncio.to_thread(s3().bucket_exists, bucket))

    return store


def broker_probe(broker: KafkaBroker) -> Probe:
    async def kafka() -> bool:
        return bool(await broker.ping(5.0))

    return kafka
