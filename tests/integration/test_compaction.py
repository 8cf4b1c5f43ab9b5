"""Real log compaction under a running worker (Apache Kafka's cleaner, not a simulation).

Compaction removes superseded records of a key once they are `min.compaction.lag.ms` old, so
the producers' sequence gaps it leaves are no fault. It leaves their offsets as holes in the
log; a record lost before it was written leaves none, so such a gap is reported however
late the worker validates it (`kdiv.div.compaction`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from kdiv.kafka.topics import create_topic
from kdiv.writer import DivWriter
from tests.harness.broker import exact_end_offsets, read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess

KEYS = 20
LAG_MS = 8000


async def create_compacted(bootstrap: str, topic: str, partitions: int, lag_ms: int, policy: str = "compact") -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {
            "cleanup.policy": policy,
            "retention.ms": "-1",
            "min.compaction.lag.ms": str(lag_ms),
            # A segment rolls a second after its first record, so the cleaner has closed
            # segments to work on; it never compacts the active one.
            "segment.ms": "1000",
            "min.cleanable.dirty.ratio": "0.01",
        }
        await create_topic(admin, NewTopic(topic, partitions, 1, topic_configs=config))
    finally:
        await admin.close()


def described(incident) -> str:
    return (
        f"{incident.verdict} {incident.producer[:8]} seg {incident.segment} seq {incident.seq} "
        f"@{incident.offset}: {incident.detail}"
    )


async def records_in(bootstrap: str, topic: str, partition: int) -> list[int]:
    """The offsets the partition holds now, from its log start to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        offsets: list[int] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            offsets.extend(record.offset for record in batch.get(tp, []))
        return offsets
    finally:
        await consumer.stop()


async def wait_compacted(bootstrap: str, topic: str, partition: int, written: int, timeout: float = 60) -> list[int]:
    """Wait until the cleaner has removed records from the partition; its offsets then."""
    deadline = time.monotonic() + timeout
    while True:
        offsets = await records_in(bootstrap, topic, partition)
        if len(offsets) < written:
            return offsets
        assert time.monotonic() < deadline, f"{topic} was not compacted in {timeout} s ({len(offsets)} records)"
        await asyncio.sleep(0.5)


async def test_gaps_compaction_explains_are_no_incident_and_a_fresh_gap_is_missing(bootstrap, tmp_path):
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    await create_compacted(bootstrap, topic, 1, LAG_MS)
    app_id = f"compaction-{uuid.uuid4().hex[:8]}"
    writers = [await DivWriter.start(bootstrap, producer_options={"acks": "all"}) for _ in range(3)]
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        # Every key updated over and over, by three producers, across several segments.
        written = 0
        for round_ in range(4):
            for i in range(300):
                writer = writers[i % 3]
                await writer.send(topic, b"v%d-%d" % (round_, i), key=b"key-%d" % (i % KEYS), partition=0)
                written += 1
            for writer in writers:
                await writer.flush()
            await asyncio.sleep(1.1)
        # The next records roll the segment; once the others are LAG_MS old the cleaner compacts them.
        await asyncio.sleep(LAG_MS / 1000)
        for writer in writers:
            await writer.send(topic, b"roll", key=b"key-0", partition=0)
            await writer.flush()
        written += 3 + 3  # and each producer's START_OF_SEGMENT
        held = await wait_compacted(bootstrap, topic, 0, written)
        assert len(held) < written / 2, len(held)

        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker])
        incidents = await read_incidents(bootstrap, app_id)
        assert incidents == {}, [described(versions[-1]) for versions in incidents.values()]

        # Their END_OF_SEGMENTs carry checksums over records the cleaner removed: no CORRUPT.
        for writer in (writers[0], writers[2]):
            await writer.end_segments(topic)

        # A gap with no offset hole in the log: compaction cannot have made it, however long
        # after the lag the worker validates it (the records between are END_OF_SEGMENTs and
        # the latest record of key-0, which the cleaner keeps), so it is loss.
        lossy = writers[1]
        (dropped,) = lossy.stamper.data(topic, 0, b"key-lost", b"never sent", lossy.clock_ms(), ())
        lost_seq = lossy.stamper._segments[(topic, 0)].next_seq - 1
        await lossy.send(topic, b"after the gap", key=b"key-1", partition=0)
        await lossy.flush()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker])
        incidents = await read_incidents(bootstrap, app_id)
        found = [(i[-1].verdict, i[-1].producer, i[-1].seq) for i in incidents.values()]
        ends = await exact_end_offsets(bootstrap, topic)
        assert found == [("MISSING", lossy.guid.hex(), lost_seq)], (found, ends)
    finally:
        for writer in writers:
            await writer.close()
        worker.terminate()


async def test_a_worker_started_long_after_the_lag_still_finds_a_loss_and_excuses_compaction(bootstrap, tmp_path):
    """The worker is held behind on purpose: it starts only once every record is older than
    the lag and the cleaner has run, so by its clock every gap could be compaction's. The
    log's offset holes tell them apart: the cleaner's gaps are excused, while the record a
    producer lost before it was written (its neighbours have keys of their own, which the
    cleaner keeps, so no hole lies between them) is MISSING."""
    topic = f"compacted-late-{uuid.uuid4().hex[:8]}"
    await create_compacted(bootstrap, topic, 1, LAG_MS)
    app_id = f"compaction-late-{uuid.uuid4().hex[:8]}"
    writers = [await DivWriter.start(bootstrap, producer_options={"acks": "all"}) for _ in range(2)]
    lossy = await DivWriter.start(bootstrap, producer_options={"acks": "all"})
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)

    async def overwrite_keys(rounds: int) -> None:
        for round_ in range(rounds):
            for i in range(200):
                await writers[i % 2].send(topic, b"v%d-%d" % (round_, i), key=b"key-%d" % (i % KEYS), partition=0)
            for writer in writers:
                await writer.flush()
            await asyncio.sleep(1.1)

    try:
        await overwrite_keys(2)
        for i in range(3):
            await lossy.send(topic, b"before", key=b"lossy-%d" % i, partition=0)
        await lossy.flush()
        lossy.stamper.data(topic, 0, b"lossy-lost", b"never sent", lossy.clock_ms(), ())
        lost_seq = lossy.stamper._segments[(topic, 0)].next_seq - 1
        await lossy.send(topic, b"after", key=b"lossy-after", partition=0)
        await lossy.flush()
        await overwrite_keys(2)
        # Every record is now older than the lag; the next ones roll the segment, so the
        # cleaner compacts the others.
        await asyncio.sleep(LAG_MS / 1000)
        for writer in writers:
            await writer.send(topic, b"roll", key=b"key-0", partition=0)
            await writer.flush()
        written = (await exact_end_offsets(bootstrap, topic))[0]
        held = await wait_compacted(bootstrap, topic, 0, written)
        assert len(held) < written / 2, (len(held), written)

        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker])
        incidents = await read_incidents(bootstrap, app_id)
        latest = [versions[-1] for versions in incidents.values()]
        assert [(i.verdict, i.producer, i.seq) for i in latest] == [("MISSING", lossy.guid.hex(), lost_seq)], [
            described(i) for i in latest
        ]
        # Judged late (the wall clock alone would have excused it) and told by the log.
        assert "not compaction: the log has 0 offset holes" in latest[0].detail, described(latest[0])
    finally:
        for writer in [*writers, lossy]:
            await writer.close()
        worker.terminate()


async def test_the_nightly_job_over_a_compacted_topic_finds_nothing_false_and_the_keys_delete_records_removed(
    bootstrap, registry_url, spark, tmp_path
):
    """The reconciliation compares the worker's key ledger with what the cleaner left: the
    superseded records it removed are no finding. DeleteRecords (allowed where the policy
    includes delete) then removes keys the worker had validated: no live incident (they were
    validated), and the nightly job finds exactly those keys LOST."""
    from tests.integration.test_reconcile_job import found_in, reconcile_in_process

    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    await create_compacted(bootstrap, topic, 1, lag_ms=1000, policy="compact,delete")
    app_id = f"compaction-rec-{uuid.uuid4().hex[:8]}"
    writer = await DivWriter.start(bootstrap, producer_options={"acks": "all"})
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        once = {}
        for i in range(8):  # keys written once, first
            once[b"once-%d" % i] = (await (await writer.send(topic, b"only", key=b"once-%d" % i, partition=0))).offset
        written = 1 + len(once)
        for round_ in range(3):
            for i in range(200):
                await writer.send(topic, b"v%d-%d" % (round_, i), key=b"key-%d" % (i % KEYS), partition=0)
                written += 1
            await writer.flush()
            await asyncio.sleep(1.1)
        await writer.send_and_wait(topic, b"roll", key=b"key-0", partition=0)
        written += 1
        await wait_compacted(bootstrap, topic, 0, written)

        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker])
        assert await read_incidents(bootstrap, app_id) == {}
        code, report, _ = reconcile_in_process(spark, bootstrap, registry_url, app_id, [topic], tmp_path / "clean")
        summary = json.loads((report / "summary.json").read_text())
        assert (code, summary["status"], sum(summary["counts"].values())) == (0, "clean", 0), summary

        # Everything before the last once-key's record goes, validated long ago.
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            cut = max(once.values()) + 1
            await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=cut)})
        finally:
            await admin.close()
        await writer.send_and_wait(topic, b"after", key=b"key-1", partition=0)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker])
        assert await read_incidents(bootstrap, app_id) == {}

        code, report, _ = reconcile_in_process(spark, bootstrap, registry_url, app_id, [topic], tmp_path / "deleted")
        assert code == 1
        assert found_in(spark, report) == {("LOST", topic, 0, offset, key) for key, offset in once.items()}
    finally:
        await writer.close()
        worker.terminate()
