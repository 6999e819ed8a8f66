"""Creating the topics the services need (used by bootstrap, and by a worker for its own
group's work topic). Apart from bootstrap.py so that a worker needs no S3 client for it."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from evalstream.common.kafka_security import client_kwargs
from evalstream.common.settings import KafkaSettings
from evalstream.common.topics import BASE_TOPICS, topic_specs


async def ensure_topics(settings: KafkaSettings, groups: list[str], *, base: bool = True) -> list[str]:
    """Creates the work topics of `groups` and, with `base`, the pipeline's other topics,
    where missing; returns the names created. A worker passes base=False: its principal may
    create work topics only (acls.py), and sees no topic it may not use."""
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
            refused = [
                f"{topic}: {for_code(code).__name__}"
                for topic, code, *_ in response.topic_errors
                if code not in (0, TopicAlreadyExistsError.errno)
            ]
            if refused:
                raise RuntimeError(f"topics not created: {'; '.join(refused)}")
        return [t.name for t in wanted]
    finally:
        await admin.close()
