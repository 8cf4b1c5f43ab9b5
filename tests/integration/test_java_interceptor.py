"""kdiv's Java producer interceptor on Apache Kafka's own producers (kafka-console-producer,
ProducerPerformance), their records validated by `kdiv check` and the live worker
(docs/java-producers.md)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter, defaultdict

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2
from click.testing import CliRunner

from kdiv.cli import main
from kdiv.div.wire import HEADER_NAME, IMPLICIT_SEGMENT_VERSION, Kind, decode, encode, record_crc
from kdiv.kafka.consume import read_snapshot
from tests.conftest import run_coroutine
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.kafka_tools import CONSOLE_PRODUCER, PRODUCER_PERFORMANCE, interceptor_properties, run_tool
from tests.harness.oracle import incident_differences, oracle
from tests.harness.processes import WorkerProcess

pytestmark = pytest.mark.broker

PARTITIONS = 3


def console_produce(bootstrap: str, topic: str, lines: list[str], *, keyed: bool, **properties: str) -> None:
    args = ["--bootstrap-server", bootstrap, "--topic", topic]
    for name, value in {**interceptor_properties(), **properties}.items():
        args += ["--producer-property", f"{name}={value}"]
    if keyed:
        args += ["--reader-property", "parse.key=true", "--reader-property", "key.separator=:"]
    run_tool(CONSOLE_PRODUCER, *args, stdin="".join(line + "\n" for line in lines))


def snapshot(bootstrap: str, topic: str):
    async def read():
        return [record async for record in read_snapshot(bootstrap, topic)]

    return run_coroutine(read())


def dump_and_check(bootstrap: str, topic: str, tmp_path, *args: str):
    path = tmp_path / f"{topic}.jsonl"
    dumped = CliRunner().invoke(main, ["dump", topic, "--bootstrap", bootstrap, "-o", str(path)])
    assert dumped.exit_code == 0, dumped.output
    checked = CliRunner().invoke(main, ["check", *args, str(path)])
    return checked, [json.loads(line) for line in checked.stdout.splitlines()]


def headers_of(records):
    return [decode(dict(r.headers)[HEADER_NAME]) for r in records]


PLANTED_VERDICTS = ["DUPLICATE", "DIVERGENT", "CORRUPT", "MISSING"]


def plant_faults(bootstrap: str, topic: str, records, headers) -> list[tuple[int, int]]:
    """Faults written with a Python producer after the interceptor's records; their
    (partition, offset), to be judged PLANTED_VERDICTS."""
    # Planted, in one partition of the first producer: a record sent again as it was (a
    # retry); one sent again under its seq with other bytes and their CRC (within the seqs
    # whose CRCs kdiv keeps, KDIV_SEQ_WINDOW); the next seq with a CRC its bytes do not have;
    # then a seq one past the next (one record lost).
    first_guid = headers[0].guid
    group = [
        (r, h)
        for r, h in zip(records, headers, strict=True)
        if h.guid == first_guid and r.partition == records[0].partition
    ]
    (resent, _), (altered, altered_header), (last, last_header) = group[3], group[-2], group[-1]

    def stamped(header, key, value, crc_of=None):
        crc = record_crc(Kind.DATA, key, value if crc_of is None else crc_of)
        return (key, value, [(HEADER_NAME, encode(header._replace(crc=crc)))])

    plants = [
        (resent.key, resent.value, list(resent.headers)),
        stamped(altered_header, altered.key, b"other bytes"),
        stamped(last_header._replace(seq=last_header.seq + 1), last.key, b"corrupted", crc_of=b"intact"),
        stamped(last_header._replace(seq=last_header.seq + 3), last.key, b"after a lost one"),
    ]

    async def plant():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            sent = [
                await producer.send_and_wait(topic, value, key, resent.partition, headers=plant_headers)
                for key, value, plant_headers in plants
            ]
        finally:
            await asyncio.wait_for(producer.stop(), 30)
        return [(m.partition, m.offset) for m in sent]

    return run_coroutine(plant())


def test_console_producer_records_validate_and_a_planted_fault_is_reported_exactly(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(PARTITIONS)
    keyed = [f"key-{i % 11}:value-{i}" for i in range(60)]
    unkeyed = [f"unkeyed-{i}" for i in range(20)]
    console_produce(bootstrap, topic, keyed, keyed=True)
    # A second run is a restarted producer: a new GUID, its segments opened anew.
    # Its batches are tiny, so its unkeyed records move on to the next partition every few.
    console_produce(bootstrap, topic, unkeyed, keyed=False, **{"batch.size": "64"})

    records = snapshot(bootstrap, topic)
    assert len(records) == len(keyed) + len(unkeyed)
    headers = headers_of(records)
    guids = Counter(h.guid for h in headers)
    assert len(guids) == 2 and sorted(guids.values()) == [len(unkeyed), len(keyed)]
    seqs: dict[tuple[bytes, int], list[int]] = defaultdict(list)
    for record, header in zip(records, headers, strict=True):
        assert header.implicit_segment and header.kind == Kind.DATA and header.segment == 0
        assert header.crc == record_crc(Kind.DATA, record.key, record.value)
        raw = dict(record.headers)[HEADER_NAME]
        assert raw[0] == IMPLICIT_SEGMENT_VERSION and len(raw) == 38
        if record.key is not None:
            # The interceptor picks the partition the producer's default partitioner would.
            assert record.partition == (murmur2(record.key) & 0x7FFFFFFF) % PARTITIONS
        seqs[(header.guid, record.partition)].append(header.seq)
    for seen in seqs.values():
        assert seen == list(range(len(seen)))
    # Unkeyed records stick to a partition for about a batch (batch.size): with 64-byte
    # batches, every partition has some of the second producer's.
    assert len({p for (g, p) in seqs if guids[g] == len(unkeyed)}) == PARTITIONS

    checked, lines = dump_and_check(bootstrap, topic, tmp_path)
    total = len(records)
    assert checked.exit_code == 0, checked.stderr
    assert f"{total} records (OK {total}); 0 faults, 0 fatal" in checked.stderr
    assert Counter(line["verdict"] for line in lines) == {"OK": total}

    planted = plant_faults(bootstrap, topic, records, headers)
    checked, lines = dump_and_check(bootstrap, topic, tmp_path)
    assert checked.exit_code == 1, checked.stderr
    faults = {(line["partition"], line["offset"]): line["verdict"] for line in lines if line["verdict"] != "OK"}
    assert faults == dict(zip(planted, PLANTED_VERDICTS, strict=True)), faults
    assert f"{total + 4} records (OK {total}, " in checked.stderr and "; 4 faults, 0 fatal" in checked.stderr


def test_producer_performance_records_validate(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    n = 5000
    props = [f"bootstrap.servers={bootstrap}", *(f"{k}={v}" for k, v in interceptor_properties().items())]
    run_tool(
        PRODUCER_PERFORMANCE,
        "--topic",
        topic,
        "--num-records",
        str(n),
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--producer-props",
        *props,
    )
    checked, lines = dump_and_check(bootstrap, topic, tmp_path)
    assert checked.exit_code == 0, checked.stderr
    assert f"{n} records (OK {n}); 0 faults, 0 fatal" in checked.stderr
    assert len({line["producer"] for line in lines}) == 1


async def test_the_live_worker_reports_exactly_the_planted_faults(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(PARTITIONS)
    await asyncio.to_thread(
        console_produce, bootstrap, topic, [f"key-{i % 7}:value-{i}" for i in range(40)], keyed=True
    )
    records = [record async for record in read_snapshot(bootstrap, topic)]
    planted = await asyncio.to_thread(plant_faults, bootstrap, topic, records, headers_of(records))
    app_id = f"java-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("java", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        live = await read_incidents(bootstrap, app_id)
        assert incident_differences(await oracle(bootstrap, topic), live) == []
        found = {(i[-1].partition, i[-1].offset): i[-1].verdict for i in live.values()}
        assert found == dict(zip(planted, PLANTED_VERDICTS, strict=True)), found
    finally:
        worker.terminate()
