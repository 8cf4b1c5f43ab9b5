"""Transactions on Apache Kafka: the writer inside them, the worker reading committed records.

A DivWriter whose transaction aborts rolls its DIV state back to the transaction's start, so
the aborted seqs are taken again by the next records and a worker (which reads committed
records only, under either processing guarantee) sees no gap. Records of a committed
transaction that never reach the log are loss, and are MISSING.
"""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from kdiv.writer import DivWriter
from tests.harness.broker import read_incidents, read_table, wait_until_caught_up
from tests.harness.oracle import saved_state
from tests.harness.processes import WorkerProcess

pytestmark = pytest.mark.broker


class Aborted(Exception):
    """Raised inside a transaction to abort it."""


async def transactional_writer(bootstrap: str) -> DivWriter:
    return await DivWriter.start(
        bootstrap, producer_options={"transactional_id": f"kdiv-tests-{uuid.uuid4().hex[:8]}", "acks": "all"}
    )


async def last_offsets(bootstrap: str, topic: str, isolation_level: str) -> tuple[int, int]:
    """(data records, offset after the last record) of partition 0, as a consumer of that
    isolation level reads it. A transaction's commit marker after the last record is never
    delivered, so a consumer commits the offset after the last record, not the log's end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        count = after_last = 0
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            for record in batch.get(tp, []):
                # Control records' keys are 24 bytes (GUID, segment, seq); the test's data keys are short.
                count += len(record.key) < 24
                after_last = record.offset + 1
        return count, after_last
    finally:
        await consumer.stop()


def producer_seq(table: dict[bytes, bytes], topic: str, guid: bytes) -> int:
    _, producers = saved_state(table)
    return producers[(topic, 0, guid)].sequence_number


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_an_aborted_transaction_is_no_missing(bootstrap, topic_factory, tmp_path, guarantee):
    topic = topic_factory(1)
    app_id = f"txn-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "w",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        env={"KDIV_PROCESSING_GUARANTEE": guarantee},
    )
    writer = await transactional_writer(bootstrap)
    try:
        worker.start()
        await worker.wait_ready()
        async with writer.transaction():
            for i in range(10):
                await writer.send(topic, b"committed-%d" % i, key=b"a%d" % i, partition=0)
        with pytest.raises(Aborted):
            async with writer.transaction():
                for i in range(10):
                    await writer.send(topic, b"aborted-%d" % i, key=b"b%d" % i, partition=0)
                await writer.flush()  # on the broker, then aborted
                raise Aborted
        async with writer.transaction():
            for i in range(10):
                await writer.send(topic, b"committed-again-%d" % i, key=b"c%d" % i, partition=0)
        await writer.close()  # its END_OF_SEGMENT, in a transaction of its own

        # The aborted records are in the log; a committed read skips them.
        assert (await last_offsets(bootstrap, topic, "read_uncommitted"))[0] == 30
        committed_data, after_last = await last_offsets(bootstrap, topic, "read_committed")
        assert committed_data == 20
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], ends={0: after_last})
        incidents = await read_incidents(bootstrap, app_id)
        assert incidents == {}, [versions[-1] for versions in incidents.values()]
        # seq 0 START_OF_SEGMENT, 1..20 the committed data, 21 the END_OF_SEGMENT.
        assert producer_seq(await read_table(bootstrap, app_id, 1), topic, writer.guid) == 21
    finally:
        await writer.close()
        worker.terminate()


async def test_records_of_a_committed_transaction_that_never_reach_the_log_are_missing(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1)
    app_id = f"txn-lost-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    writer = await transactional_writer(bootstrap)
    try:
        worker.start()
        await worker.wait_ready()
        async with writer.transaction():
            for i in range(5):
                await writer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=0)
            # Three records stamped (seq 6..8) and lost on the way: the transaction commits without them.
            for i in range(3):
                writer.stamper.data(topic, 0, b"lost-%d" % i, b"lost", writer.clock_ms())
            for i in range(5):
                await writer.send(topic, b"w%d" % i, key=b"m%d" % i, partition=0)
        _, after_last = await last_offsets(bootstrap, topic, "read_committed")
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], ends={0: after_last})
        incidents = [versions[-1] for versions in (await read_incidents(bootstrap, app_id)).values()]
        assert [(i.verdict, i.producer, i.segment, i.seq) for i in incidents] == [
            ("MISSING", writer.guid.hex(), 0, 6)
        ], incidents
        assert "6..8" in incidents[0].detail, incidents[0].detail
    finally:
        await writer.close()
        worker.terminate()
