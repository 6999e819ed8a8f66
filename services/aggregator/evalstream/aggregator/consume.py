"""What the aggregator does with the records of each topic it reads: results and dead letters
become a sink.Window (sink.py); a control request becomes a redrive (redrive.py) or a
regrade (regrade.py). The subscribers (app.py) hand them records through their PoisonGuard.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import asyncpg
from faststream.kafka import KafkaBroker
from minio import Minio

from evalstream.aggregator import redrive, regrade
from evalstream.aggregator.dead_letters import park_unknown_run, read_dead_letters
from evalstream.aggregator.sink import ResultSink, Window
from evalstream.aggregator.store import ResultStore, Sourced, source_of
from evalstream.common import service, topics
from evalstream.common.jsonlimits import has_nul
from evalstream.common.messages import ControlRequest, Redrive, Regrade, Shard, ShardResult, decode, encode
from evalstream.common.names import plain_name_problem
from evalstream.common.publishing import each, publish_all
from evalstream.common.spread import shard_key_of

log = logging.getLogger("evalstream.aggregator")
MAX_CONTROL_BYTES = 64 * 1024  # a request names a run or two and a grader SPEC


@dataclass
class Aggregator:
    broker: KafkaBroker
    pool: asyncpg.Pool
    store: ResultStore
    sink: ResultSink
    s3: Minio

    async def results(self, records: Sequence[service.Record]) -> None:
        delivered: list[tuple[service.Record, ShardResult]] = []
        for record in records:
            if payload := await service.decode_or_dead_letter(self.broker, record, ShardResult):
                delivered.append((record, payload))
        known = await self.store.known_runs(r.run_id for _, p in delivered for r in p.results)
        results: list[Sourced] = []
        for record, payload in delivered:
            if foreign := {r.run_id for r in payload.results} - known:
                await park_unknown_run(self.broker, record, sorted(foreign)[0])  # kept, not dropped
            else:
                source = source_of(record.topic, record.partition, record.offset)
                results.extend(Sourced(r, source) for r in payload.results)
        await self.sink.record(Window(results))

    async def dead_letters(self, records: Sequence[service.Record]) -> None:
        """Every dead letter is recorded; one that carries items of a known run becomes their
        failed results, so the run still completes (dead_letters.py)."""
        letters, failures = read_dead_letters(records)
        known = await self.store.known_runs(f.result.run_id for f in failures)
        await self.sink.record(Window([f for f in failures if f.result.run_id in known], letters))

    async def control(self, records: Sequence[service.Record]) -> None:
        """Requests from evalctl, which writes no table itself: redrive a run's dead letters
        (redrive.py), regrade a run (regrade.py)."""
        for record in records:
            request = await service.decode_or_dead_letter(self.broker, record, ControlRequest, decode_control)  # type: ignore[arg-type]
            if isinstance(request, Redrive):
                await redrive.redrive_run(self.store, request.run_id, self.publish)
            elif isinstance(request, Regrade):
                source = source_of(record.topic, record.partition, record.offset)
                await regrade.regrade_run(self.store, self.s3, self.sink, request, source, self.publish)

    async def publish(self, shards: Iterable[Shard] | AsyncIterable[Shard]) -> None:
        """To eval.shards, many in flight at once (publishing.py), each encoded as it goes."""

        async def send(payload: bytes, key: bytes) -> None:
            await self.broker.publish(payload, topics.SHARDS, key=key)

        async def encoded() -> AsyncIterator[tuple[bytes, bytes]]:
            async for shard in each(shards):
                yield encode(shard), shard_key_of(shard)

        await publish_all(encoded(), send)


def decode_control(raw: bytes) -> ControlRequest:
    """A control request, refused (ValueError: a dead letter with the reason) when it is
    not a valid request, holds a NUL (nothing of it could be stored), or names a run that is
    no plain name (it would become object names: names.py)."""
    kinds = cast("type[ControlRequest]", ControlRequest)  # a union, told apart by `kind`
    request = decode(raw, kinds, max_bytes=MAX_CONTROL_BYTES)
    if has_nul(raw):
        raise ValueError("a field holds a NUL character")
    ids: list[tuple[str, str | None]] = [("run_id", request.run_id)]
    if isinstance(request, Regrade):
        ids += [("new_run_id", request.new_run_id), ("worker_group", request.worker_group)]
    for what, value in ids:
        if value is not None and (problem := plain_name_problem(value, what)):
            raise ValueError(problem)
    return request
