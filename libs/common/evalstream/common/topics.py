"""Every Kafka topic and consumer-group name, in one place, with partition counts.

KAFKA_TOPIC_PREFIX (default empty) prefixes every name, so that a second pipeline can run
beside the first on one broker without taking its messages (the tracing test does).
"""

from __future__ import annotations

from dataclasses import dataclass

from evalstream.common.names import plain_name
from evalstream.common.settings import TopicSettings

_SETTINGS = TopicSettings.from_env()
PREFIX = _SETTINGS.kafka_topic_prefix

JOBS = f"{PREFIX}eval.jobs"
SHARDS = f"{PREFIX}eval.shards"
RESULTS = f"{PREFIX}eval.results"
RETRY = f"{PREFIX}eval.retry"
DLQ = f"{PREFIX}eval.dlq"
HEARTBEATS = f"{PREFIX}eval.heartbeats"
CONTROL = f"{PREFIX}eval.control"  # requests from evalctl the services act on (messages.Redrive)
WORK_PREFIX = f"{PREFIX}eval.work."
WORKER_GROUP_PREFIX = f"{PREFIX}evalstream-worker-"  # + the group's name: its consumer group

PRODUCER_GROUP = f"{PREFIX}evalstream-producer"
ROUTER_GROUP = f"{PREFIX}evalstream-router"
AGGREGATOR_GROUP = f"{PREFIX}evalstream-aggregator"
AGGREGATOR_DLQ_GROUP = f"{PREFIX}evalstream-aggregator-dlq"
AGGREGATOR_CONTROL_GROUP = f"{PREFIX}evalstream-aggregator-control"
RETRY_GROUP = f"{PREFIX}evalstream-retry"


def work_topic(group: str) -> str:
    """The topic a worker group consumes (ValueError for a group that is no plain name:
    names.py, the one check of names that become keys, topics or paths)."""
    return f"{WORK_PREFIX}{plain_name(group, 'worker group')}"


def worker_consumer_group(group: str) -> str:
    return f"{WORKER_GROUP_PREFIX}{plain_name(group, 'worker group')}"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


# Partition counts bound the parallelism of each stage (KAFKA_PARTITIONS_*, settings.py): a
# group's work topic bounds its workers, eval.shards the routers, eval.results the aggregators.
BASE_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(JOBS, _SETTINGS.kafka_partitions_jobs, {}),
    TopicSpec(SHARDS, _SETTINGS.kafka_partitions_shards, {}),
    TopicSpec(RESULTS, _SETTINGS.kafka_partitions_results, {}),
    TopicSpec(RETRY, _SETTINGS.kafka_partitions_retry, {}),
    TopicSpec(DLQ, _SETTINGS.kafka_partitions_dlq, {}),
    # Latest heartbeat per worker is all anyone needs: compacted, keyed by worker id.
    TopicSpec(HEARTBEATS, 1, {"cleanup.policy": "compact", "segment.ms": "60000"}),
    TopicSpec(CONTROL, 1, {}),
)
WORK_PARTITIONS = _SETTINGS.kafka_partitions_work


def topic_specs(groups: list[str]) -> list[TopicSpec]:
    return [*BASE_TOPICS, *(TopicSpec(work_topic(g), WORK_PARTITIONS, {}) for g in groups)]
