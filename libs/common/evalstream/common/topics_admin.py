"""Creating the topics the services need (used by bootstrap, and by a worker for its own
group's work topic). Apart from bootstrap.py so that a worker needs no S3 client for it."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from evalstream.common.topics import topic_specs


async def ensure_topics(bootstrap: str, groups: list[str]) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in topic_specs(groups) if t.name not in existing]
        if wanted:
            await admin.create_topics(
                [NewTopic(t.name, t.partitions, 1, topic_configs=t.config) for t in wanted]
            )
        return [t.name for t in wanted]
    finally:
        await admin.close()
