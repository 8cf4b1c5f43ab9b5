"""Reading a planned `Snapshot` of Kafka topics into a Spark DataFrame.

Two sources give the same columns, in the same order, with the same types (those of Spark's
built-in kafka source with includeHeaders=true, `KAFKA_SCHEMA`):

- "spark": Spark's own kafka source (the spark-sql-kafka-0-10 jar), given the snapshot's
  offsets explicitly;
- "python": `KdivKafkaDataSource` ("kdiv_kafka"), a Python data source reading with
  confluent-kafka (librdkafka) on the executors, for clusters without the jar.

Either way only the snapshot's offsets are read: records written after it was planned are
not, however long the job runs.

The data source's options:

- ``snapshot``: `Snapshot.to_json()`;
- ``topics``: JSON list of the topics to read (default: every topic of the snapshot);
- ``librdkafka.<property>``: one librdkafka property each (``bootstrap.servers`` and the
  security settings of `kdiv.config.security.KafkaSecurity.librdkafka_config`). One option per
  property, not one JSON blob, so that wherever Spark shows options its redaction (of
  names matching "password") hides the secrets. ``librdkafka`` (a JSON object) is accepted
  as well;
- ``maxRecordsPerSplit``: offsets per input partition (default 500 000): a Kafka
  partition larger than that is read by several tasks, each an offset range;
- ``batchRecords``: records per consume() call and Arrow batch (default 10 000);
- ``stallTimeoutSeconds``: how long a reader waits without progress before failing (30).

Executors import this module, so it imports neither aiokafka nor kdiv's app at module level.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import json
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kdiv.reconcile.snapshot import PartitionRange, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "kdiv_kafka"
SOURCES = ("auto", "python", "spark")
SPARK_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

DEFAULT_MAX_RECORDS_PER_SPLIT = 500_000
DEFAULT_BATCH_RECORDS = 10_000
DEFAULT_STALL_TIMEOUT_S = 30.0

# Spark's kafka source schema (KafkaRecordToRowConverter) with includeHeaders=true; every
# field nullable, as there.
HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
)
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
        StructField("headers", HEADERS_TYPE, True),
    ]
)
KAFKA_COLUMNS = tuple(KAFKA_SCHEMA.fieldNames())

# What Spark expects back from a Python reader for KAFKA_SCHEMA (it checks the first batch
# against to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")).
_ARROW_HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", _ARROW_HEADERS_TYPE),
    ]
)

# Consumer settings for reading a fixed offset range as fast as possible. Callers'
# librdkafka properties override them, except those in _READER_FIXED.
READER_CONSUMER_DEFAULTS: dict[str, Any] = {
    # One partition per consumer: let a fetch bring a lot of it.
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    # librdkafka prefetches until either limit; a deep queue keeps the broker busy while
    # Python builds Arrow batches.
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 256 * 1024,
    # A bounded read has nothing to wait for at the end of the data: a fetch that finds
    # nothing should come back at once (not 0: Tansu then answers with no partitions).
    "fetch.wait.max.ms": 10,
    # The planned start must still exist: silently jumping elsewhere would hide loss.
    "auto.offset.reset": "error",
}
_READER_FIXED: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # The end-of-partition event tells a reader that the last planned offsets were gaps.
    "enable.partition.eof": True,
}
_POLL_TIMEOUT_S = 1.0
# Errors saying the wanted offset is not in the log: with auto.offset.reset=error librdkafka
# reports _AUTO_OFFSET_RESET (-140); OFFSET_OUT_OF_RANGE (1) is the broker's own.
_OUT_OF_RANGE = frozenset({-140, 1})
# librdkafka timestamp types (NOT_AVAILABLE 0, CREATE_TIME 1, LOG_APPEND_TIME 2) minus this
# are Kafka's own ids (-1, 0, 1), which Spark's source reports.
_TIMESTAMP_TYPE_SHIFT = 1

# librdkafka properties with no counterpart for Spark's (Java) consumer: reading tuning.
_LIBRDKAFKA_ONLY = frozenset(
    {
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "fetch.wait.max.ms",
        "fetch.min.bytes",
        "client.id",
        "socket.keepalive.enable",
        "statistics.interval.ms",
        "debug",
        "log_level",
    }
)
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaReadError(RuntimeError):
    """A planned offset range could not be read."""


class SparkKafkaUnavailable(RuntimeError):
    """Spark's kafka source was asked for, but its jar is not on the classpath."""


# -- planning -------------------------------------------------------------------------------


class KafkaSplit(InputPartition):
    """One input partition: offsets [start, end) of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaSplit({self.topic}[{self.partition}] offsets [{self.start}, {self.end}))"


def plan_splits(ranges: Iterable[PartitionRange], max_records_per_split: int) -> list[KafkaSplit]:
    """One split per non-empty range, ranges larger than `max_records_per_split` cut into
    equal offset ranges. Offsets, not records: compaction gaps make some splits lighter."""
    if max_records_per_split < 1:
        raise ValueError(f"max_records_per_split must be at least 1, got {max_records_per_split}")
    splits: list[KafkaSplit] = []
    for r in ranges:
        size = r.end - r.start
        if size <= 0:
            continue
        pieces = -(-size // max_records_per_split)
        bounds = [r.start + size * i // pieces for i in range(pieces + 1)]
        splits.extend(KafkaSplit(r.topic, r.partition, lo, hi) for lo, hi in itertools.pairwise(bounds))
    return splits


# -- the Python data source ------------------------------------------------------------------


class KdivKafkaDataSource(DataSource):
    """Batch reads of a planned snapshot with confluent-kafka. See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if schema != KAFKA_SCHEMA:
            raise ValueError(
                f"the {SOURCE_NAME} source has a fixed schema {KAFKA_SCHEMA.simpleString()}, "
                f"got {schema.simpleString()}"
            )
        return KdivKafkaReader(self.options)


class KdivKafkaReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        if "snapshot" not in options:
            raise ValueError(f"the {SOURCE_NAME} source needs the 'snapshot' option (Snapshot.to_json())")
        snapshot = Snapshot.from_json(options["snapshot"])
        topics = set(json.loads(options["topics"])) if options.get("topics") else set(snapshot.topics)
        self.ranges = tuple(r for r in snapshot.ranges if r.topic in topics)
        self.librdkafka = librdkafka_from_options(options)
        if "bootstrap.servers" not in self.librdkafka:
            raise ValueError(f"the {SOURCE_NAME} source needs the 'librdkafka.bootstrap.servers' option")
        self.max_records_per_split = int(options.get("maxRecordsPerSplit", DEFAULT_MAX_RECORDS_PER_SPLIT))
        self.batch_records = int(options.get("batchRecords", DEFAULT_BATCH_RECORDS))
        self.stall_timeout_s = float(options.get("stallTimeoutSeconds", DEFAULT_STALL_TIMEOUT_S))

    def partitions(self) -> list[InputPartition]:
        return [*plan_splits(self.ranges, self.max_records_per_split)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no splits at all Spark still runs one task, with InputPartition(None).
        if not isinstance(partition, KafkaSplit):
            return iter(())
        return read_split(
            partition,
            self.librdkafka,
            batch_records=self.batch_records,
            stall_timeout_s=self.stall_timeout_s,
        )


def librdkafka_from_options(options: Mapping[str, str]) -> dict[str, str]:
    config = dict(json.loads(options["librdkafka"])) if options.get("librdkafka") else {}
    prefix = "librdkafka."
    for name, value in options.items():
        if name.lower().startswith(prefix):
            config[name[len(prefix) :].lower()] = value
    return config


def librdkafka_options(librdkafka: Mapping[str, Any]) -> dict[str, str]:
    """The data source options carrying `librdkafka`, one per property."""
    return {f"librdkafka.{name}": _librdkafka_value(value) for name, value in librdkafka.items()}


def _librdkafka_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- reading one split (on an executor) -------------------------------------------------------


def read_split(
    split: KafkaSplit,
    librdkafka: Mapping[str, Any],
    *,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
) -> Iterator[pa.RecordBatch]:
    """The records of `split` as Arrow batches of `ARROW_SCHEMA`, in offset order.

    Stops at the first record at or past the end, at an end-of-partition event at or past
    it, or when the consumer's position reaches it (compaction and transaction markers
    leave offset gaps, so the last planned offset may hold no record). Records deleted since
    the snapshot are skipped: the split reads on from the partition's log start.
    """
    if split.start >= split.end:
        return
    reader = _SplitReader(split, librdkafka, batch_records, stall_timeout_s)
    try:
        while not reader.done:
            batch = reader.poll()
            if batch is not None:
                yield batch
    finally:
        reader.close()


class _SplitReader:
    """One consumer reading one split, a consume() call at a time."""

    def __init__(
        self, split: KafkaSplit, librdkafka: Mapping[str, Any], batch_records: int, stall_timeout_s: float
    ) -> None:
        # Deferred so that planning (which imports this module) does not load librdkafka.
        from confluent_kafka import Consumer, TopicPartition

        self.split = split
        self.batch_records = batch_records
        self.stall_timeout_s = stall_timeout_s
        self.next_offset = split.start
        self.done = False
        self.broker_end: int | None = None  # high watermark seen in an end-of-partition event
        self.last_progress = time.monotonic()
        self.client_errors: list[str] = []
        self.where = f"{split.topic}[{split.partition}]"
        self._topic_partition = TopicPartition(split.topic, split.partition)
        config = {
            **READER_CONSUMER_DEFAULTS,
            **librdkafka,
            "group.id": f"kdiv-reconcile-{uuid.uuid4().hex}",
            **_READER_FIXED,
            # Connection-level errors (broker down, authentication) arrive here, not as
            # messages, and librdkafka keeps retrying: kept for the stall error.
            "error_cb": lambda error: self.client_errors.append(str(error)),
        }
        self.consumer = Consumer(config)
        self.consumer.assign([TopicPartition(split.topic, split.partition, split.start)])

    def poll(self) -> pa.RecordBatch | None:
        """The next batch (None when this poll brought no record); sets `done` at the end."""
        # The collector is off while a batch is consumed and converted: every record brings
        # tuples (timestamp, headers) whose allocations trigger collections that traverse
        # every live Message, costing several times the conversion itself. Nothing here
        # makes reference cycles, so nothing is left for the collector to find.
        collecting = gc.isenabled()
        gc.disable()
        try:
            batch = self._consume_batch()
        finally:
            if collecting:
                gc.enable()
        if batch is not None:
            self.last_progress = time.monotonic()
        elif not self.done and time.monotonic() - self.last_progress > self.stall_timeout_s:
            raise KafkaReadError(self._stall_message())
        return batch

    def _consume_batch(self) -> pa.RecordBatch | None:
        from confluent_kafka import Message

        end = self.split.end
        # Asking for no more than the range holds lets consume() return as soon as the last
        # record arrives, instead of waiting out its timeout for a full batch.
        wanted = max(1, min(self.batch_records, end - self.next_offset))
        messages = self.consumer.consume(num_messages=wanted, timeout=_POLL_TIMEOUT_S)
        if messages and any(map(Message.error, messages)):
            messages = self._without_events(messages)
        if not messages:
            (position,) = self.consumer.position([self._topic_partition])
            self.done = self.done or position.offset >= end
            return None
        # Consumed records always have an offset (only produced, unsent ones lack one).
        offsets: list[int] = [message.offset() for message in messages]  # type: ignore[misc]
        if offsets[-1] >= end - 1:
            self.done = True
            if offsets[-1] >= end:  # records written after the snapshot
                cut = bisect.bisect_left(offsets, end)
                messages, offsets = messages[:cut], offsets[:cut]
                if not messages:
                    return None
        self.next_offset = offsets[-1] + 1
        return record_batch(messages, offsets, self.split.topic, self.split.partition)

    def _without_events(self, messages: list) -> list:
        from confluent_kafka import KafkaError

        records = []
        for message in messages:
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - confluent-kafka's public name
                self.broker_end = message.offset()
                self.done = self.done or self.broker_end >= self.split.end
            elif error.code() in _OUT_OF_RANGE and self._skip_deleted():
                # The rest of this batch was fetched before the jump: none of it is wanted.
                return records
            else:
                raise KafkaReadError(
                    f"reading {self.where} at offset {self.next_offset} "
                    f"(planned [{self.split.start}, {self.split.end})): {error.str()}"
                )
        return records

    def _skip_deleted(self) -> bool:
        """After an out-of-range answer: when the records at the next offset were deleted since
        the snapshot (the log now starts past it), read on from the log start and return True.
        The job reports what was skipped (kdiv.reconcile.vanished); anything else is no
        deletion and stays an error."""
        from confluent_kafka import TopicPartition

        low, _high = self.consumer.get_watermark_offsets(
            self._topic_partition, timeout=self.stall_timeout_s, cached=False
        )
        if low <= self.next_offset:
            return False
        self.next_offset = min(low, self.split.end)
        self.done = self.next_offset >= self.split.end
        if not self.done:
            self.consumer.assign([TopicPartition(self.split.topic, self.split.partition, self.next_offset)])
        self.last_progress = time.monotonic()
        return True

    def _stall_message(self) -> str:
        details = [f"next offset {self.next_offset}, planned end {self.split.end}"]
        if self.broker_end is not None:
            details.append(f"the broker reports its end at {self.broker_end}")
        if self.client_errors:
            details.append(f"last client error: {self.client_errors[-1]}")
        return f"no progress reading {self.where} for {self.stall_timeout_s:.0f} s ({'; '.join(details)})"

    def close(self) -> None:
        self.consumer.close()


def record_batch(messages: list, offsets: list[int], topic: str, partition: int) -> pa.RecordBatch:
    """`messages` (confluent-kafka Messages of one partition) as one batch of ARROW_SCHEMA."""
    from confluent_kafka import Message

    count = len(messages)
    # map() over the C methods: no Python bytecode per record.
    timestamp_types, timestamps_ms = zip(*map(Message.timestamp, messages), strict=False)
    timestamp_type_ids = pa.array(timestamp_types, pa.int32())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(list(map(Message.key, messages)), pa.binary()),
            pa.array(list(map(Message.value, messages)), pa.binary()),
            pa.array([topic] * count, pa.string()),
            pa.array([partition] * count, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps_ms, pa.timestamp("ms", tz="UTC")).cast(ARROW_SCHEMA.field("timestamp").type),
            _shift(timestamp_type_ids, _TIMESTAMP_TYPE_SHIFT),
            # None (no headers) becomes null, as in Spark's source.
            pa.array(list(map(Message.headers, messages)), _ARROW_HEADERS_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )


def _shift(values: pa.Int32Array, by: int) -> pa.Int32Array:
    return pc.subtract(values, pa.scalar(by, pa.int32()))


# -- choosing and using a source (driver) -----------------------------------------------------


def spark_kafka_available(spark: SparkSession) -> bool:
    """True when Spark's kafka source (the spark-sql-kafka-0-10 jar) is on the classpath."""
    try:
        jvm: Any = spark.sparkContext._jvm  # noqa: SLF001 - no public way to probe a class
        jvm.org.apache.spark.util.Utils.classForName(SPARK_KAFKA_PROVIDER, False, False)
    except Exception:  # noqa: BLE001 - ClassNotFoundException via py4j, or no JVM at all (Spark Connect)
        return False
    return True


def resolve_source(spark: SparkSession, source: str) -> str:
    """ "python" or "spark": what `source` ("auto", "python", "spark") means on `spark`."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "auto":
        return "spark" if spark_kafka_available(spark) else "python"
    if source == "spark" and not spark_kafka_available(spark):
        from kdiv.reconcile.connector import why_missing

        raise SparkKafkaUnavailable(
            f"Spark's kafka source ({SPARK_KAFKA_PROVIDER}, the spark-sql-kafka-0-10 jar) is not on the "
            f"classpath: {why_missing()}; or use --kafka-source python"
        )
    return source


def read_topics(
    spark: SparkSession,
    snapshot: Snapshot,
    topics: Iterable[str],
    *,
    librdkafka: Mapping[str, Any],
    source: str = "auto",
    max_records_per_split: int = DEFAULT_MAX_RECORDS_PER_SPLIT,
    batch_records: int = DEFAULT_BATCH_RECORDS,
) -> DataFrame:
    """The snapshot's records of `topics` as a DataFrame of `KAFKA_SCHEMA`.

    `librdkafka`: bootstrap.servers plus the security properties (KafkaSecurity
    .librdkafka_config()). `source`: "python" (kdiv's data source), "spark" (Spark's own
    kafka source; needs its jar), or "auto" (Spark's when its jar is there).
    `max_records_per_split` and `batch_records` apply to the python source only.
    A topic the snapshot does not cover raises LookupError; one planned as missing
    (`missing_ok`) reads as no records.
    """
    if isinstance(topics, str):
        topics = [topics]
    topics = list(dict.fromkeys(topics))
    unplanned = [t for t in topics if t not in snapshot.topics and t not in snapshot.missing]
    if unplanned:
        raise LookupError(
            f"topic(s) {', '.join(map(repr, unplanned))} are not in the snapshot "
            f"(planned: {', '.join(snapshot.topics) or 'none'})"
        )
    source = resolve_source(spark, source)
    if "bootstrap.servers" not in librdkafka:
        raise ValueError("librdkafka config lacks bootstrap.servers")

    wanted = snapshot.only(topics)
    if not any(r.end > r.start for r in wanted.ranges):
        return spark.createDataFrame([], KAFKA_SCHEMA)
    if source == "spark":
        return _read_with_spark_source(spark, wanted, librdkafka)
    register_source(spark)
    return (
        spark.read.format(SOURCE_NAME)
        .option("snapshot", wanted.to_json())
        .option("topics", json.dumps(topics))
        .option("maxRecordsPerSplit", str(max_records_per_split))
        .option("batchRecords", str(batch_records))
        .options(**librdkafka_options(librdkafka))
        .load()
    )


# Sessions "kdiv_kafka" is registered with: registering again works, but Spark warns each time
# that it replaced a registered data source, which reads as a problem where there is none.
_REGISTERED_WITH: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register_source(spark: SparkSession) -> None:
    """Make "kdiv_kafka" usable in spark.read.format(...), once per session."""
    if spark in _REGISTERED_WITH:
        return
    spark.dataSource.register(KdivKafkaDataSource)
    _REGISTERED_WITH.add(spark)


def _read_with_spark_source(spark: SparkSession, snapshot: Snapshot, librdkafka: Mapping[str, Any]) -> DataFrame:
    ranges = [r for r in snapshot.ranges if r.end > r.start]
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    reader = (
        spark.read.format("kafka")
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        # As the python source (librdkafka's default) and the worker read: records of aborted
        # transactions are not in the topic (a Java consumer reads them by default).
        .option("kafka.isolation.level", "read_committed")
        # Records deleted since the snapshot (DeleteRecords, retention) are skipped, not a
        # failure of the whole job: the job reports them (kdiv.reconcile.vanished).
        .option("failOnDataLoss", "false")
    )
    for name, value in spark_kafka_options(librdkafka).items():
        reader = reader.option(name, value)
    return reader.load().select(*KAFKA_COLUMNS)


def spark_kafka_options(librdkafka: Mapping[str, Any]) -> dict[str, str]:
    """librdkafka connection and security properties as Spark kafka source options
    (``kafka.``-prefixed Java client properties). Raises ValueError for a property with
    no sensible counterpart, rather than connect differently than the python source."""
    config = {name: _librdkafka_value(value) for name, value in librdkafka.items()}
    options: dict[str, str] = {}
    protocol = config.pop("security.protocol", "PLAINTEXT").upper()
    options["kafka.bootstrap.servers"] = config.pop("bootstrap.servers")
    options["kafka.security.protocol"] = protocol
    mechanism = config.pop("sasl.mechanism", config.pop("sasl.mechanisms", "PLAIN")).upper()
    username, password = config.pop("sasl.username", None), config.pop("sasl.password", None)
    if protocol.startswith("SASL_"):
        if mechanism not in _JAAS_MODULES:
            raise ValueError(f"SASL mechanism {mechanism} has no mapping to Spark's kafka source")
        options["kafka.sasl.mechanism"] = mechanism
        options["kafka.sasl.jaas.config"] = (
            f'{_JAAS_MODULES[mechanism]} required username="{_jaas_escape(username or "")}" '
            f'password="{_jaas_escape(password or "")}";'
        )
    identification = config.pop("ssl.endpoint.identification.algorithm", None)
    if identification is not None:
        # librdkafka says "none"; the Java client wants an empty string.
        options["kafka.ssl.endpoint.identification.algorithm"] = "" if identification == "none" else identification
    ca = config.pop("ssl.ca.location", None)
    if ca:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = ca
    certificate, key = config.pop("ssl.certificate.location", None), config.pop("ssl.key.location", None)
    key_password = config.pop("ssl.key.password", None)
    if certificate and key:
        # The Java client takes a PEM key store as contents, not as two file names.
        options["kafka.ssl.keystore.type"] = "PEM"
        options["kafka.ssl.keystore.certificate.chain"] = _read_text(certificate)
        options["kafka.ssl.keystore.key"] = _read_text(key)
        if key_password:
            options["kafka.ssl.key.password"] = key_password
    unmapped = sorted(name for name in config if name not in _LIBRDKAFKA_ONLY)
    if unmapped:
        raise ValueError(
            f"librdkafka properties {', '.join(unmapped)} have no mapping to Spark's kafka source; "
            "use the python source or drop them"
        )
    return options


def _jaas_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()
