"""ConfluentDivWriter on a real broker: records stamped through confluent_kafka's Producer
(synchronously and with delivery callbacks; keyed and unkeyed; several partitions) validated
with exact counts by `kdiv check` and by the live worker, and faults planted among them
reported exactly (docs/writer.md#confluent_kafka)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from kdiv.cli import main
from kdiv.div.wire import HEADER_NAME, Kind, decode, encode, record_crc
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.partitioner import keyed_partition
from kdiv.writer.confluent import ConfluentDivWriter, DeliveryFailed
from tests.conftest import run_coroutine
from tests.harness.broker import read_incidents, read_table, wait_until_caught_up
from tests.harness.oracle import incident_differences, oracle, saved_state, state_differences
from tests.harness.processes import WorkerProcess

pytestmark = pytest.mark.broker

PARTITIONS = 3
KEYED, UNKEYED, CALLBACKS = 120, 30, 90
PLANTED_VERDICTS = ["DUPLICATE", "DIVERGENT"]


def snapshot(bootstrap: str, topic: str):
    async def read():
        return [record async for record in read_snapshot(bootstrap, topic)]

    return run_coroutine(read())


def dump_and_check(bootstrap: str, topic: str, tmp_path):
    path = tmp_path / f"{topic}.jsonl"
    dumped = CliRunner().invoke(main, ["dump", topic, "--bootstrap", bootstrap, "-o", str(path)])
    assert dumped.exit_code == 0, dumped.output
    checked = CliRunner().invoke(main, ["check", str(path)])
    return checked, [json.loads(line) for line in checked.stdout.splitlines()]


def write_sync_and_with_callbacks(bootstrap: str, topic: str) -> dict[int, int]:
    """Two writers (two GUIDs): one synchronous (produce, produce_and_wait, a push, flush), one
    with delivery callbacks; each record's partition (as `produce` returned it, or its delivery
    report said), by value."""
    placed: dict[int, int] = {}
    with ConfluentDivWriter.start(bootstrap, max_records_per_segment=25) as writer:
        writer.start_push(topic)
        for i in range(KEYED):
            key = b"key-%d" % (i % 13)
            if i % 10 == 0:
                delivered = writer.produce_and_wait(topic, b"%d" % i, key)
                partition = delivered.partition()
                assert partition is not None and delivered.value() == b"%d" % i
                placed[i] = partition
            else:
                placed[i] = writer.produce(topic, b"%d" % i, key)
        for i in range(KEYED, KEYED + UNKEYED):
            placed[i] = writer.produce(topic, b"%d" % i)
        writer.end_push(topic)
        writer.flush()

    reports: list = []
    with ConfluentDivWriter.start(bootstrap, max_records_per_segment=40) as writer:
        for i in range(KEYED + UNKEYED, KEYED + UNKEYED + CALLBACKS):
            other: bytes | None = None if i % 3 == 0 else b"other-%d" % (i % 17)
            writer.produce(topic, b"%d" % i, other, on_delivery=lambda err, msg: reports.append((err, msg)))
            writer.poll(0)
        writer.flush()
    assert len(reports) == CALLBACKS and all(err is None for err, _ in reports), reports[:3]
    placed.update({int(msg.value()): msg.partition() for _, msg in reports})
    return placed


def test_records_written_sync_and_with_callbacks_validate_with_exact_counts(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(PARTITIONS)
    placed = write_sync_and_with_callbacks(bootstrap, topic)

    records = snapshot(bootstrap, topic)
    headers = [decode(dict(r.headers)[HEADER_NAME]) for r in records]
    data = [(r, h) for r, h in zip(records, headers, strict=True) if h.kind == Kind.DATA]
    assert len(data) == KEYED + UNKEYED + CALLBACKS
    assert len({h.guid for h in headers}) == 2
    for record, header in data:
        assert record.partition == placed[int(record.value)]
        assert header.crc == record_crc(Kind.DATA, record.key, record.value)
        if record.key is not None:
            assert record.partition == keyed_partition(record.key, range(PARTITIONS))
    # Unkeyed records went round robin: every partition has some of each writer's.
    for guid in {h.guid for h in headers}:
        assert {r.partition for r, h in data if h.guid == guid and r.key is None} == set(range(PARTITIONS))
    # Per producer and partition, seqs on the wire are in order within each segment.
    seqs: dict[tuple[bytes, int, int], list[int]] = defaultdict(list)
    for record, header in zip(records, headers, strict=True):
        seqs[(header.guid, record.partition, header.segment)].append(header.seq)
    assert all(seen == list(range(len(seen))) for seen in seqs.values())
    # The push: START_OF_PUSH and END_OF_PUSH on every partition; every segment ended as final at close.
    kinds = Counter(h.kind for h in headers)
    assert kinds[Kind.START_OF_PUSH] == kinds[Kind.END_OF_PUSH] == PARTITIONS

    checked, lines = dump_and_check(bootstrap, topic, tmp_path)
    total = len(records)
    assert checked.exit_code == 0, checked.stderr
    assert f"{total} records (OK {total}); 0 faults, 0 fatal" in checked.stderr
    assert Counter(line["verdict"] for line in lines) == {"OK": total}


def test_librdkafkas_murmur2_random_puts_keyed_records_where_the_writer_does(bootstrap, topic_factory):
    """The writer's choice for keyed records is the partitioner `start()` configures: records
    sent without a partition by a plain Producer with it land where the writer would put them."""
    topic = topic_factory(PARTITIONS)
    plain = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    writer = ConfluentDivWriter(Producer({"bootstrap.servers": bootstrap}))
    reports: list = []
    keys = [b"key-%d" % i for i in range(40)] + [b""]
    for key in keys:
        plain.produce(topic, b"v", key, on_delivery=lambda err, msg: reports.append((err, msg)))
    assert plain.flush(30) == 0
    assert all(err is None for err, _ in reports)
    assert {msg.key(): msg.partition() for _, msg in reports} == {key: writer.partition_for(topic, key) for key in keys}
    assert len({msg.partition() for _, msg in reports}) == PARTITIONS


def plant_faults(bootstrap: str, topic: str) -> tuple[list[tuple[int, int]], int]:
    """A writer's records on partition 0 with, planted mid-segment by a plain Producer, one of
    its records sent again as it was (a retry) and one sent again under its seq with other
    bytes and their CRC; then more records and the close. The planted (partition, offset)s,
    and how many records the writer sent (its control records included)."""
    planter = Producer({"bootstrap.servers": bootstrap})
    with ConfluentDivWriter.start(bootstrap) as writer:
        sent = [writer.produce_and_wait(topic, b"value-%d" % i, b"k", partition=0) for i in range(12)]
        # librdkafka's delivery reports carry no headers: the records as the log has them.
        by_offset = {r.offset: r for r in snapshot(bootstrap, topic) if r.partition == 0}
        resent_record, altered_record = by_offset[sent[3].offset()], by_offset[sent[9].offset()]
        other = b"other bytes"
        altered_header = decode(dict(altered_record.headers)[HEADER_NAME])
        plants = [
            (resent_record.key, resent_record.value, list(resent_record.headers)),
            (
                altered_record.key,
                other,
                [(HEADER_NAME, encode(altered_header._replace(crc=record_crc(Kind.DATA, altered_record.key, other))))],
            ),
        ]
        reports: list = []
        for key, value, headers in plants:
            planter.produce(
                topic, value, key, 0, headers=headers, on_delivery=lambda err, msg: reports.append((err, msg))
            )
        assert planter.flush(30) == 0 and all(err is None for err, _ in reports)
        for i in range(12, 20):
            writer.produce(topic, b"value-%d" % i, b"k", partition=0)
    # START_OF_SEGMENT, 20 records, the final END_OF_SEGMENT.
    return [(msg.partition(), msg.offset()) for _, msg in reports], 22


def test_a_record_sent_again_and_one_sent_again_with_other_bytes_are_reported_exactly(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1)
    planted, written = plant_faults(bootstrap, topic)
    assert planted == [(0, 13), (0, 14)]  # after the START_OF_SEGMENT and 12 records

    checked, lines = dump_and_check(bootstrap, topic, tmp_path)
    assert checked.exit_code == 1, checked.stderr
    faults = {(line["partition"], line["offset"]): line["verdict"] for line in lines if line["verdict"] != "OK"}
    assert faults == dict(zip(planted, PLANTED_VERDICTS, strict=True)), faults
    assert f"{written + 2} records (OK {written}, " in checked.stderr and "; 2 faults, 0 fatal" in checked.stderr


async def test_the_live_worker_counts_the_records_and_reports_exactly_the_planted_faults(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(PARTITIONS)
    await asyncio.to_thread(write_sync_and_with_callbacks, bootstrap, topic)
    planted, _ = await asyncio.to_thread(plant_faults, bootstrap, topic)
    expected = await oracle(bootstrap, topic)
    app_id = f"confluent-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("confluent", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        live = await read_incidents(bootstrap, app_id)
        assert incident_differences(expected, live) == []
        found = {(i[-1].partition, i[-1].offset): i[-1].verdict for i in live.values()}
        assert found == dict(zip(planted, PLANTED_VERDICTS, strict=True)), found
        table = await read_table(bootstrap, app_id, PARTITIONS)
        assert state_differences(expected, table) == []
        parts, _ = saved_state(table)
        assert sum(part.records for part in parts.values()) == expected.records
        assert sum(sum(part.verdict_counts.values()) for part in parts.values()) == len(planted)
    finally:
        worker.terminate()


def test_a_record_the_broker_refuses_is_a_delivery_failure_and_a_missing_seq(bootstrap, topic_factory, tmp_path):
    """A record larger than the topic allows: its delivery fails (raised by produce_and_wait,
    given to a callback), it never reaches the log, and `kdiv check` reports its seq MISSING at
    the next record, and the segment's checksum, which counted it, at the END_OF_SEGMENT."""
    topic = topic_factory(1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    limit = ConfigResource(
        "topic",
        topic,
        incremental_configs=[ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([limit])[limit].result(30)
    reports: list = []
    with ConfluentDivWriter.start(bootstrap) as writer:
        for i in range(5):
            writer.produce_and_wait(topic, b"small-%d" % i, b"k")
        with pytest.raises(DeliveryFailed, match=r"DATA record to .*/0: Broker: Message size too large"):
            writer.produce_and_wait(topic, b"x" * 5000, b"k")
        writer.produce(topic, b"large", b"k", on_delivery=lambda err, msg: reports.append(err))
        writer.flush()
        for i in range(5, 8):
            writer.produce_and_wait(topic, b"small-%d" % i, b"k")
    assert reports == [None]

    checked, lines = dump_and_check(bootstrap, topic, tmp_path)
    assert checked.exit_code == 1, checked.stderr
    # By seq: START_OF_SEGMENT 0, small-0..4 1-5, the refused record 6 (never written),
    # "large" 7, small-5..7 8-10, the final END_OF_SEGMENT 11. The line at offset 6 is the
    # gap's MISSING: it names the gap's seq 6, and the record it judges, seq 7.
    assert [(line["offset"], line["seq"]) for line in lines] == [(i, i if i <= 6 else i + 1) for i in range(11)]
    assert lines[6]["record"] == {"offset": 6, "seq": 7}
    faults = [(line["offset"], line["verdict"]) for line in lines if line["verdict"] != "OK"]
    assert faults == [(6, "MISSING"), (10, "CORRUPT")], faults
