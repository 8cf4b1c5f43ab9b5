"""The reconcile job's Kafka reading: a consistent snapshot, read through Spark, on a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from kdiv.reconcile.kafka_source import (
    ARROW_SCHEMA,
    KAFKA_SCHEMA,
    KafkaReadError,
    KafkaSplit,
    plan_splits,
    read_split,
    read_topics,
    resolve_source,
    spark_kafka_available,
    spark_kafka_options,
)
from kdiv.reconcile.snapshot import PartitionRange, Snapshot, take_snapshot

pytestmark = pytest.mark.broker

PARTITIONS = 3
# (column, Spark SQL type) of Spark's kafka source with includeHeaders=true.
SPARK_KAFKA_COLUMNS = [
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
    ("headers", "array<struct<key:string,value:binary>>"),
]
BASE_TIMESTAMP_MS = 1_700_000_000_000


def produce(bootstrap: str, topic: str, count: int, *, first: int = 0) -> list[tuple]:
    """`count` records spread over PARTITIONS, with every shape a record can take: keyless,
    tombstones (value None), no headers, repeated header keys, header values None.
    Returns what was sent as (partition, key, value, timestamp_ms, headers or None)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            failed.append(f"{message.topic()}[{message.partition()}]: {error}")

    sent = []
    for i in range(first, first + count):
        partition = i % PARTITIONS
        key = None if i % 11 == 0 else b"key-%d" % (i % 17)
        value = None if i % 7 == 0 else b"value-%d" % i
        if i % 5 == 0:
            headers = None
        elif i % 5 == 1:
            headers = [("div", b"\x01" * 47), ("trace", None)]
        else:
            headers = [("n", b"%d" % i), ("n", b"again"), ("empty", b"")]
        timestamp = BASE_TIMESTAMP_MS + i
        producer.produce(
            topic, value=value, key=key, partition=partition, timestamp=timestamp, headers=headers,  # type: ignore[arg-type]  # None values are sent as null headers
            on_delivery=delivered,
        )  # fmt: skip
        sent.append((partition, key, value, timestamp, headers))
    # flush() counts undelivered records only: a record the broker refused is delivered with an error.
    assert producer.flush(30) == 0 and not failed, failed[:5]
    return sent


def confluent_read(bootstrap: str, ranges: tuple[PartitionRange, ...]) -> set[tuple]:
    """The records of `ranges` read with a bare confluent-kafka consumer, as `row_tuple`s."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    rows = set()
    try:
        for r in ranges:
            if r.end == r.start:
                continue
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
            deadline = time.monotonic() + 30
            last = r.start - 1
            while last < r.end - 1:
                assert time.monotonic() < deadline, f"{r.topic}[{r.partition}] stuck at offset {last + 1}"
                message = consumer.poll(1.0)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                last = message.offset()  # type: ignore[assignment]  # consumed records have offsets
                if last < r.end:
                    timestamp_type, timestamp = message.timestamp()
                    rows.add(
                        (
                            message.key(), message.value(), message.topic(), message.partition(), last,
                            timestamp, timestamp_type - 1, _headers(message.headers()),
                        )
                    )  # fmt: skip
            consumer.unassign()
    finally:
        consumer.close()
    return rows


def _headers(headers) -> tuple | None:
    return None if headers is None else tuple((k, None if v is None else bytes(v)) for k, v in headers)


def spark_rows(df) -> list[tuple]:
    """The DataFrame's rows as `row_tuple`s; timestamps as ms since the epoch (collect()
    would turn them into naive local datetimes)."""
    columns = [F.unix_millis("timestamp").alias("timestamp") if c == "timestamp" else c for c in df.columns]
    return [
        (
            None if row.key is None else bytes(row.key),
            None if row.value is None else bytes(row.value),
            row.topic, row.partition, row.offset, row.timestamp, row.timestampType,
            None if row.headers is None else tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers),
        )
        for row in df.select(*columns).collect()
    ]  # fmt: skip


def librdkafka(bootstrap: str) -> dict:
    return {"bootstrap.servers": bootstrap}


@pytest.fixture
def loaded_topic(bootstrap, topic_factory):
    """A 3-partition topic, its snapshot after 120 records, and 45 more records written after it."""
    topic = topic_factory(PARTITIONS)
    before = produce(bootstrap, topic, 120)
    snapshot = take_snapshot(bootstrap, [topic])
    after = produce(bootstrap, topic, 45, first=120)
    return topic, snapshot, before, after


def test_reads_exactly_the_snapshot_with_the_kafka_columns(spark, bootstrap, loaded_topic):
    topic, snapshot, before, after = loaded_topic
    assert [(r.partition, r.end - r.start) for r in snapshot.ranges] == [(0, 40), (1, 40), (2, 40)]

    df = read_topics(spark, snapshot, [topic], librdkafka=librdkafka(bootstrap), source="python")

    assert df.dtypes == SPARK_KAFKA_COLUMNS
    assert df.schema == KAFKA_SCHEMA
    rows = spark_rows(df)
    assert len(rows) == len(set(rows)) == 120 == snapshot.records_planned
    # The 45 records written after planning are on the broker, but not in the read.
    everything = {r.partition: PartitionRange(topic, r.partition, r.start, r.end + 15) for r in snapshot.ranges}
    assert len(confluent_read(bootstrap, tuple(everything.values()))) == 165
    assert set(rows) == confluent_read(bootstrap, snapshot.ranges)
    # And equal to what was written: offsets follow the produce order within a partition.
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    expected = set()
    for partition, key, value, timestamp, headers in before:
        expected.add((key, value, topic, partition, offsets[partition], timestamp, 0, _headers(headers)))
        offsets[partition] += 1
    assert set(rows) == expected
    # Every shape made it through: tombstones, keyless, headerless, null header values.
    assert any(r[1] is None for r in rows) and any(r[0] is None for r in rows)
    assert any(r[7] is None for r in rows)
    assert any(h == ("trace", None) for r in rows if r[7] for h in r[7])


def test_splitting_partitions_reads_the_same_rows_in_more_tasks(spark, bootstrap, loaded_topic):
    topic, snapshot, _, _ = loaded_topic
    whole = read_topics(spark, snapshot, [topic], librdkafka=librdkafka(bootstrap), source="python")
    split = read_topics(
        spark, snapshot, [topic], librdkafka=librdkafka(bootstrap), source="python", max_records_per_split=7
    )

    assert whole.rdd.getNumPartitions() == PARTITIONS
    assert split.rdd.getNumPartitions() == PARTITIONS * 6  # 40 offsets in ranges of at most 7
    split_rows = spark_rows(split)
    assert len(split_rows) == 120
    assert sorted(split_rows, key=repr) == sorted(spark_rows(whole), key=repr)
    latest = split.groupBy("key").agg(F.max("offset").alias("offset"), F.count("*").alias("n"))
    assert latest.agg(F.sum("n")).first()[0] == 120


def test_plan_splits_cover_each_range_once_without_overlap():
    ranges = (
        PartitionRange("a", 0, 10, 33),
        PartitionRange("a", 1, 5, 5),  # empty: no split
        PartitionRange("b", 0, 0, 4),
    )
    splits = plan_splits(ranges, 10)
    assert [(s.topic, s.partition, s.start, s.end) for s in splits] == [
        ("a", 0, 10, 17), ("a", 0, 17, 25), ("a", 0, 25, 33), ("b", 0, 0, 4),
    ]  # fmt: skip
    with pytest.raises(ValueError):
        plan_splits(ranges, 0)


def test_spark_s_kafka_source_reads_the_same_rows_as_kdiv_s(spark, bootstrap, loaded_topic):
    """The session has Spark's connector (`kdiv fetch-jars` cached it): auto picks it, and it reads
    the snapshot's offsets into the same rows, headers and timestamps included, as kdiv's source."""
    topic, snapshot, _, _ = loaded_topic
    assert spark_kafka_available(spark), "Spark's kafka connector is not in the session: run `kdiv fetch-jars`"
    assert resolve_source(spark, "auto") == "spark"

    auto = read_topics(spark, snapshot, [topic], librdkafka=librdkafka(bootstrap))
    plan = auto._jdf.queryExecution().optimizedPlan().toString()
    assert "KafkaRelation" in plan and "kdiv_kafka" not in plan, plan
    assert auto.dtypes == SPARK_KAFKA_COLUMNS
    python = read_topics(spark, snapshot, [topic], librdkafka=librdkafka(bootstrap), source="python")
    rows = spark_rows(auto)
    assert len(rows) == 120  # not the 45 written after the snapshot
    assert sorted(rows, key=repr) == sorted(spark_rows(python), key=repr)
    assert set(rows) == confluent_read(bootstrap, snapshot.ranges)
    assert any(r[7] is None for r in rows) and any(h == ("trace", None) for r in rows if r[7] for h in r[7])

    with pytest.raises(ValueError, match="source must be one of"):
        read_topics(spark, snapshot, [topic], librdkafka=librdkafka(bootstrap), source="jdbc")


def test_without_the_connector_auto_is_kdiv_s_source_and_forcing_spark_names_the_fetch_command(tmp_path):
    """A session started with no connector in the cache (KDIV_JARS_DIR empty): its own JVM."""
    script = """
import json
from kdiv.reconcile.kafka_source import SparkKafkaUnavailable, resolve_source
from kdiv.reconcile.session import build_session
spark = build_session("local[1]")
try:
    resolve_source(spark, "spark")
    forced = None
except SparkKafkaUnavailable as missing:
    forced = str(missing)
print(json.dumps({"auto": resolve_source(spark, "auto"), "forced": forced, "jars": spark.conf.get("spark.jars", "")}))
spark.stop()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env["KDIV_JARS_DIR"] = str(tmp_path)
    completed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    said = json.loads(completed.stdout.strip().splitlines()[-1])
    assert said["auto"] == "python" and said["jars"] == ""
    assert "spark-sql-kafka-0-10" in said["forced"] and "`kdiv fetch-jars`" in said["forced"], said
    assert str(tmp_path) in said["forced"] and "--kafka-source python" in said["forced"]


def test_a_transaction_marker_at_the_end_neither_stalls_nor_lets_later_records_in(spark, bootstrap, topic_factory):
    topic = topic_factory(1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4().hex}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=b"v%d" % i, key=b"k", partition=0)
    producer.commit_transaction(10)
    # Apache Kafka writes the commit marker after the commit returns: wait until it is there.
    deadline = time.monotonic() + 10
    while (snapshot := take_snapshot(bootstrap, [topic])).ranges[0].end < 6 and time.monotonic() < deadline:
        time.sleep(0.1)
    (planned,) = snapshot.ranges
    # The commit marker takes the last offset: no record sits at end - 1.
    assert planned.end == 6
    split = KafkaSplit(topic, 0, 0, planned.end)

    def offsets_read() -> list[int]:
        started = time.monotonic()
        batches = list(read_split(split, librdkafka(bootstrap), stall_timeout_s=20))
        assert time.monotonic() - started < 10  # ended by the end of the partition, not the stall timeout
        return [o for b in batches for o in b.column("offset").to_pylist()]

    assert offsets_read() == [0, 1, 2, 3, 4]
    # Records written after the snapshot come right after the gap, in the same fetch.
    later = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        later.produce(topic, value=b"later-%d" % i, partition=0)
    assert later.flush(30) == 0
    assert offsets_read() == [0, 1, 2, 3, 4]
    for source in ("python", "spark"):
        df = read_topics(spark, snapshot, [topic], librdkafka=librdkafka(bootstrap), source=source)
        assert sorted(r.offset for r in df.select("offset").collect()) == [0, 1, 2, 3, 4], source


def test_a_range_the_broker_cannot_deliver_fails_naming_topic_partition_and_offset(bootstrap, topic_factory):
    topic = topic_factory(1)
    produce_to_one_partition = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        produce_to_one_partition.produce(topic, value=b"v%d" % i, partition=0)
    assert produce_to_one_partition.flush(30) == 0

    # Planned beyond what the partition holds (as after an unclean truncation).
    with pytest.raises(KafkaReadError) as raised:
        list(read_split(KafkaSplit(topic, 0, 0, 10), librdkafka(bootstrap), stall_timeout_s=2))
    message = str(raised.value)
    assert f"{topic}[0]" in message
    assert "next offset 3" in message and "planned end 10" in message
    assert "the broker reports its end at 3" in message


def test_missing_and_empty_topics_read_as_empty_frames_with_the_schema(spark, bootstrap, topic_factory):
    empty = topic_factory(2)
    absent = f"kdiv-absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(LookupError, match=absent):
        take_snapshot(bootstrap, [empty, absent])

    snapshot = take_snapshot(bootstrap, [empty, absent], missing_ok=[absent], clock_ms=lambda: 1234)
    assert snapshot.taken_at_ms == 1234
    assert snapshot.topics == (empty,)
    assert snapshot.missing == (absent,)
    assert snapshot.records_planned == 0
    df = read_topics(spark, snapshot, [empty, absent], librdkafka=librdkafka(bootstrap), source="python")
    assert df.schema == KAFKA_SCHEMA
    assert df.count() == 0
    with pytest.raises(LookupError, match="never-planned"):
        read_topics(spark, snapshot, ["never-planned"], librdkafka=librdkafka(bootstrap))


def test_snapshot_json_round_trip():
    snapshot = Snapshot(
        1_700_000_000_123,
        (PartitionRange("orders", 0, 0, 10), PartitionRange("orders", 1, 4, 4), PartitionRange("päyments", 0, 7, 9)),
        ("gone",),
    )
    again = Snapshot.from_json(snapshot.to_json())
    assert again == snapshot
    assert again.topics == ("orders", "päyments")
    assert again.ranges_of("orders") == snapshot.ranges[:2]
    assert again.records_planned == 12
    with pytest.raises(ValueError, match="not a kdiv snapshot"):
        Snapshot.from_json('{"taken_at_ms": 1}')
    with pytest.raises(ValueError):
        PartitionRange("orders", 0, 5, 4)


def test_arrow_schema_is_the_one_spark_expects_for_the_kafka_columns():
    assert ARROW_SCHEMA.equals(to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"))


def test_librdkafka_security_maps_to_spark_kafka_options(tmp_path):
    certificate, key = tmp_path / "client.pem", tmp_path / "client.key"
    certificate.write_text("CERT")
    key.write_text("KEY")
    options = spark_kafka_options(
        {
            "bootstrap.servers": "b1:9093",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "kdiv",
            "sasl.password": 'p"w',
            "ssl.endpoint.identification.algorithm": "none",
            "ssl.ca.location": "/etc/ca.pem",
            "ssl.certificate.location": str(certificate),
            "ssl.key.location": str(key),
            "fetch.max.bytes": 1_000_000,
        }
    )
    assert options == {
        "kafka.bootstrap.servers": "b1:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": (
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="kdiv" password="p\\"w";'
        ),
        "kafka.ssl.endpoint.identification.algorithm": "",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.certificate.chain": "CERT",
        "kafka.ssl.keystore.key": "KEY",
    }
    with pytest.raises(ValueError, match="isolation.level"):
        spark_kafka_options({"bootstrap.servers": "b1:9092", "isolation.level": "read_committed"})
