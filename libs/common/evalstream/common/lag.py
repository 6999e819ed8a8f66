"""Consumer lag read from Kafka itself: end offsets minus the group's committed offsets."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """A started consumer knows no topic's partitions until it fetched the metadata."""
    cluster = await consumer._client.fetch_all_metadata()
    return [TopicPartition(topic, p) for p in sorted(cluster.partitions_for_topic(topic) or ())]


async def group_lag(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Lag per partition of `topic` for consumer group `group` (uncommitted = whole log)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        tps = await topic_partitions(consumer, topic)
        ends = await consumer.end_offsets(tps)
        begins = await consumer.beginning_offsets(tps)
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        lag = {}
        for tp in tps:
            meta = committed.get(tp)
            position = meta.offset if meta is not None and meta.offset >= 0 else begins[tp]
            lag[tp.partition] = max(0, ends[tp] - position)
        return lag
    finally:
        await consumer.stop()
        await admin.close()
