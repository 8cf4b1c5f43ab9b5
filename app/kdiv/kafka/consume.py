"""Reading topics with aiokafka into the validator's ConsumedRecord shape."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.div.record import ConsumedRecord
from kdiv.kafka.tansu import detect_tansu, end_offsets

_STALL_TIMEOUT_S = 30.0


def to_consumed_record(message: ConsumerRecord) -> ConsumedRecord:
    return ConsumedRecord(
        message.topic,
        message.partition,
        message.offset,
        message.timestamp,
        message.key,
        message.value,
        tuple(message.headers),
    )


def standalone_consumer(bootstrap: str, *, security: KafkaSecurity = PLAINTEXT, **options) -> AIOKafkaConsumer:
    """A consumer outside any group, committing nothing: it only reads. Not started."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **security.aiokafka_kwargs(), **options
    )


@asynccontextmanager
async def _standalone_consumer(
    bootstrap: str, *, security: KafkaSecurity = PLAINTEXT, **options
) -> AsyncIterator[AIOKafkaConsumer]:
    """A started `standalone_consumer`, stopped on exit."""
    consumer = standalone_consumer(bootstrap, security=security, **options)
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()  # a failed start leaves its connections open
        raise
    try:
        yield consumer
    finally:
        await consumer.stop()


async def partitions_by_topic(consumer: AIOKafkaConsumer) -> dict[str, set[int]]:
    """Every topic's partition ids, from fresh metadata.

    Not consumer.partitions_for_topic: a consumer's own metadata covers only the topics it
    reads, so a topic it has not read yet is unknown there (Tansu listed every topic
    anyway; Apache Kafka does not).
    """
    cluster = await consumer._client.fetch_all_metadata()  # noqa: SLF001 - kdiv.worker.faustcompat.PRIVATE_NAMES
    return {topic: set(cluster.partitions_for_topic(topic) or ()) for topic in cluster.topics()}


async def topic_partitions(
    consumer: AIOKafkaConsumer, topic: str, only: Iterable[int] | None = None
) -> list[TopicPartition]:
    """The topic's partitions (all, or `only`), or a LookupError naming what does not exist."""
    found = (await partitions_by_topic(consumer)).get(topic)
    if not found:
        raise LookupError(f"topic {topic!r} does not exist")
    wanted = sorted(found) if only is None else sorted(set(only))
    absent = [p for p in wanted if p not in found]
    if absent:
        raise LookupError(f"topic {topic!r} has no partition {', '.join(map(str, absent))} (it has {len(found)})")
    return [TopicPartition(topic, p) for p in wanted]


async def read_snapshot(
    bootstrap: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
    **consumer_options,
) -> AsyncIterator[ConsumedRecord]:
    """Every record of the topic from its start to its end as of the call; per-partition order.

    Ends are exact on every broker (kafka_compat), so nothing written before the call is missed.
    """
    async with _standalone_consumer(bootstrap, security=security, **consumer_options) as consumer:
        tps = await topic_partitions(consumer, topic, partitions)
        ends = await end_offsets(consumer, tps, tansu=await detect_tansu(consumer))
        starts = await consumer.beginning_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > starts[tp]}
        if not remaining:
            return
        consumer.assign(sorted(remaining, key=lambda tp: tp.partition))
        for tp in remaining:
            consumer.seek(tp, starts[tp])
        last_progress = time.monotonic()
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, messages in batches.items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        break
                    yield to_consumed_record(message)
            for tp in list(remaining):
                # Compaction and transaction markers leave offset gaps, so compare positions.
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
            if batches:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > _STALL_TIMEOUT_S:
                stuck = [
                    f"{tp.topic}/{tp.partition} at {await consumer.position(tp)} of {ends[tp]}" for tp in remaining
                ]
                raise TimeoutError(f"no records for {_STALL_TIMEOUT_S:.0f}s while reading {', '.join(stuck)}")


async def follow(
    bootstrap: str,
    topic: str,
    *,
    from_beginning: bool = True,
    security: KafkaSecurity = PLAINTEXT,
    **consumer_options,
) -> AsyncIterator[ConsumedRecord]:
    """Every record of every partition of the topic, live, until cancelled."""
    # The reset aiokafka starts on assignment (a consumer without a group has no committed
    # offset) races the seek below, and the one finishing last wins: they must agree.
    consumer_options.setdefault("auto_offset_reset", "earliest" if from_beginning else "latest")
    async with _standalone_consumer(bootstrap, security=security, **consumer_options) as consumer:
        tps = await topic_partitions(consumer, topic)
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        while True:
            for messages in (await consumer.getmany(timeout_ms=1000)).values():
                for message in messages:
                    yield to_consumed_record(message)
