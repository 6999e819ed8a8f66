"""Creating the topics the services need (used by bootstrap, and by a worker for its own
group's work topic), and raising their partition counts when the settings grew. Apart from
bootstrap.py so that a worker needs no S3 client for it."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from evalstream.common.kafka_security import client_kwargs
from evalstream.common.settings import KafkaSettings
from evalstream.common.topics import BASE_TOPICS, TopicSpec, topic_specs


@dataclass(frozen=True)
class TopicChanges:
    created: list[str]
    grown: dict[str, tuple[int, int]]  # topic -> (partitions before, after)


async def partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """The partition count of each of `names` that exists."""
    described = await admin.describe_topics(names)
    return {
        t["topic"]: len(t["partitions"]) for t in described if t.get("error_code", 0) == 0 and t["partitions"]
    }


async def ensure_topics(settings: KafkaSettings, groups: list[str], *, base: bool = True) -> list[str]:
    """Creates the work topics of `groups` and, with `base`, the pipeline's other topics,
    where missing; returns the names created. A worker passes base=False: its principal may
    create work topics only (acls.py), and sees no topic it may not use."""
    return (await ensure_topic_layout(settings, groups, base=base, grow=False)).created


async def ensure_topic_layout(
    settings: KafkaSettings, groups: list[str], *, base: bool = True, grow: bool = True
) -> TopicChanges:
    """ensure_topics, and with `grow` (bootstrap, as the admin) the partitions of existing
    topics raised to their settings (KAFKA_PARTITIONS_*). Kafka never lowers a count: a
    setting below an existing topic's count leaves the topic as it is."""
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        specs = topic_specs(groups) if base else topic_specs(groups)[len(BASE_TOPICS) :]
        wanted = [t for t in specs if t.name not in existing]
        if wanted:
            response = await admin.create_topics(
                [NewTopic(t.name, t.partitions, 1, topic_configs=t.config) for t in wanted]
            )
            # Per-topic errors come back in the response, not as exceptions. Another process
            # creating the same topic at once is fine; a refusal (e.g. no ACL) is not.
            _raise_refused("topics not created", response.topic_errors, ok=(0, TopicAlreadyExistsError.errno))
        grown: dict[str, tuple[int, int]] = {}
        if grow:
            grown = await _grow(admin, [t for t in specs if t.name in existing])
        return TopicChanges([t.name for t in wanted], grown)
    finally:
        await admin.close()


async def _grow(admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> dict[str, tuple[int, int]]:
    counts = await partition_counts(admin, [t.name for t in specs])
    grow = {
        t.name: (counts[t.name], t.partitions)
        for t in specs
        if counts.get(t.name, t.partitions) < t.partitions
    }
    if grow:
        response = await admin.create_partitions(
            {name: NewPartitions(total_count=n) for name, (_, n) in grow.items()}
        )
        _raise_refused("partitions not added", response.topic_errors, ok=(0,))
    return grow


def _raise_refused(what: str, errors: list[tuple[object, ...]], ok: tuple[int, ...]) -> None:
    refused = [f"{topic}: {for_code(code).__name__}" for topic, code, *_ in errors if code not in ok]
    if refused:
        raise RuntimeError(f"{what}: {'; '.join(refused)}")
