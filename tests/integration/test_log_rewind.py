"""A topic deleted and created again under a worker: one LOG_REWOUND, then the new log validated
from its first offset, with no false MISSING for records that are in it."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kdiv.writer import DivWriter
from tests.harness.broker import exact_end_offsets, read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess


async def recreate(bootstrap: str, topic: str) -> None:
    """Delete `topic` and create it again with one partition: its offsets start over."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await admin.start()
    try:
        await admin.delete_topics([topic])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while topic in await admin.list_topics():
            assert loop.time() < deadline, f"{topic} was not deleted"
            await asyncio.sleep(0.2)
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        while True:
            (description,) = await admin.describe_topics([topic])
            if description["error_code"] == 0 and description["partitions"]:
                return
            assert loop.time() < deadline, f"{topic} was not created again: {description}"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def send(bootstrap: str, writer: DivWriter, topic: str, records: int) -> None:
    """`records` data records from `writer` (its producer GUID, segment and seq go on)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        writer.producer = producer
        for i in range(records):
            await writer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def test_a_topic_recreated_while_the_worker_was_down_is_one_rewind(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(1)
    app_id = f"rewind-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    writer = DivWriter(AIOKafkaProducer(bootstrap_servers=bootstrap))  # its producer is set per send
    try:
        worker.start()
        await worker.wait_ready()
        await send(bootstrap, writer, topic, 200)  # START_OF_SEGMENT, seq 1..200: offsets 0..200
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        worker.terminate()

        await recreate(bootstrap, topic)
        # The producer goes on: seq 201..500 at offsets 0..299 of the new log, past the
        # group's committed offset (201) of the old one.
        await send(bootstrap, writer, topic, 300)
        assert await exact_end_offsets(bootstrap, topic) == {0: 300}

        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        incidents = [versions[-1] for versions in (await read_incidents(bootstrap, app_id)).values()]
        assert [(i.verdict, i.offset) for i in incidents] == [("LOG_REWOUND", 0)], incidents
        assert "offsets 0..200" in incidents[0].detail and "topic id" in incidents[0].detail
    finally:
        worker.terminate()


async def test_a_topic_recreated_under_a_running_worker_is_one_rewind(bootstrap, topic_factory, tmp_path):
    """No rebalance tells the worker: its check before each commit does, and what it
    validated of the new log as if the old one went on is dropped and read again."""
    topic = topic_factory(1)
    app_id = f"rewind-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    writer = DivWriter(AIOKafkaProducer(bootstrap_servers=bootstrap))
    try:
        worker.start()
        await worker.wait_ready()
        await send(bootstrap, writer, topic, 200)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)

        await recreate(bootstrap, topic)
        await send(bootstrap, writer, topic, 300)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        assert worker.alive, worker.log_tail()
        incidents = [versions[-1] for versions in (await read_incidents(bootstrap, app_id)).values()]
        assert [(i.verdict, i.offset) for i in incidents] == [("LOG_REWOUND", 0)], incidents

        # And after a restart it goes on from what it saved: nothing again, nothing new.
        worker.terminate()
        await send(bootstrap, writer, topic, 10)
        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        again = [versions[-1] for versions in (await read_incidents(bootstrap, app_id)).values()]
        assert [(i.verdict, i.offset) for i in again] == [("LOG_REWOUND", 0)], again
    finally:
        worker.terminate()
