"""Faults planted after the fact under records Apache Kafka's console producer wrote with
kdiv's interceptor (docs/java-producers.md): records deleted before validation, and the
nightly job over such topics (an acks=1 loss on three nodes: test_java_interceptor_failover.py).
Each expected count is computed by the test from the logs themselves, never from kdiv's answer."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from dataclasses import replace

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kdiv.div.wire import HEADER_NAME, decode
from kdiv.incident.shape import Incident
from kdiv.kafka.consume import read_snapshot
from kdiv.worker.incidents import DELETED_BEFORE_VALIDATION
from tests.harness.broker import exact_end_offsets, read_incidents, read_table, wait_until_caught_up
from tests.harness.kafka_tools import ConsoleProducerProcess
from tests.harness.processes import WorkerProcess
from tests.integration.test_java_interceptor import console_produce
from tests.integration.test_reconcile_job import found_in, rewrite
from tests.integration.test_reconcile_unread import reconcile
from tests.integration.test_retention import delete_records

pytestmark = pytest.mark.broker

NOTE = "deleted before validation"


async def end_offset(bootstrap: str, topic: str) -> int:
    return (await exact_end_offsets(bootstrap, topic))[0]


async def wait_for_end(bootstrap: str, topic: str, end: int, timeout: float = 60.0) -> None:
    """Wait until partition 0 holds `end` records (the console producer sends as it reads)."""
    deadline = time.monotonic() + timeout
    now = -1
    while now < end:
        try:
            now = await end_offset(bootstrap, topic)
        except LookupError:
            pass  # a node of a cluster that has not yet applied the new topic's metadata answered
        if now >= end:
            break
        assert time.monotonic() < deadline, f"{topic}[0] ends at {now}, not {end}, after {timeout:.0f} s"
        await asyncio.sleep(0.2)
    assert now == end, f"{topic}[0] ends at {now}, past {end}"


async def seqs_by_producer(bootstrap: str, topic: str, partition: int = 0) -> dict[bytes, list[int]]:
    """Each producer's seqs in the partition, in offset order."""
    seqs: dict[bytes, list[int]] = defaultdict(list)
    async for record in read_snapshot(bootstrap, topic, [partition]):
        header = decode(dict(record.headers)[HEADER_NAME])
        seqs[header.guid].append(header.seq)
    return seqs


def latest(incidents: dict[bytes, list[Incident]]) -> list[Incident]:
    return sorted((versions[-1] for versions in incidents.values()), key=lambda i: (i.partition, i.offset))


async def test_records_deleted_before_validation_are_the_deletion_and_each_producers_missing_seqs(
    bootstrap, topic_factory, tmp_path
):
    """Two console producers kept running (two GUIDs) write; the worker validates that and is
    stopped; both write more, which DeleteRecords removes unread; both write again. The
    worker started again reports the deleted range and, per producer, exactly the seqs it
    lost there, as read from the log before the deletion."""
    topic = topic_factory(1)
    app_id = f"java-del-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    with ConsoleProducerProcess(bootstrap, topic) as a, ConsoleProducerProcess(bootstrap, topic) as b:
        try:
            a.send([f"a-before-{i}" for i in range(10)])
            await wait_for_end(bootstrap, topic, 10)
            b.send([f"b-before-{i}" for i in range(6)])
            await wait_for_end(bootstrap, topic, 16)
            worker.start()
            await worker.wait_ready()
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
            worker.terminate()
            first = await end_offset(bootstrap, topic)

            a.send([f"a-deleted-{i}" for i in range(8)])
            await wait_for_end(bootstrap, topic, first + 8)
            b.send([f"b-deleted-{i}" for i in range(3)])
            await wait_for_end(bootstrap, topic, first + 11)
            start = await end_offset(bootstrap, topic)
            # What the deletion takes, per producer, from the log itself.
            deleted: dict[bytes, list[int]] = defaultdict(list)
            async for record in read_snapshot(bootstrap, topic, [0]):
                if record.offset >= first:
                    header = decode(dict(record.headers)[HEADER_NAME])
                    deleted[header.guid].append(header.seq)
            await delete_records(bootstrap, topic, start)
            a.send([f"a-after-{i}" for i in range(5)])
            await wait_for_end(bootstrap, topic, start + 5)
            b.send([f"b-after-{i}" for i in range(2)])
            a.close()
            b.close()
            assert await end_offset(bootstrap, topic) == start + 7

            worker.start()
            await worker.wait_ready()
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
            incidents = latest(await read_incidents(bootstrap, app_id))
        finally:
            worker.terminate()

    assert sorted(len(seqs) for seqs in deleted.values()) == [3, 8], deleted
    (deletion,) = [i for i in incidents if i.verdict == DELETED_BEFORE_VALIDATION]
    assert (deletion.offset, deletion.producer) == (first, None), deletion
    assert f"offsets {first}..{start - 1} ({start - first} offsets) were deleted" in deletion.detail, deletion
    missing = {i.producer: i for i in incidents if i.verdict == "MISSING"}
    assert len(incidents) == 1 + len(missing), incidents
    assert {bytes.fromhex(guid): (i.segment, i.detail.split(" of segment")[0]) for guid, i in missing.items()} == {
        guid: (0, f"seq {seqs[0]}..{seqs[-1]}") for guid, seqs in deleted.items()
    }, missing
    for guid, seqs in deleted.items():
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), (guid, seqs)
        incident = missing[guid.hex()]
        assert incident.seq == seqs[0] and NOTE in incident.detail, incident
        assert f"offsets {first}..{start - 1}" in incident.detail, incident


# --- the nightly job ----------------------------------------------------------------------


async def test_the_nightly_job_over_console_producer_topics_counts_them_and_finds_the_planted_faults(
    bootstrap, registry_url, spark, tmp_path
):
    """A compacted, keyed topic and a plain one, written by console producers with the
    interceptor and validated by the worker: the nightly job reads every record, knows every
    producer, finds nothing. Then a latest record of the compacted topic rewritten with
    other bytes (DIVERGED) and the plain topic's last two records gone (SEQUENCE_BEHIND for
    their producer): exactly those."""
    run = uuid.uuid4().hex[:8]
    orders, events, app_id = f"jorders-{run}", f"jevents-{run}", f"jrec-{run}"
    compact = {"cleanup.policy": "compact"}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(orders, 2, 1, topic_configs=compact), NewTopic(events, 1, 1)])
    finally:
        await admin.close()
    keyed = [f"k{i % 13}:v{i}" for i in range(60)]
    await asyncio.to_thread(console_produce, bootstrap, orders, keyed, keyed=True)
    await asyncio.to_thread(console_produce, bootstrap, events, [f"e{i}" for i in range(20)], keyed=False)
    await asyncio.to_thread(console_produce, bootstrap, events, [f"f{i}" for i in range(7)], keyed=False)

    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[orders, events], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        for topic in (orders, events):
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
    finally:
        worker.terminate()
    assert len(await read_table(bootstrap, app_id, 2, table="keys")) == 13

    original_orders = [r async for r in read_snapshot(bootstrap, orders)]
    original_events = [r async for r in read_snapshot(bootstrap, events)]
    producers = {
        (topic, r.partition, decode(dict(r.headers)[HEADER_NAME]).guid)
        for topic, records in ((orders, original_orders), (events, original_events))
        for r in records
    }
    assert len(original_orders) == 60 and len(original_events) == 27

    code, report, summary, _ = reconcile(spark, bootstrap, registry_url, app_id, [orders, events], tmp_path / "clean")
    assert (code, summary["status"]) == (0, "clean"), summary
    assert sum(summary["counts"].values()) == 0, summary["counts"]
    assert summary["records_read"] == {orders: 60, events: 27}, summary["records_read"]
    assert summary["state"]["key"] == 13, summary["state"]
    sequences = spark.read.parquet(str(report / "sequences")).collect()
    assert {(r["topic"], r["partition"], bytes.fromhex(r["producer"])) for r in sequences} == producers
    assert all(not r["behind"] for r in sequences), sequences

    # Plant: orders, the latest record of one key with other bytes under its header;
    # events, its last two records (the second producer's seq 5 and 6) gone.
    latest_of = {(r.partition, r.key): r for r in original_orders}
    altered = next(r for r in original_orders if latest_of[(r.partition, r.key)] is r)
    await rewrite(
        bootstrap,
        orders,
        2,
        [replace(r, value=b"other bytes") if r is altered else r for r in original_orders],
        compact,
    )
    await rewrite(bootstrap, events, 1, original_events[:-2], {})
    last_validated = original_events[-1]
    last_header = decode(dict(last_validated.headers)[HEADER_NAME])
    assert last_header.seq == 6

    code, report, summary, _ = reconcile(spark, bootstrap, registry_url, app_id, [orders, events], tmp_path / "planted")
    assert (code, summary["status"]) == (1, "discrepancies"), summary
    assert summary["records_read"] == {orders: 60, events: 25}, summary["records_read"]
    assert found_in(spark, report) == {
        ("DIVERGED", orders, altered.partition, altered.offset, altered.key),
        ("SEQUENCE_BEHIND", events, 0, last_validated.offset, None),
    }
    assert summary["counts"]["DIVERGED"] == 1 and summary["counts"]["SEQUENCE_BEHIND"] == 1, summary["counts"]
    behind = [r for r in spark.read.parquet(str(report / "sequences")).collect() if r["behind"]]
    assert [(r["topic"], bytes.fromhex(r["producer"]), r["topic_seq"], r["table_seq"]) for r in behind] == [
        (events, last_header.guid, 4, 6)
    ], behind
