"""Poison work messages (issue 12): a shard whose handling keeps failing, or keeps running
past the poll interval, is dead-lettered after WORKER_MAX_DELIVERIES deliveries instead of
coming back forever (common/deliveries.py counts them)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from faststream.kafka import KafkaBroker
from opentelemetry.trace import Span

from evalstream.common import service
from evalstream.common.deliveries import DeliveryCounter
from evalstream.common.messages import DeadLetterHeaders as H
from evalstream.common.metrics import SHARDS

log = logging.getLogger("evalstream.worker")

Handler = Callable[[tuple[service.Record, ...], list[Span]], Awaitable[None]]


class Redeliveries:
    def __init__(self, broker: KafkaBroker, limit: int) -> None:
        self.broker = broker
        self.counter = DeliveryCounter(limit)

    async def admit(self, records: Sequence[service.Record]) -> list[tuple[service.Record, int]]:
        """The records to handle, each with its delivery number; those delivered more than
        the limit are dead-lettered here instead."""
        keep, worn = self.counter.split(records)
        for record, n in worn:
            await self.dead_letter(record, self.counter.why(record, n), n)
        return keep

    async def one_by_one(
        self, records: list[tuple[service.Record, int]], spans: list[Span], handle: Handler
    ) -> None:
        """Each shard of a redelivered batch on its own: the others are not held back by one
        that fails, and one that fails its last allowed delivery is dead-lettered now."""
        failed: Exception | None = None
        for (record, n), span in zip(records, spans, strict=True):
            try:
                await handle((record,), [span])
            except Exception as exc:
                self.counter.failed(record, exc)
                if n >= self.counter.limit:
                    await self.dead_letter(record, self.counter.why(record, n), n)
                else:
                    failed = exc
        if failed is not None:
            raise failed

    async def dead_letter(self, record: service.Record, error: str, n: int) -> None:
        log.error(
            "work message %s[%d]@%d dead-lettered: %s", record.topic, record.partition, record.offset, error
        )
        headers = service.dead_letter_headers(record, error, attempts=n)
        headers[H.ERROR_TYPE] = "DeliveriesExceeded"
        await service.dead_letter(
            self.broker, record.value or b"", headers, key=record.key, reason="deliveries"
        )
        SHARDS.labels(service="worker", outcome="dead_lettered").inc()
