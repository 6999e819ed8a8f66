"""Cutting a run into shards, and their messages built from the items' stored JSON.

The producer never holds a run's items: the validating pass (datasets.scan_dataset) writes
each item's JSON to the stored copy and records its size; the shards' bounds follow from the
sizes alone (`plan_chunks`), and each shard's message is built from the copy's lines, spliced
in as they are (`ShardMessages`), so memory stays flat from 15,000 to 150,000 items.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import msgspec

from evalstream.common import keys, spread
from evalstream.common.messages import MESSAGE_BUDGET_BYTES, Item, JobSpec, Shard, encode

# A job that names no shard size: shards of AUTO_SHARD_MIN items, or bigger for a large set
# so that it is cut into about AUTO_SHARDS_PER_RUN, up to AUTO_SHARD_MAX (auto_shard_size).
AUTO_SHARD_MIN, AUTO_SHARD_MAX, AUTO_SHARDS_PER_RUN = 32, 256, 256


def auto_shard_size(items: int) -> int:
    """Small sets keep small shards (spread over many workers; progress that moves); a large
    set gets bigger ones, because moving a shard (routing it, committing it) costs the same
    whatever its size: 150,000 items go in shards of 256."""
    return min(AUTO_SHARD_MAX, max(AUTO_SHARD_MIN, -(-items // AUTO_SHARDS_PER_RUN)))


def max_chunk_bytes(job: JobSpec) -> int:
    """The items' share of a shard message: the job's fields travel in every shard."""
    return MESSAGE_BUDGET_BYTES - (len(encode(job)) + 1024)


def plan_chunks(sizes: Sequence[int], max_items: int, max_bytes: int) -> list[int]:
    """Consecutive chunks of at most `max_items` items and about `max_bytes` of JSON each
    (a shard of long items must still fit in one Kafka message): the item count of each."""
    chunks: list[int] = []
    count = size = 0
    for n in sizes:
        if count and (count >= max_items or size + n > max_bytes):
            chunks.append(count)
            count = size = 0
        count += 1
        size += n
    if count:
        chunks.append(count)
    return chunks


def shard_template(run_id: str, job: JobSpec, index: int, count: int) -> Shard:
    """Shard `index` of `count` of the run, without its items."""
    return Shard(
        run_id=run_id,
        shard_id=keys.shard_id(run_id, index),
        shard_index=index,
        shard_count=count,
        model=job.model,
        grader=job.grader,
        generation=job.generation,
        items=[],
        prompt_template=job.prompt_template,
        system_prompt=job.system_prompt,
        retry=job.retry,
        worker_group=job.worker_group,
        sla_fallback=job.sla_fallback,
        bypass_cache=job.bypass_cache,
        raw_prompt=job.raw_prompt,
    )


def make_shards(run_id: str, job: JobSpec, items: list[Item]) -> list[Shard]:
    """The run's shards with their items (for callers that have them all: tests, tools)."""
    size = job.shard_size if job.shard_size is not None else auto_shard_size(len(items))
    chunks = plan_chunks([len(encode(i)) for i in items], size, max_chunk_bytes(job))
    shards, start = [], 0
    for index, n in enumerate(chunks):
        template = shard_template(run_id, job, index, len(chunks))
        shards.append(msgspec.structs.replace(template, items=items[start : start + n]))
        start += n
    return shards


def _frame_type() -> type[msgspec.Struct]:
    """Shard's fields, in its order and with its defaults, but the items as raw JSON: a
    shard encoded through it is byte for byte the same message (tests/unit/test_sharding.py)."""
    fields: list[Any] = []
    for f in msgspec.structs.fields(Shard):
        kind = list[msgspec.Raw] if f.name == "items" else f.type
        if f.required:
            fields.append((f.name, kind))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, kind, f.default))
    return msgspec.defstruct("ShardFrame", fields, kw_only=True, frozen=True)


_ShardFrame = _frame_type()
_encoder = msgspec.json.Encoder()


class ShardMessages:
    """The run's shard messages, (payload, key), read from the stored copy: one JSON item per
    line, in the order the chunks were planned."""

    def __init__(self, run_id: str, job: JobSpec, chunks: Sequence[int], copy: BinaryIO) -> None:
        self.run_id = run_id
        self.job = job
        self.chunks = chunks
        self.copy = copy

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        self.copy.seek(0)
        lines = iter(self.copy)
        for index, n in enumerate(self.chunks):
            template = shard_template(self.run_id, self.job, index, len(self.chunks))
            items = [msgspec.Raw(next(lines).rstrip(b"\n")) for _ in range(n)]
            values = {f: getattr(template, f) for f in template.__struct_fields__}
            frame = _ShardFrame(**{**values, "items": items})
            yield _encoder.encode(frame), spread.shard_key(self.run_id, index)
