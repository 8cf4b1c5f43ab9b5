"""Broker workarounds, on the session's real broker (Tansu unless KDIV_BOOTSTRAP or Docker)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.dev.tansu import TansuBroker
from kdiv.kafka.tansu import (
    BROKER_FLAVOR_ENV,
    detect_tansu,
    end_offsets,
    fetch_cluster_id,
)

pytestmark = pytest.mark.broker

# Records per batch, per partition. One send_batch call is one batch on the wire, so
# Tansu's ListOffsets answer (base offset of the last batch + 1) is predictable.
BATCHES_BY_PARTITION = {
    0: [5, 5, 5],  # true end 15, Tansu reports 11
    1: [12],  # true end 12, Tansu reports 1
    2: [],  # empty: 0 everywhere
    3: [1, 1, 1],  # single-record batches: Tansu is right, 3
}
TRUE_ENDS = {partition: sum(sizes) for partition, sizes in BATCHES_BY_PARTITION.items()}


async def produce_batches(bootstrap: str, topic: str, batches_by_partition: dict[int, list[int]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition, sizes in batches_by_partition.items():
            for batch_number, size in enumerate(sizes):
                batch = producer.create_batch()
                for i in range(size):
                    batch.append(key=None, value=f"{partition}-{batch_number}-{i}".encode(), timestamp=None)
                await (await producer.send_batch(batch, topic, partition=partition))
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def started_consumer(bootstrap: str, **config) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **config)
    await consumer.start()
    # aiokafka 0.14: stopping a group-less consumer before its background task first runs
    # raises CancelledError from stop(); one loop turn lets the task start.
    await asyncio.sleep(0)
    try:
        yield consumer
    finally:
        await consumer.stop()


@pytest.fixture
async def batched_topic(bootstrap, topic_factory) -> str:
    topic = topic_factory(partitions=len(BATCHES_BY_PARTITION))
    await produce_batches(bootstrap, topic, BATCHES_BY_PARTITION)
    return topic


@pytest.fixture
def no_flavor_override(monkeypatch):
    monkeypatch.delenv(BROKER_FLAVOR_ENV, raising=False)


async def test_end_offsets_equal_the_record_count_where_list_offsets_falls_short(
    bootstrap, batched_topic, broker_is_tansu
):
    partitions = [TopicPartition(batched_topic, p) for p in BATCHES_BY_PARTITION]
    expected = {TopicPartition(batched_topic, p): end for p, end in TRUE_ENDS.items()}

    async with started_consumer(bootstrap) as consumer:
        reported = await consumer.end_offsets(partitions)
        exact = await end_offsets(consumer, partitions, tansu=broker_is_tansu)
        # The Fetch-based path is exact on any broker, not only on Tansu.
        via_fetch = await end_offsets(consumer, partitions, tansu=True)

    assert exact == expected
    assert via_fetch == expected
    if broker_is_tansu:
        # Environment defect 2: base offset of the last batch + 1.
        assert {tp.partition: end for tp, end in reported.items()} == {0: 11, 1: 1, 2: 0, 3: 3}
    else:
        assert reported == expected


async def test_end_offsets_leave_the_consumers_assignment_and_positions_alone(bootstrap, batched_topic):
    tp0, tp1 = TopicPartition(batched_topic, 0), TopicPartition(batched_topic, 1)
    async with started_consumer(bootstrap) as consumer:
        consumer.assign([tp0])
        consumer.seek(tp0, 2)

        ends = await end_offsets(consumer, [tp0, tp1], tansu=True)

        assert ends == {tp0: TRUE_ENDS[0], tp1: TRUE_ENDS[1]}
        assert consumer.assignment() == {tp0}
        assert await consumer.position(tp0) == 2
        fetched = await consumer.getmany(tp0, timeout_ms=2000)
        assert [record.offset for record in fetched[tp0]][:1] == [2]


async def test_end_offsets_under_read_committed_use_the_last_stable_offset(bootstrap, batched_topic):
    # No transactions here (aiokafka's cannot start on Tansu), so the last stable offset
    # equals the high watermark; the point is that the read_committed path is exact too.
    partitions = [TopicPartition(batched_topic, p) for p in BATCHES_BY_PARTITION]
    async with started_consumer(bootstrap, isolation_level="read_committed") as consumer:
        ends = await end_offsets(consumer, partitions, tansu=True)
    assert {tp.partition: end for tp, end in ends.items()} == TRUE_ENDS


async def test_detect_tansu_recognises_the_embedded_broker_from_any_client(no_flavor_override):
    with TansuBroker(port=0) as broker:
        assert await detect_tansu(broker.bootstrap)
        assert await fetch_cluster_id([broker.bootstrap]) == "tansu_cluster"

        async with started_consumer(broker.bootstrap) as consumer:
            assert await detect_tansu(consumer)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            assert await detect_tansu(producer)
        finally:
            await producer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            assert await detect_tansu(admin)
        finally:
            await admin.close()


async def test_detect_tansu_matches_the_session_brokers_cluster_id(bootstrap, broker_is_tansu, no_flavor_override):
    assert await detect_tansu(bootstrap) == (await fetch_cluster_id(bootstrap) == "tansu_cluster")


async def test_broker_flavor_variable_overrides_detection_without_contacting_the_broker(monkeypatch):
    nothing_listens_here = "127.0.0.1:1"
    monkeypatch.setenv(BROKER_FLAVOR_ENV, "tansu")
    assert await detect_tansu(nothing_listens_here) is True
    monkeypatch.setenv(BROKER_FLAVOR_ENV, "Kafka")
    assert await detect_tansu(nothing_listens_here) is False
    monkeypatch.setenv(BROKER_FLAVOR_ENV, "redpanda")
    with pytest.raises(ValueError, match=rf"{BROKER_FLAVOR_ENV}='redpanda' is not one of kafka, tansu"):
        await detect_tansu(nothing_listens_here)


async def test_detect_tansu_rejects_what_is_not_a_client(no_flavor_override):
    with pytest.raises(TypeError, match="expected a bootstrap address"):
        await detect_tansu(42)
