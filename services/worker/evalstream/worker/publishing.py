"""What a round of shards leaves on the broker: results (split to fit a message), retries
of transient failures (eval.retry, with the shard's retry delay) and dead letters of the
rest (eval.dlq) — all acknowledged before the round's offsets are committed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping

import msgspec
from faststream.kafka import KafkaBroker
from opentelemetry.trace import Span

from evalstream.common import service, telemetry, topics
from evalstream.common.messages import MESSAGE_BUDGET_BYTES, Shard, ShardResult, encode
from evalstream.common.metrics import ITEMS, SHARDS
from evalstream.common.spread import shard_key_of
from evalstream.worker.runner import Failure, Outcome


def result_messages(payload: ShardResult) -> list[bytes]:
    """The shard's results as one message, or several when they would not fit in one."""
    data = encode(payload)
    if len(data) <= MESSAGE_BUDGET_BYTES:
        return [data]
    if len(payload.results) == 1:  # one huge answer: keep its head, say so
        r = payload.results[0]
        cut = msgspec.structs.replace(
            r,
            response=(r.response or "")[: MESSAGE_BUDGET_BYTES // 8] + "\n[truncated to fit a message]",
            extracted=(r.extracted or "")[:1000] or None,
            prompt=(r.prompt or "")[:1000] or None,
            evidence=(r.evidence or "")[:1000] or None,
        )
        return [encode(msgspec.structs.replace(payload, results=[cut]))]
    half = len(payload.results) // 2
    return [
        *result_messages(msgspec.structs.replace(payload, results=payload.results[:half])),
        *result_messages(msgspec.structs.replace(payload, results=payload.results[half:])),
    ]


def should_retry(f: Failure) -> bool:
    """The retry policy: a transient failure is tried again until its shard's attempts run
    out; a permanent one, or the last attempt, becomes a dead letter."""
    return f.transient and f.shard.attempt < f.shard.retry.max_attempts


class OutcomePublisher:
    def __init__(self, broker: KafkaBroker, *, worker_id: str, group: str) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.group = group

    async def publish(
        self, shards: list[Shard], outcome: Outcome, spans: Mapping[str, Span] | None = None
    ) -> None:
        """Results, retries and dead letters, all acknowledged by the broker before this
        returns. Each is published inside its shard's span, so that it carries the shard's
        trace on."""
        span = (spans or {}).get
        sends: list[Awaitable[object]] = []
        for shard in shards:
            results = outcome.results.get(shard.shard_id, [])
            if results or not any(f.shard.shard_id == shard.shard_id for f in outcome.failures):
                payload = ShardResult(
                    run_id=shard.run_id,
                    shard_id=shard.shard_id,
                    worker_id=self.worker_id,
                    group=self.group,
                    results=results,
                )
                sends += [
                    telemetry.in_span(
                        span(shard.shard_id),
                        self.broker.publish(data, topics.RESULTS, key=shard_key_of(shard)),
                    )
                    for data in result_messages(payload)
                ]
            ITEMS.labels(service="worker", status="succeeded").inc(len(results))
            ITEMS.labels(service="worker", status="cache_hit").inc(sum(r.cache_hit for r in results))
            SHARDS.labels(service="worker", outcome="done").inc()
        retry: dict[str, list[Failure]] = {}
        for f in outcome.failures:
            if should_retry(f):
                retry.setdefault(f.shard.shard_id, []).append(f)
            else:
                sends.append(telemetry.in_span(span(f.shard.shard_id), self.dead_letter(f)))
        for failures in retry.values():
            sends.append(telemetry.in_span(span(failures[0].shard.shard_id), self.retry(failures)))
        await asyncio.gather(*sends)

    async def retry(self, failures: list[Failure]) -> None:
        """The failed items of one shard, as a new attempt due after the shard's delay."""
        shard = failures[0].shard
        again = msgspec.structs.replace(
            shard,
            items=[f.item for f in failures],
            attempt=shard.attempt + 1,
            not_before=time.time() + shard.retry.delay_after(shard.attempt),
        )
        await self.broker.publish(encode(again), topics.RETRY, key=shard_key_of(shard))
        ITEMS.labels(service="worker", status="retried").inc(len(failures))

    async def dead_letter(self, f: Failure) -> None:
        one = msgspec.structs.replace(f.shard, items=[f.item])
        headers = service.dead_letter_headers(
            None,
            f.error,
            attempts=f.shard.attempt,
            run_id=f.shard.run_id,
            item_id=f.item.id,
            original_topic=topics.work_topic(self.group),
        )
        await service.dead_letter(
            self.broker, encode(one), headers, key=shard_key_of(f.shard), reason="failed"
        )
        ITEMS.labels(service="worker", status="dead_lettered").inc()
