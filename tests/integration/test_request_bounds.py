"""Every produce request fits what the broker accepts, however many partitions have data ready:
a broker whose `socket.request.max.bytes` is small refuses a request over it (it closes the
connection), and aiokafka alone puts every ready batch for a node into one request.

On a broker of its own that accepts requests of 80,000 bytes at most, so the bursts stay small:
a plain aiokafka producer with 300 partitions' batches ready at once is refused, kdiv's
producer delivers the same records, and a worker takes a backlog on 300 partitions whose state
writes are several times the limit, to the end, with no incident and no refusal in the broker's log.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kdiv.dev.broker import KafkaCluster
from kdiv.div.wire import HEADER_NAME, Kind
from kdiv.kafka.produce import new_producer
from kdiv.kafka.requests import broker_request_max_bytes
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess
from tests.harness.streams import header

REQUEST_MAX_BYTES = 80_000
PARTITIONS = 300
VALUE = b"v" * 400  # 300 partitions x 400 bytes: each round of batches is 1.5 times the limit


@pytest.fixture(scope="module")
def small_requests_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(
        port=0,
        data_dir=tmp_path_factory.mktemp("small-requests"),
        settings={"socket.request.max.bytes": str(REQUEST_MAX_BYTES)},
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def refusals(cluster: KafkaCluster) -> list[str]:
    """The broker's lines refusing a request over socket.request.max.bytes."""
    text = Path(cluster.node(1).output_file).read_text(errors="replace")
    return [line for line in text.splitlines() if "InvalidReceiveException" in line]


async def settled_refusals(cluster: KafkaCluster) -> int:
    """The refusals in the broker's log once no more appear for a second (the broker writes
    a refusal's line after closing the connection)."""
    count = len(refusals(cluster))
    for _ in range(30):
        await asyncio.sleep(1.0)
        again = len(refusals(cluster))
        if again == count:
            break
        count = again
    return count


async def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


async def send_to_every_partition(producer: AIOKafkaProducer, topic: str, rounds: int) -> list[asyncio.Future]:
    """`rounds` records to each partition, queued before the producer's first request: with
    linger, every partition has a batch ready in the same drain."""
    futures = []
    for n in range(rounds):
        for partition in range(PARTITIONS):
            futures.append(await producer.send(topic, VALUE, key=b"%d-%d" % (partition, n), partition=partition))
    return futures


async def test_the_brokers_request_limit_is_read_from_the_cluster(small_requests_broker):
    admin = AIOKafkaAdminClient(bootstrap_servers=small_requests_broker.bootstrap)
    await admin.start()
    try:
        assert await broker_request_max_bytes(admin) == REQUEST_MAX_BYTES
    finally:
        await admin.close()


async def test_kdivs_producer_fits_its_requests_where_aiokafkas_is_refused(small_requests_broker):
    bootstrap = small_requests_broker.bootstrap
    topic = await create_topic(bootstrap, PARTITIONS)
    before = len(refusals(small_requests_broker))

    # The premise: aiokafka alone sends one request with every partition's batch, refused.
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200, request_timeout_ms=4000)
    await plain.start()
    try:
        futures = await send_to_every_partition(plain, topic, 1)
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await plain.stop()
    assert any(isinstance(r, Exception) for r in results)
    assert len(refusals(small_requests_broker)) > before

    # kdiv's producer: the same bursts, in requests under the limit.
    refused = await settled_refusals(small_requests_broker)
    bounded = new_producer(bootstrap, linger_ms=200, max_request_size=REQUEST_MAX_BYTES - 4096)
    await bounded.start()
    try:
        futures = await send_to_every_partition(bounded, topic, 3)
        metadata = await asyncio.wait_for(asyncio.gather(*futures), timeout=60)
    finally:
        await bounded.stop()
    assert len(metadata) == 3 * PARTITIONS
    assert await settled_refusals(small_requests_broker) == refused


async def test_a_worker_takes_a_backlog_on_300_partitions_in_requests_that_fit(small_requests_broker, tmp_path):
    bootstrap = small_requests_broker.bootstrap
    topic = await create_topic(bootstrap, PARTITIONS)
    # Four one-record producers a partition, written before the worker starts, one request a
    # partition: the worker's first state write covers every partition at once (about 4 x 150
    # bytes each, 2.3 x the limit).
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            batch = producer.create_batch()
            for n in range(4):
                guid = uuid.UUID(int=partition * 16 + n + 1).bytes
                key = b"k%d" % n
                div = header(Kind.DATA, 0, 1, key, b"v", guid=guid)
                batch.append(key=key, value=b"v", timestamp=None, headers=[(HEADER_NAME, div)])
            await (await producer.send_batch(batch, topic, partition=partition))
    finally:
        await producer.stop()
    refused = await settled_refusals(small_requests_broker)

    app_id = f"burst-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "w",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        env={"KDIV_SCHEMA_REGISTRY_URL": "none"},
    )
    worker.start()
    try:
        await worker.wait_ready(timeout=120)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=120)
        assert await settled_refusals(small_requests_broker) == refused
        assert await read_incidents(bootstrap, app_id) == {}
        assert not worker.problems(), worker.problems()
        # A lone worker joins its group once: its 300 stores are opened after the rebalance,
        # not inside it, where the group got no heartbeat and dropped it.
        joined = [line for line in worker.log_text().splitlines() if "Joined group" in line]
        assert len(joined) == 1, joined
    finally:
        worker.terminate()
