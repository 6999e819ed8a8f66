"""Redriving a run's dead letters, on request (messages.Redrive on eval.control, which
`evalctl dlq redrive` publishes): the aggregator owns the dead_letters table, so it is the
one that puts their items back on eval.shards and marks them redriven.

Their recorded failures stay until a success replaces them. Publishing comes before marking:
a request redelivered after a crash republishes the same items, which the sinks drop."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable

import msgspec

from evalstream.aggregator.store import ResultStore
from evalstream.common.messages import Item, Shard, decode

log = logging.getLogger("evalstream.aggregator.redrive")

# many shards at once (consume.Aggregator.publish)
Publish = Callable[[Iterable[Shard] | AsyncIterable[Shard]], Awaitable[None]]


def fresh_shards(letters: list[tuple[int, bytes]]) -> tuple[list[int], list[Shard]]:
    """(ids of the letters that carry items, the shards to publish): each item once, however
    many letters it has (a worker that died before committing dead-letters them again),
    with fresh attempts. Poison (a payload that is no shard) carries no item: left as is."""
    covered: list[int] = []
    seen: set[tuple[str, str]] = set()
    shards: list[Shard] = []
    for letter_id, payload in letters:
        try:
            shard = decode(payload, Shard)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        covered.append(letter_id)
        todo = [i for i in shard.items if (shard.shard_id, i.id) not in seen]
        seen.update((shard.shard_id, i.id) for i in todo)
        if todo:
            shards.append(redriven(shard, todo))
    return covered, shards


def redriven(shard: Shard, items: list[Item]) -> Shard:
    """A dead-lettered shard's items as a new delivery: fresh attempts, due now, not yet
    routed and never parked (a kept parked_at would make the router find it parked past
    its timeout and dead-letter it again at once)."""
    return msgspec.structs.replace(
        shard, items=items, attempt=1, not_before=0.0, parked_at=0.0, routed_to=None, served_model=None
    )


async def redrive_run(store: ResultStore, run_id: str, publish: Publish) -> int:
    """Redrives `run_id`'s pending dead letters; returns the number of items put back."""
    covered, shards = fresh_shards(await store.dead_letters_to_redrive(run_id))
    await publish(shards)
    await store.mark_redriven(covered)
    items = sum(len(s.items) for s in shards)
    log.info("redrove %d item(s) from %d dead letter(s) of %s", items, len(covered), run_id)
    return items
