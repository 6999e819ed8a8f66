"""Consumer lag read from Kafka itself: end offsets minus the group's committed offsets."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from evalstream.common.kafka_security import client_kwargs
from evalstream.common.settings import KafkaSettings


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """A started consumer knows no topic's partitions until it fetched the metadata."""
    cluster = await consumer._client.fetch_all_metadata()
    return [TopicPartition(topic, p) for p in sorted(cluster.partitions_for_topic(topic) or ())]


class LagReader:
    """Reads lag over connections it keeps open: a reader polled every second (the router's)
    does not pay a new admin client and consumer, with their metadata round trips, per read."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.admin = AIOKafkaAdminClient(**client_kwargs(settings))
        self.consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False)

    async def start(self) -> LagReader:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def close(self) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def lag(self, group: str, topic: str) -> dict[int, int]:
        """Lag per partition of `topic` for consumer group `group` (uncommitted = whole log)."""
        tps = await topic_partitions(self.consumer, topic)
        ends = await self.consumer.end_offsets(tps)
        begins = await self.consumer.beginning_offsets(tps)
        committed = await self.admin.list_consumer_group_offsets(group, partitions=tps)
        lag = {}
        for tp in tps:
            meta = committed.get(tp)
            position = meta.offset if meta is not None and meta.offset >= 0 else begins[tp]
            lag[tp.partition] = max(0, ends[tp] - position)
        return lag


async def group_lag(settings: KafkaSettings, group: str, topic: str) -> dict[int, int]:
    """One read, over connections opened for it."""
    reader = await LagReader(settings).start()
    try:
        return await reader.lag(group, topic)
    finally:
        await reader.close()
