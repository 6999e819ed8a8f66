"""Where a message goes among its topic's partitions: one run's shards spread over all of them.

A consumer group hands each partition to one member, so a run whose messages all sat in one
partition would be served by one worker of a group however many it has. Shards (on
eval.shards, eval.work.<group> and eval.retry) therefore carry a *shard key*,
`<run id>#<shard index>`, which `partitioner` places round robin: shard i of run r goes to
partition (h(r) + i) mod n, h being Kafka's own murmur2 hash. Consecutive shards of a run
land on consecutive partitions, so a run of s shards covers min(s, n) partitions and every
partition gets ⌊s/n⌋ or ⌈s/n⌉ of them: N workers of a group get equal shares of one run.

Results and dead letters carry their shard's key too, so one run's results spread over the
partitions of eval.results (and so over the aggregators) the same way. Any other key (jobs
and control requests by run id, heartbeats by worker id) is placed as Kafka's default
partitioner places it (murmur2 of the key), and a message without a key goes to a random
available partition, so a Java or console client that publishes with its own partitioner
agrees with us. Every key names its run: the run id itself, or what precedes `#`
(`run_of_key`), which logs and trace spans carry. The partition count is whatever the producer's metadata
says now: a topic whose partitions grew (bootstrap raises them, topics.partition_counts)
is spread over all of them from the next metadata refresh on.

Nothing downstream relies on where a message went: ordering within a run is not a contract
(results are idempotent per item, completion is counted from PostgreSQL).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from aiokafka.partitioner import murmur2

SEPARATOR = "#"  # never in a run id (names.py: [A-Za-z0-9._-])


class _ShardLike(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def shard_index(self) -> int: ...


def shard_key(run_id: str, shard_index: int) -> bytes:
    """The Kafka key of a run's shard `shard_index`."""
    return f"{run_id}{SEPARATOR}{shard_index}".encode()


def shard_key_of(shard: _ShardLike) -> bytes:
    """The Kafka key of a Shard message (eval.shards, eval.work.<group>, eval.retry)."""
    return shard_key(shard.run_id, shard.shard_index)


def run_of_key(key: bytes | None) -> str | None:
    """The run a message's key names: `<run>#<index>` or the run id itself (jobs, control)."""
    if key is None:
        return None
    shard = _parse_shard_key(key)
    return shard[0] if shard is not None else key.decode("utf-8", "replace")


def key_hash(key: bytes) -> int:
    """Kafka's hash of a key (the Java client's and aiokafka's default partitioner's)."""
    return murmur2(key) & 0x7FFFFFFF


def spread_partition(run_id: str, shard_index: int, partitions: int) -> int:
    """The partition (of `partitions`) shard `shard_index` of `run_id` goes to."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, got {partitions}")
    return (key_hash(run_id.encode()) + shard_index) % partitions


def _parse_shard_key(key: bytes) -> tuple[str, int] | None:
    run, sep, index = key.rpartition(SEPARATOR.encode())
    if not sep or not run or not index.isdigit() or len(index) > 9:
        return None
    return run.decode("utf-8", "replace"), int(index)


def partitioner(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """aiokafka's `partitioner` hook (every service's producer, service.make_broker)."""
    if key is None:
        return random.choice(available or all_partitions)
    ordered = sorted(all_partitions)
    shard = _parse_shard_key(key)
    if shard is not None:
        return ordered[spread_partition(shard[0], shard[1], len(ordered))]
    return ordered[key_hash(key) % len(ordered)]
