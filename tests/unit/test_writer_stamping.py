"""The writers' shared stamping core, and the confluent_kafka writer's handling of what its
client refuses or fails to deliver (a client whose broker never answers: librdkafka's own
queue and timeouts, no broker needed)."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from confluent_kafka import KafkaError, KafkaException, Producer, SerializingProducer
from hypothesis import given
from hypothesis import strategies as st

from kdiv.div.stamper import DivStamper
from kdiv.div.wire import HEADER_NAME, ChecksumType, Kind, decode, record_crc
from kdiv.trace.header import TRACE_HEADER
from kdiv.writer import DivWriter
from kdiv.writer.confluent import ConfluentDivWriter, DeliveryFailed
from kdiv.writer.stamping import StampingCore

GUID = bytes(range(16))
NOWHERE = "127.0.0.1:1"  # nothing listens: every delivery times out


def clock(start: int = 1_000_000):
    now = [start]

    def tick() -> int:
        now[0] += 1
        return now[0]

    return tick


def div_headers(records):
    return [decode(dict(record.headers)[HEADER_NAME]) for record in records]


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=40))
def test_a_keyed_record_goes_where_kafkas_default_partitioner_puts_it(key, count):
    core = StampingCore(GUID)
    partitions = list(range(count))
    assert core.partition_for("t", key, partitions) == (aiokafka_murmur2(key) & 0x7FFFFFFF) % count


def test_unkeyed_records_go_round_robin_per_topic():
    core = StampingCore(GUID)
    assert [core.partition_for("a", None, [0, 1, 2]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [core.partition_for("b", None, [4, 7]) for _ in range(3)] == [4, 7, 4]
    with pytest.raises(LookupError, match="'c' has no partitions"):
        core.partition_for("c", None, [])


def test_the_core_stamps_segments_seqs_and_crcs_per_partition():
    core = StampingCore(GUID, max_records_per_segment=2, clock_ms=clock())
    out = core.data("t", 0, b"k", b"v0") + core.data("t", 1, None, b"w0") + core.data("t", 0, b"k", b"v1")
    out += core.data("t", 0, b"k", b"v2")  # rollover: END_OF_SEGMENT, START_OF_SEGMENT, then the record
    out += core.end_segment("t", 0) + core.end_segment("t", 1)
    headers = div_headers(out)
    assert [(r.partition, h.kind, h.segment, h.seq) for r, h in zip(out, headers, strict=True)] == [
        (0, Kind.START_OF_SEGMENT, 0, 0),
        (0, Kind.DATA, 0, 1),
        (1, Kind.START_OF_SEGMENT, 0, 0),
        (1, Kind.DATA, 0, 1),
        (0, Kind.DATA, 0, 2),
        (0, Kind.END_OF_SEGMENT, 0, 3),
        (0, Kind.START_OF_SEGMENT, 1, 0),
        (0, Kind.DATA, 1, 1),
        (0, Kind.END_OF_SEGMENT, 1, 2),
        (1, Kind.END_OF_SEGMENT, 0, 2),
    ]
    assert {h.guid for h in headers} == {GUID}
    for record, header in zip(out, headers, strict=True):
        assert header.crc == record_crc(header.kind, record.key, record.value)
    assert core.open_partitions() == []


def test_the_core_stamps_exactly_what_the_stamper_does_and_traces_a_sampled_record():
    core = StampingCore(GUID, clock_ms=lambda: 42, tracing="t=1")
    stamper = DivStamper(GUID)
    (sos, data) = core.data("t", 3, b"k", b"v", [("app", b"1")])
    expected = stamper.data("t", 3, b"k", b"v", 42, (("app", b"1"),))
    assert sos == expected[0]
    names = [name for name, _ in data.headers]
    assert names == ["app", TRACE_HEADER, HEADER_NAME]
    assert dict(data.headers)[HEADER_NAME] == dict(expected[1].headers)[HEADER_NAME]


def test_both_writers_stamp_through_the_one_core():
    """Same GUID, same clock, same records in: the same bytes out, whichever client sends them."""
    aio = DivWriter.__new__(DivWriter)
    confluent = ConfluentDivWriter(Producer({"bootstrap.servers": NOWHERE}), guid=GUID, clock_ms=lambda: 7)
    aio.core = StampingCore(GUID, clock_ms=lambda: 7)
    assert type(confluent.core) is type(aio.core) is StampingCore
    assert confluent.core.data("t", 0, b"k", b"v") == aio.core.data("t", 0, b"k", b"v")


def test_a_partition_rolls_back_alone():
    stamper = DivStamper(GUID)
    stamper.data("t", 0, b"k", b"v", 1)
    stamper.data("t", 1, b"k", b"v", 1)
    before = stamper.partition_checkpoint("t", 0)
    untouched = stamper.partition_checkpoint("t", 1)
    stamper.data("t", 0, b"k", b"refused", 2)
    stamper.end_segment("t", 0, True, 3)
    stamper.rollback_partition("t", 0, before)
    assert stamper.partition_checkpoint("t", 0) == before
    assert stamper.partition_checkpoint("t", 1) == untouched
    (again,) = stamper.data("t", 0, b"k", b"v", 4)
    assert decode(dict(again.headers)[HEADER_NAME]).seq == 2
    fresh = stamper.partition_checkpoint("t", 9)
    stamper.data("t", 9, None, b"v", 5)
    stamper.rollback_partition("t", 9, fresh)
    assert stamper.open_partitions("t") == [("t", 0), ("t", 1)]


def unreachable(**config) -> Producer:
    return Producer({"bootstrap.servers": NOWHERE, "message.timeout.ms": 300, "log_level": 0, **config})


def test_a_failed_delivery_without_a_callback_is_raised_by_flush():
    writer = ConfluentDivWriter(unreachable(), guid=GUID)
    writer.produce("t", b"v", b"k", partition=0)
    with pytest.raises(DeliveryFailed) as failed:
        writer.flush(10)
    # The START_OF_SEGMENT and the record, each named with librdkafka's error.
    assert [(f.topic, f.partition, f.kind) for f in failed.value.failures] == [
        ("t", 0, Kind.START_OF_SEGMENT),
        ("t", 0, Kind.DATA),
    ]
    assert {f.error.code() for f in failed.value.failures} == {KafkaError._MSG_TIMED_OUT}
    assert "2 record(s) not delivered: START_OF_SEGMENT record to t/0: " in str(failed.value)
    writer.flush(10)  # raised once


def test_a_failed_delivery_goes_to_its_callback_and_control_records_failures_to_flush():
    writer = ConfluentDivWriter(unreachable(), guid=GUID)
    reports: list = []
    writer.produce("t", b"v", b"k", partition=2, on_delivery=lambda err, msg: reports.append((err, msg)))
    with pytest.raises(DeliveryFailed) as failed:
        writer.flush(10)
    assert [f.kind for f in failed.value.failures] == [Kind.START_OF_SEGMENT]
    ((err, msg),) = reports
    assert err.code() == KafkaError._MSG_TIMED_OUT and msg.partition() == 2 and msg.value() == b"v"


def test_produce_and_wait_raises_the_records_failure_and_times_out_bounded():
    writer = ConfluentDivWriter(unreachable(), guid=GUID)
    with pytest.raises(DeliveryFailed, match=r"DATA record to t/0: .*Message timed out"):
        writer.produce_and_wait("t", b"v", b"k", partition=0, timeout_s=10)
    slow = ConfluentDivWriter(unreachable(**{"message.timeout.ms": 60_000}), guid=GUID)
    with pytest.raises(TimeoutError, match="no delivery report within 0.3 s"):
        slow.produce_and_wait("t", b"v", partition=0, timeout_s=0.3)
    slow.producer.purge()
    slow.producer.flush(5)


def test_a_record_the_full_queue_refuses_is_not_stamped():
    producer = unreachable(**{"queue.buffering.max.messages": 2, "message.timeout.ms": 60_000})
    writer = ConfluentDivWriter(producer, guid=GUID, queue_full_timeout_s=0.2)
    writer.produce("t", b"v0", partition=0)  # START_OF_SEGMENT and the record: the queue is full
    before = writer.core.stamper.partition_checkpoint("t", 0)
    with pytest.raises(BufferError, match=r"t/0: the producer's queue stayed full for 0.2 s; nothing was sent"):
        writer.produce("t", b"v1", partition=0)
    assert writer.core.stamper.partition_checkpoint("t", 0) == before
    writer.producer.purge()
    writer.producer.flush(5)
    # A record that opens a segment, with room for one more: its START_OF_SEGMENT went in, the
    # record did not, and its seq stays taken (a validator reports it MISSING, truly).
    producer = unreachable(**{"queue.buffering.max.messages": 3, "message.timeout.ms": 60_000})
    writer = ConfluentDivWriter(producer, guid=GUID, queue_full_timeout_s=0.2)
    writer.produce("t", b"x", partition=1)
    with pytest.raises(BufferError, match="t/2: .*; 1 stamped record.s. not sent"):
        writer.produce("t", b"y", partition=2)
    assert writer.core.stamper.partition_checkpoint("t", 2).segments[("t", 2)][1] == 2  # next seq
    writer.producer.purge()
    writer.producer.flush(5)


def test_the_writer_refuses_serializers_and_unordered_retries():
    with pytest.raises(ValueError, match="without serializers"):
        ConfluentDivWriter(SerializingProducer({"bootstrap.servers": NOWHERE}))
    with pytest.raises(ValueError, match=r"max.in.flight.requests.per.connection must be 1: with 5"):
        ConfluentDivWriter.start(NOWHERE, producer_config={"enable.idempotence": False, "max.in.flight": 5})


def test_the_writer_a_closed_writer_sends_nothing():
    writer = ConfluentDivWriter(unreachable(), guid=GUID, checksum_type=ChecksumType.NONE)
    writer.close(5)
    with pytest.raises(RuntimeError, match="closed"):
        writer.produce("t", b"v", partition=0)


def test_a_record_the_client_refuses_at_once_is_not_stamped():
    writer = ConfluentDivWriter(unreachable(**{"message.max.bytes": 2000}), guid=GUID)
    writer.produce("t", b"small", partition=0)
    before = writer.core.stamper.partition_checkpoint("t", 0)
    with pytest.raises(KafkaException) as refused:
        writer.produce("t", b"x" * 5000, partition=0)
    assert refused.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert "kdiv: DATA record to t/0 refused; nothing was sent" in refused.value.__notes__
    assert writer.core.stamper.partition_checkpoint("t", 0) == before
    with pytest.raises(TypeError, match="value of a record for t/0 must be bytes or None, not str"):
        writer.produce("t", "text", partition=0)
    assert writer.core.stamper.partition_checkpoint("t", 0) == before
    writer.producer.purge()
    writer.producer.flush(5)


def test_close_closes_a_producer_of_the_writers_own_and_leaves_one_it_was_given():
    own = ConfluentDivWriter.start(NOWHERE, producer_config={"log_level": 0})
    own.close(5)
    with pytest.raises(RuntimeError, match="closed"):
        own.producer.produce("t", b"v", partition=0)
    given = unreachable()
    ConfluentDivWriter(given).close(5)
    given.produce("t", b"v", partition=0)
    given.purge()
    given.flush(5)


def test_a_record_without_a_partition_waits_for_metadata_a_bounded_time():
    writer = ConfluentDivWriter(unreachable(), guid=GUID, metadata_timeout_s=0.5)
    with pytest.raises(LookupError, match=r"topic 't': no metadata within 0.5 s"):
        writer.produce("t", b"v", b"k")
    assert writer.core.open_partitions() == []  # nothing stamped
