"""Reading eval.dlq: every dead letter becomes a row of `dead_letters`; one that carries
items of a run (a shard, as workers and routers dead-letter them) also becomes their failed
results, so that the run still completes. Poison from any topic is recorded too, but it
belongs to no item."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import msgspec
from faststream.kafka import KafkaBroker

from evalstream.aggregator.store import DeadLetterRecord, Sourced, source_of
from evalstream.common import evidence
from evalstream.common.messages import DeadLetterHeaders as H
from evalstream.common.messages import ItemResult, Shard, decode
from evalstream.common.service import Record, dead_letter, dead_letter_headers

log = logging.getLogger("evalstream.aggregator")
MAX_HEADERS = 64  # kept of a dead letter (ours carry 9; a hostile one may carry thousands)


def read_dead_letters(records: Sequence[Record]) -> tuple[list[DeadLetterRecord], list[Sourced]]:
    """(a row per dead letter, a failed result per item they carry, with its record)."""
    letters: list[DeadLetterRecord] = []
    failures: list[Sourced] = []
    for record in records:
        # PostgreSQL's jsonb and text store no NUL: a header with one keeps U+FFFD instead
        headers = {
            k.replace("\x00", "\ufffd"): (v or b"").decode(errors="replace").replace("\x00", "\ufffd")
            for k, v in record.headers[:MAX_HEADERS]
        }
        shard: Shard | None = None
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            shard = decode(record.value or b"", Shard)
        error = headers.get(H.ERROR, "dead-lettered")
        letters.append(
            DeadLetterRecord(
                run_id=headers.get(H.RUN_ID) or (shard.run_id if shard else None),
                item_id=headers.get(H.ITEM_ID)
                or (shard.items[0].id if shard and len(shard.items) == 1 else None),
                original_topic=headers.get(H.ORIGINAL_TOPIC),
                original_partition=_int(headers.get(H.ORIGINAL_PARTITION)),
                original_offset=_int(headers.get(H.ORIGINAL_OFFSET)),
                dlq_partition=record.partition,
                dlq_offset=record.offset,
                dlq_timestamp=record.timestamp,
                error=error,
                headers=headers,
                payload=record.value or b"",
            )
        )
        if shard is not None:
            source = source_of(record.topic, record.partition, record.offset)
            attempts = _int(headers.get(H.ATTEMPTS)) or shard.attempt
            failures += [Sourced(r, source) for r in failed_results(shard, error, attempts)]
    return letters, failures


def failed_results(shard: Shard, error: str, attempts: int) -> list[ItemResult]:
    served_by = f"{shard.routed_to}/{shard.served_model or shard.model}" if shard.routed_to else ""
    # a regrade's item that could not be graded keeps its recorded answer
    answers = {a.item_id: a.response for a in shard.answers or []}
    return [
        ItemResult(
            run_id=shard.run_id,
            item_id=item.id,
            shard_id=shard.shard_id,
            response=answers.get(item.id),
            extracted=None,
            correct=None,
            score=0.0,
            error=error,
            attempts=attempts,
            served_by=served_by,
            category=item.category,
            question=evidence.question_of(item),
            gold=evidence.gold_of(item),
        )
        for item in shard.items
    ]


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def park_unknown_run(broker: KafkaBroker, record: Record, run_id: str) -> None:
    """Results of a run the database does not know (deleted, restored from an older
    backup, or never created) are kept as a dead letter, not dropped: `evalctl dlq list`
    shows them, and nothing of them is lost if the run reappears."""
    log.warning(
        "results of unknown run %s dead-lettered (%s:%d@%d)",
        run_id,
        record.topic,
        record.partition,
        record.offset,
    )
    headers = dead_letter_headers(record, f"results of unknown run {run_id}", run_id=run_id)
    await dead_letter(broker, record.value or b"", headers, key=record.key, reason="unknown_run")
