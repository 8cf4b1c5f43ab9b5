"""Idempotent and transactional aiokafka producers, on the session's real broker.

On Tansu they need `enable_tansu_producer_ids`; elsewhere they work without it. The
workaround is process-wide, so once one test has enabled it, it stays on for the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.protocol.transaction import InitProducerIdRequest

from kdiv.kafka.tansu import enable_tansu_producer_ids

pytestmark = pytest.mark.broker

RECORDS = 20
# Bounds every broker wait, so a regression fails the test instead of hanging it.
TIMEOUT_S = 30.0
TRANSACTION_TIMEOUT_MS = 60_000


@pytest.fixture
def producer_ids(broker_is_tansu: bool) -> None:
    """Producer ids work on the session's broker: on Tansu, through the workaround."""
    if broker_is_tansu:
        enable_tansu_producer_ids()


@contextlib.asynccontextmanager
async def started_producer(bootstrap: str, **config) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await asyncio.wait_for(producer.start(), TIMEOUT_S)
    try:
        yield producer
    finally:
        await producer.stop()


async def read_values(bootstrap: str, topic: str, count: int, **config) -> list[bytes]:
    """The first `count` values of `topic` (one partition), from its beginning."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **config,
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while len(values) < count:
                batches = await consumer.getmany(timeout_ms=200)
                values.extend(record.value for records in batches.values() for record in records)
    finally:
        await consumer.stop()
    return values


def expected_values(label: str) -> list[bytes]:
    return [f"{label}-{i}".encode() for i in range(RECORDS)]


async def test_idempotent_producer_sends(bootstrap, topic_factory, producer_ids):
    topic = topic_factory()
    # A second call must be harmless.
    enable_tansu_producer_ids()

    async with started_producer(bootstrap, enable_idempotence=True) as producer:
        for value in expected_values("idempotent"):
            await asyncio.wait_for(producer.send_and_wait(topic, value, partition=0), TIMEOUT_S)

    assert await read_values(bootstrap, topic, RECORDS) == expected_values("idempotent")


async def test_transactional_producer_commits_for_read_committed_consumers(bootstrap, topic_factory, producer_ids):
    topic = topic_factory()
    transactional_id = f"kdiv-test-{uuid.uuid4().hex[:8]}"

    async with (
        started_producer(
            bootstrap,
            transactional_id=transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        ) as producer,
        producer.transaction(),
    ):
        for value in expected_values("committed"):
            await producer.send(topic, value, partition=0)

    values = await read_values(bootstrap, topic, RECORDS, isolation_level="read_committed")
    assert values == expected_values("committed")


async def test_aiokafkas_own_init_producer_id_fails_only_on_tansu(bootstrap, broker_is_tansu):
    # aiokafka's own request class (v0 is all it knows), sent directly: the workaround
    # changes only what producers send, so this shows the defect it works around.
    client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await client.bootstrap()
    try:
        node_id = client.get_random_node()
        response = await asyncio.wait_for(
            client.send(node_id, InitProducerIdRequest(None, TRANSACTION_TIMEOUT_MS)), TIMEOUT_S
        )
    finally:
        await client.close()

    assert response.API_VERSION == 0
    if broker_is_tansu:
        assert response.error_code == -1  # UnknownServerError
    else:
        assert response.error_code == 0
        assert response.producer_id >= 0
