"""DivWriter to a real broker, read back and validated: the path users run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from kdiv.clock import wall_clock_ms
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import Kind, decode
from kdiv.kafka.consume import read_snapshot
from kdiv.writer import DivWriter

pytestmark = pytest.mark.broker


async def snapshot(bootstrap: str, topic: str):
    return [record async for record in read_snapshot(bootstrap, topic)]


def kinds(records):
    return [decode(dict(r.headers)["div"]).kind for r in records]


async def test_writer_output_validates_clean_with_keyed_partitioning(bootstrap, topic_factory):
    topic = topic_factory(4)
    async with await DivWriter.start(bootstrap, max_records_per_segment=40) as writer:
        await writer.start_push(topic)
        futures = [await writer.send(topic, b"value-%d" % i, b"key-%d" % (i % 37)) for i in range(600)]
        futures += [await writer.send(topic, b"unkeyed-%d" % i) for i in range(40)]
        await writer.end_push(topic)
        metadata = await asyncio.gather(*futures)
        await writer.send(topic, b"after the push", b"key-1")
    records = await snapshot(bootstrap, topic)

    # Keyed records land where Kafka's default (murmur2) partitioner puts them.
    for i, meta in enumerate(metadata[:600]):
        assert meta.partition == (murmur2(b"key-%d" % (i % 37)) & 0x7FFFFFFF) % 4
    # Unkeyed records are spread over every partition.
    assert {meta.partition for meta in metadata[600:]} == {0, 1, 2, 3}

    validator = DataIntegrityValidator()
    results = [validator.validate(r, 0) for r in records]
    assert {r.verdict.value for r in results} == {"OK"}
    assert sum(k == Kind.DATA for k in kinds(records)) == 641
    # Per partition: SOS, SOP first; EOP then the final END_OF_SEGMENT of the push's segment.
    for p in range(4):
        part = [r for r in records if r.partition == p]
        assert kinds(part)[:2] == [Kind.START_OF_SEGMENT, Kind.START_OF_PUSH]
        assert not validator.partition(topic, p).in_push
        assert not validator.partition(topic, p).push_failed
    final_eos = [decode(dict(r.headers)["div"]) for r in records if kinds([r]) == [Kind.END_OF_SEGMENT]]
    assert sum(h.final_segment for h in final_eos) == 4 + 1  # end of push on 4 partitions + close


async def test_concurrent_sends_keep_sequence_order_on_the_wire(bootstrap, topic_factory):
    topic = topic_factory(3)
    async with await DivWriter.start(
        bootstrap, max_records_per_segment=25, producer_options={"linger_ms": 20, "max_batch_size": 2048}
    ) as writer:

        async def burst(n: int) -> list:
            return [await writer.send(topic, b"x" * 50, b"k%d-%d" % (n, i)) for i in range(200)]

        futures = [f for batch in await asyncio.gather(*(burst(n) for n in range(5))) for f in batch]
        await writer.flush()
        assert all(f.done() and not f.exception() for f in futures)
    records = await snapshot(bootstrap, topic)
    validator = DataIntegrityValidator(start_in_push=True)
    assert {validator.validate(r, 0).verdict.value for r in records} == {"OK"}
    assert sum(k == Kind.DATA for k in kinds(records)) == 1000


async def test_faults_injected_between_writer_and_broker_are_reported_by_dump_and_check(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        writer = DivWriter(producer)
        sent = []

        async def put(records):
            for r in records:
                await producer.send_and_wait(r.topic, r.value, r.key, partition=r.partition, headers=list(r.headers))
                sent.append(r)

        for i in range(10):
            await put(writer.stamper.data(topic, 0, b"k%d" % i, b"v%d" % i, wall_clock_ms()))
        await writer.send_and_wait(topic, b"v10", b"k10", partition=0)
        # Loss: stamped by the writer, never reaches the broker.
        writer.stamper.data(topic, 0, b"lost", b"lost", wall_clock_ms())
        await writer.send_and_wait(topic, b"after-loss", b"k12", partition=0)
        # Duplicate: a retry that re-sends an acknowledged record.
        await put([sent[3]])
        # Corruption: the value changed after stamping.
        (victim,) = writer.stamper.data(topic, 0, b"k13", b"original", wall_clock_ms())
        await producer.send_and_wait(topic, b"tampered", victim.key, partition=0, headers=list(victim.headers))
        await writer.close()
    finally:
        await producer.stop()

    captured = tmp_path / "captured.jsonl"
    env_cmd = [sys.executable, "-m", "kdiv.cli"]
    dump = subprocess.run(
        [*env_cmd, "dump", topic, "--bootstrap", bootstrap, "-o", str(captured)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dump.returncode == 0, dump.stderr
    check = subprocess.run([*env_cmd, "check", str(captured)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 1, check.stderr
    out = [json.loads(line) for line in check.stdout.splitlines()]
    assert len(out) == 16  # SOS, 11 data, after-loss, duplicate, tampered, EOS: the lost one never arrived
    faults = [(o["offset"], o["verdict"], o["seq"]) for o in out if o["verdict"] != "OK"]
    assert faults == [
        (12, "MISSING", 12),  # the gap of seq 12, which never arrived, found by the record after it
        (13, "DUPLICATE", 3),  # the re-sent record (sent[3] is seq 3)
        (14, "CORRUPT", 14),  # the tampered value
        (15, "CORRUPT", 15),  # the final END_OF_SEGMENT: ADHASH lacks the lost and the tampered record
    ]


def test_dump_and_validate_fail_in_one_line_naming_what(bootstrap):
    """No such topic, and no broker at the address: a message, exit 2, no traceback, no
    unclosed consumer."""
    cli = [sys.executable, "-m", "kdiv.cli"]
    for args, says in (
        (["dump", "kdiv-no-such-topic", "--bootstrap", bootstrap], "topic 'kdiv-no-such-topic' does not exist"),
        (["validate", "kdiv-no-such-topic", "--bootstrap", bootstrap], "topic 'kdiv-no-such-topic' does not exist"),
        (["dump", "t", "--bootstrap", "127.0.0.1:1"], "Kafka at 127.0.0.1:1: ConnectionRefusedError"),
        (["validate", "t", "--bootstrap", "127.0.0.1:1"], "Kafka at 127.0.0.1:1: ConnectionRefusedError"),
        (["registry", "--bootstrap", "127.0.0.1:1", "--port", "0"], "Kafka at 127.0.0.1:1: ConnectionRefusedError"),
    ):
        done = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        assert f"Error: {says}" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr, (args, done.stderr)
    # schemas check: exit 2 when the broker or registry cannot be read (docs/commands.md#exit-status).
    done = subprocess.run(
        [*cli, "schemas", "check", "t", "--bootstrap", "127.0.0.1:1"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "error: Kafka at 127.0.0.1:1: ConnectionRefusedError" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    debugged = subprocess.run(
        [*cli, "--debug", "dump", "t", "--bootstrap", "127.0.0.1:1"], capture_output=True, text=True
    )
    assert debugged.returncode == 2 and "Traceback" in debugged.stderr and "KafkaConnectionError" in debugged.stderr
