"""The reconciliation's comparisons in Spark, over records the real validator produced state for.

A log is validated by `LiveValidation` (the worker's logic); its writes become changelog
records; the topic "at rest" is the log changed one way per test. Each test asserts that
exactly the planted discrepancy is found.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from kdiv.div.ledger import at_rest_crc
from kdiv.div.validator import DataIntegrityValidator, TopicPolicy
from kdiv.div.wire import Kind
from kdiv.reconcile.compare import compare_keys, compare_sequences
from kdiv.reconcile.findings import DIVERGED, LOST, SEQUENCE_BEHIND, UNVALIDATED
from kdiv.reconcile.state import decoded_state
from kdiv.reconcile.topics import (
    at_rest_view,
    highest_sequences,
    keyed_data,
    latest_per_key,
)
from kdiv.state.values import StateValues
from kdiv.worker.live import LiveValidation
from tests.harness.streams import GUID_A, NOW, Log, corrupt_value

KAFKA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)
SCHEMA_ID = 3
COMPACTED = "orders"
PLAIN = "events"


def kafka_rows(records):
    return [
        (
            r.key,
            r.value,
            r.topic,
            r.partition,
            r.offset,
            datetime.fromtimestamp(r.timestamp / 1000, UTC),
            0,
            [(n, v) for n, v in r.headers],
        )
        for r in records
    ]


def validated_state(spark, records):
    """Changelog records of the state and ledger tables after validating `records`."""
    live = LiveValidation(
        DataIntegrityValidator(lambda t: TopicPolicy(compaction_lag_ms=0 if t == COMPACTED else None)),
        StateValues(SCHEMA_ID),
        ledger_topics=frozenset({COMPACTED}),
    )
    changelog, offsets = [], {}

    def append(topic, key, value):
        offset = offsets.get(topic, 0)
        offsets[topic] = offset + 1
        changelog.append((key, value, topic, 0, offset, datetime.fromtimestamp(NOW / 1000, UTC), 0, []))

    for topic in {r.topic for r in records}:
        live.load(topic, 0, [])
    for record in records:
        live.process(record, NOW)
        for key, value in live.take_ledger_writes(record.topic, 0):
            append("app-keys-p1-changelog", key, value)
        writes = live.take_writes(record.topic, 0)
        for key, value in writes.in_order() if writes else ():
            append("app-state-p1-changelog", key, value)
    from kdiv.state.codec import STATE_SCHEMA_JSON

    return decoded_state(spark.createDataFrame(changelog, KAFKA_DDL), {SCHEMA_ID: STATE_SCHEMA_JSON})


def reconcile(spark, validated, at_rest):
    state = validated_state(spark, validated)
    records = at_rest_view(spark.createDataFrame(kafka_rows(at_rest), KAFKA_DDL))
    latest = latest_per_key(keyed_data(records.where(records.topic == COMPACTED)))
    keys = compare_keys(latest, state, [COMPACTED])
    sequences, behind = compare_sequences(highest_sequences(records), state, [COMPACTED])
    found = sorted((r["class"], r["topic"], r["offset"], r["key"]) for r in keys.union(behind).collect())
    return found, {(r["topic"], r["producer"]): r["behind"] for r in sequences.collect()}


def compacted_log():
    log = Log(COMPACTED)
    log.control(Kind.START_OF_SEGMENT, 0, 0)
    log.data(0, 1, key=b"a", value=b"a1")
    log.data(0, 2, key=b"b", value=b"b1")
    log.data(0, 3, key=b"a", value=b"a2")  # supersedes offset 1
    log.data(0, 4, key=b"c", value=b"c1")
    log.add(b"b", None, ())  # tombstone for b, unstamped
    log.data(0, 5, key=b"d\xff", value=b"d1")  # non-UTF-8 key
    return log.records


def plain_log():
    log = Log(PLAIN)
    log.control(Kind.START_OF_SEGMENT, 0, 0)
    for seq in range(1, 5):
        log.data(0, seq, key=b"e%d" % seq)
    return log.records


def test_clean_and_compacted_topics_report_nothing(spark):
    records = compacted_log() + plain_log()
    # Compaction drops superseded a1 and b1, and later the tombstone of b: none is reported.
    compacted = [r for r in records if not (r.topic == COMPACTED and r.offset in (1, 2, 5))]
    for at_rest in (records, compacted):
        found, behind = reconcile(spark, records, at_rest)
        assert found == []
        assert behind == {(COMPACTED, GUID_A.hex()): False, (PLAIN, GUID_A.hex()): False}


def test_spark_at_rest_crc_is_the_ledger_crc(spark):
    rows = [(b"k", b"v"), (None, b"v"), (b"k", None), (None, None), (b"", b""), (bytes(range(256)), b"x" * 70000)]
    df = spark.createDataFrame(rows, "key binary, value binary")
    from kdiv.reconcile.topics import at_rest_crc as spark_crc

    got = [r[0] for r in df.select(spark_crc(df.key, df.value)).collect()]
    assert got == [at_rest_crc(k, v) for k, v in rows]


def test_corrupted_value_at_a_validated_offset_is_diverged(spark):
    records = compacted_log()
    at_rest = [corrupt_value(r) if r.offset == 4 else r for r in records]
    assert reconcile(spark, records, at_rest)[0] == [(DIVERGED, COMPACTED, 4, b"c")]


def test_truncated_tail_is_lost_and_an_older_survivor_too(spark):
    records = compacted_log()
    truncated = records[:-1]  # d's only record gone (log truncation)
    assert reconcile(spark, records, truncated)[0] == [(LOST, COMPACTED, 6, b"d\xff")]
    older = [r for r in records if r.offset != 3]  # a2 gone, a1 still there
    assert reconcile(spark, records, older)[0] == [(LOST, COMPACTED, 3, b"a")]


def test_record_the_validator_never_saw_below_its_offset_is_unvalidated(spark):
    records = compacted_log()
    unseen = replace(records[4], key=b"x", value=b"x1", headers=())
    at_rest = [*records[:4], unseen, *records[5:]]
    # The validator read the log with offset 4 missing (e.g. a consumer skipped it).
    validated = [r for r in records if r.offset != 4]
    found = reconcile(spark, validated, at_rest)[0]
    assert found == [(UNVALIDATED, COMPACTED, 4, b"x")]
    # A record beyond what the validator reached is lag, not a finding.
    ahead = Log(COMPACTED)
    ahead.records = list(records)
    ahead.next_offset = {0: len(records)}
    ahead.data(0, 6, key=b"late", value=b"z")
    assert reconcile(spark, records, ahead.records)[0] == []


def test_plain_topic_behind_its_table_is_sequence_behind(spark):
    records = plain_log()
    found, behind = reconcile(spark, records, records[:-2])
    assert found == [(SEQUENCE_BEHIND, PLAIN, 4, None)]
    assert behind == {(PLAIN, GUID_A.hex()): True}


@pytest.fixture(autouse=True)
def _quiet(spark):
    spark.sparkContext.setLogLevel("ERROR")


def test_spark_reads_div_headers_by_the_validators_rule(spark):
    import struct
    import uuid

    from kdiv.div.ledger import key_validation_of
    from kdiv.div.record import ConsumedRecord
    from kdiv.div.stamper import DivStamper
    from kdiv.div.wire import HEADER_NAME, readable_div_header
    from kdiv.reconcile.topics import with_div_fields

    stamper = DivStamper(uuid.UUID(int=5).bytes)
    sos, data = stamper.data(COMPACTED, 0, b"k", b"v", NOW)
    (eos,) = stamper.end_segment(COMPACTED, 0, True, NOW)
    good = {"sos": sos.headers[-1][1], "data": data.headers[-1][1], "eos": eos.headers[-1][1]}
    bad_type = good["sos"][:-1] + b"\x02"
    bad_flag = good["eos"][:-1] + b"\x07"
    implicit_segment = b"\x02" + good["data"][1:]  # format version 2: readable, DATA
    implicit_control = b"\x02" + good["sos"][1:]
    other_version = b"\x03" + good["data"][1:]
    unknown_kind = good["data"][:1] + struct.pack(">B", 9) + good["data"][2:]
    cases = [
        (),
        ((HEADER_NAME, good["data"]),),
        ((HEADER_NAME, good["sos"]),),
        ((HEADER_NAME, good["eos"]),),
        ((HEADER_NAME, good["data"]), (HEADER_NAME, good["data"])),
        ((HEADER_NAME, None), (HEADER_NAME, good["data"])),
        ((HEADER_NAME, None),),
        ((HEADER_NAME, good["data"][:20]),),
        ((HEADER_NAME, good["data"] + b"\x00"),),
        ((HEADER_NAME, bad_type),),
        ((HEADER_NAME, bad_flag),),
        ((HEADER_NAME, implicit_segment),),
        ((HEADER_NAME, implicit_control),),
        ((HEADER_NAME, implicit_segment + b"\x00"),),
        ((HEADER_NAME, other_version),),
        ((HEADER_NAME, unknown_kind),),
        (("other", b"x"), (HEADER_NAME, good["data"])),
    ]
    records = [ConsumedRecord(COMPACTED, 0, i, NOW, b"k", b"v", headers) for i, headers in enumerate(cases)]
    rows = with_div_fields(spark.createDataFrame(kafka_rows(records), KAFKA_DDL)).orderBy("offset").collect()
    for record, row in zip(records, rows, strict=True):
        header = readable_div_header(record.headers)
        expected = (None, None) if header is None else (int(header.kind), header.guid.hex())
        assert (row["div_kind"], row["producer"]) == expected, record.headers
        entry = key_validation_of(record)
        if header is not None and header.kind == Kind.DATA:
            assert entry is not None and entry.producer == header.guid
