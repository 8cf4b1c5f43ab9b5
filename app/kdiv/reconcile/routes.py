"""Pipeline routes at rest, the nightly QoS check: every traced record of the routes' snapshot
(and of their file sinks) judged by the live audit's rules, `kdiv.trace.judge.judge_at_rest`.

1. The driver reads the hop groups' committed offsets (`fetch_committed`) before the snapshot
   is planned. A processor writes its output before it commits its input, so the output of
   every record committed by then lies inside the sink's snapshot: a record committed past
   and absent from it is lost, not late. The job saves them beside the snapshot
   (route_offsets.json): a rerun on the snapshot judges against the same offsets.
2. On the executors, `ExtractTask` (mapInArrow) turns each traced record into one observation
   row per route it is on (route, trace id, stage, position, timestamps). Spark drops the
   untraced records first, so Python sees only the sample that is traced.
3. The observations are repartitioned and sorted by (route, trace id); `JudgeTask` (mapInArrow)
   judges each task's traces, whole ones at a time, with `judge_at_rest`, and yields a row per
   fault (LOST, DUPLICATED) and, at its end, its counts per route, hop and outcome.
4. The driver collects Spark's aggregates of the counts; the faults become the report's
   findings (ROUTE_LOST, ROUTE_DUPLICATED) without passing through it.

File sinks (`parquet:PATH`, `avro:PATH`, kdiv.trace.routes) are read with Spark's own readers
as they are when the job runs: files have no offsets to snapshot. A record there carries its
trace in a `headers` column shaped as Spark's kafka source gives it (array<struct<key:string,
value:binary>>, as a Spark job archiving a topic with includeHeaders writes it) or in a binary
`kdiv_trace` column. Its position is its `partition` and `offset` columns when it has both (the
archived record's); else its file and row number (Parquet only: Spark numbers no other rows).

Executors import this module: aiokafka and kdiv's Kafka plumbing are imported where the
driver uses them, not here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kdiv.clock import wall_clock_ms
from kdiv.reconcile.findings import COPY_TYPE, ROUTE_REPORT_FIELDS
from kdiv.trace.header import TRACE_HEADER, TraceHeaderError, TraceStamp, decode_trace, find_trace
from kdiv.trace.judge import PENDING, Observation, TraceOutcome, TraceVerdict, judge_at_rest
from kdiv.trace.routes import FileSink, Route, stage_map

if TYPE_CHECKING:
    from kdiv.config.security import KafkaSecurity

_OFFSETS_FORMAT_VERSION = 1

# Spark's reader of Avro files: the spark-avro package's, or (Spark 4) Spark SQL's own. Named
# by class, as Spark 4 ships the class without registering the short name "avro".
AVRO_FILE_FORMAT = "org.apache.spark.sql.avro.AvroFileFormat"
# The binary column an archive may carry the trace header's value in, instead of `headers`.
TRACE_COLUMN = "kdiv_trace"

# Row kinds of the executors' output.
OBSERVATION, HEADER_ERROR = "observation", "header_error"
FAULT, COUNT = "fault", "count"
# Count rows: per route (hop ROUTE_LEVEL) the judge's counts per outcome and the traces
# (TRACED); per hop the verdicts it is named in, the traces pending on it, and per stage the
# traces seen there (SEEN, hop = stage).
ROUTE_LEVEL = -1
TRACED, SEEN = "TRACED", "SEEN"
FAULT_OUTCOMES = (TraceOutcome.LOST.value, TraceOutcome.DUPLICATED.value)
# The outcomes a hop reports, in the order the report shows them.
HOP_OUTCOMES = (TraceOutcome.DELIVERED.value, TraceOutcome.LOST.value, TraceOutcome.DUPLICATED.value, PENDING)


class FileSinkError(ValueError):
    """A route's file sink cannot be read, or its records do not say where their trace is."""


# -- committed offsets (driver) ------------------------------------------------------------------


@dataclass(frozen=True)
class CommittedOffsets:
    """The hop groups' committed offsets, as read before the snapshot."""

    taken_at_ms: int
    # (group, topic, partition) -> committed offset (the next one the group reads).
    offsets: Mapping[tuple[str, str, int], int]
    # The hop groups the cluster knew then; the others have committed nothing.
    known_groups: frozenset[str]

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _OFFSETS_FORMAT_VERSION,
                "taken_at_ms": self.taken_at_ms,
                "known_groups": sorted(self.known_groups),
                "offsets": [[g, t, p, o] for (g, t, p), o in sorted(self.offsets.items())],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> CommittedOffsets:
        """Raises ValueError naming `where` when `text` is not a saved set of offsets."""
        try:
            data = json.loads(text)
            if data["version"] != _OFFSETS_FORMAT_VERSION:
                raise ValueError(f"format version {data['version']!r} is unknown (expected {_OFFSETS_FORMAT_VERSION})")
            offsets = {(str(g), str(t), int(p)): int(o) for g, t, p, o in data["offsets"]}
            return cls(int(data["taken_at_ms"]), offsets, frozenset(str(g) for g in data["known_groups"]))
        except KeyError as missing:
            raise ValueError(f"{where}: not saved committed offsets: no {missing} field") from None
        except (json.JSONDecodeError, TypeError, ValueError) as bad:
            raise ValueError(f"{where}: not saved committed offsets: {bad}") from None


async def fetch_committed(
    bootstrap: str,
    routes: Sequence[Route],
    partitions: Mapping[str, int],
    *,
    security: KafkaSecurity | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> CommittedOffsets:
    """The committed offsets of every hop group on the partitions its hops read.

    The partitions are named: a whole-group OffsetFetch is more than some brokers answer
    (Tansu). A group the cluster does not list has committed nothing: its traces are pending."""
    from aiokafka.admin import AIOKafkaAdminClient

    from kdiv.config.security import PLAINTEXT
    from kdiv.kafka.committed import read_committed

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="kdiv-reconcile-routes",
        **(security or PLAINTEXT).aiokafka_kwargs(),
    )
    await admin.start()
    try:
        listed, offsets = await read_committed(admin, routes, partitions)
        taken_at_ms = clock_ms()
    finally:
        await admin.close()
    hop_groups = {hop.group for route in routes for hop in route.hops}
    return CommittedOffsets(taken_at_ms, offsets, listed & hop_groups)


# -- reading: records and files to the executors' input ------------------------------------------

# What ExtractTask reads: the records' positions and trace headers. `trace_headers` holds only
# the kdiv-trace headers of a Kafka record; `trace` an archive's kdiv_trace value. `partition`
# and `offset` are null for an archive record positioned by `file` and `row`.
_EXTRACT_INPUT = (
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "key",
    "trace_headers",
    "trace",
    "file",
    "row",
    "archived_topic",
)


def _trace_headers(headers: Column) -> Column:
    return F.filter(headers, lambda h: h["key"] == TRACE_HEADER)


def kafka_inputs(records: DataFrame) -> DataFrame:
    """The traced records of `records` (KAFKA_SCHEMA) as ExtractTask's input."""
    traced = records.where(F.exists("headers", lambda h: h["key"] == TRACE_HEADER))
    return traced.select(
        F.col("topic"),
        F.col("partition").cast("long").alias("partition"),
        F.col("offset"),
        F.unix_millis("timestamp").alias("timestamp_ms"),
        F.col("key"),
        _trace_headers(F.col("headers")).alias("trace_headers"),
        F.lit(None).cast("binary").alias("trace"),
        F.lit(None).cast("string").alias("file"),
        F.lit(None).cast("long").alias("row"),
        F.lit(None).cast("string").alias("archived_topic"),
    )


@dataclass(frozen=True)
class FileInput:
    """A file sink read: its traced records as ExtractTask's input, and how they are positioned."""

    sink: FileSink
    records: DataFrame
    # True: by file and row number; False: by the archived records' partition and offset.
    by_row: bool
    # The archive's records name their topic: one archive may hold several topics' records.
    names_topics: bool


_INTEGRAL = (ShortType, IntegerType, LongType)


def _is_headers_type(data_type) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    return [(f.name, f.dataType) for f in data_type.elementType.fields] == [
        ("key", StringType()),
        ("value", BinaryType()),
    ]


def read_file_sink(spark: SparkSession, route: str, sink: FileSink) -> FileInput:
    """The traced records of a file sink; FileSinkError naming the route and the sink when its
    files cannot be read, or do not say where their trace is."""
    what = f"route {route!r}: file sink {sink.name!r}"
    reader_format = _reader_format(spark, what, sink)
    try:
        files = spark.read.format(reader_format).load(sink.path)
    except AnalysisException as unreadable:
        # Spark's message goes on with the query plan: its first line says what is wrong.
        lines = str(unreadable).strip().splitlines() or [type(unreadable).__name__]
        raise FileSinkError(f"{what}: cannot read {sink.path}: {lines[0]}") from None
    types = {f.name: f.dataType for f in files.schema.fields}
    if TRACE_COLUMN in types:
        if types[TRACE_COLUMN] != BinaryType():
            raise FileSinkError(
                f"{what}: column {TRACE_COLUMN} is {types[TRACE_COLUMN].simpleString()}, not binary "
                "(the kdiv-trace header's value)"
            )
        traced = files.where(F.col(TRACE_COLUMN).isNotNull())
        trace_headers, trace = F.lit(None).cast("array<struct<key:string,value:binary>>"), F.col(TRACE_COLUMN)
    elif "headers" in types:
        if not _is_headers_type(types["headers"]):
            raise FileSinkError(
                f"{what}: column headers is {types['headers'].simpleString()}, not "
                "array<struct<key:string,value:binary>> (Spark's kafka source with includeHeaders)"
            )
        traced = files.where(F.exists("headers", lambda h: h["key"] == TRACE_HEADER))
        trace_headers, trace = _trace_headers(F.col("headers")), F.lit(None).cast("binary")
    else:
        raise FileSinkError(
            f"{what}: its records carry no trace: no headers column (array<struct<key:string,value:binary>>, "
            f"as Spark's kafka source gives it) and no binary {TRACE_COLUMN} column; columns: "
            + ", ".join(sorted(types))
        )
    by_row = not (isinstance(types.get("partition"), _INTEGRAL) and isinstance(types.get("offset"), _INTEGRAL))
    if by_row and sink.format != "parquet":
        raise FileSinkError(
            f"{what}: its records have no partition and offset columns (the archived records' positions), "
            "and Spark numbers the rows of Parquet files only"
        )
    row = F.col("_metadata.row_index") if sink.format == "parquet" else F.lit(None).cast("long")
    names_topics = types.get("topic") == StringType()
    timestamp = (
        F.unix_millis("timestamp") if isinstance(types.get("timestamp"), TimestampType) else F.lit(None).cast("long")
    )
    records = traced.select(
        F.lit(sink.name).alias("topic"),
        (F.lit(None) if by_row else F.col("partition")).cast("long").alias("partition"),
        (F.lit(None) if by_row else F.col("offset")).cast("long").alias("offset"),
        timestamp.alias("timestamp_ms"),
        (F.col("key") if types.get("key") == BinaryType() else F.lit(None).cast("binary")).alias("key"),
        trace_headers.alias("trace_headers"),
        trace.alias("trace"),
        F.col("_metadata.file_path").alias("file"),
        row.cast("long").alias("row"),
        (F.col("topic") if names_topics else F.lit(None).cast("string")).alias("archived_topic"),
    )
    return FileInput(sink, records, by_row, names_topics)


def _reader_format(spark: SparkSession, what: str, sink: FileSink) -> str:
    if sink.format == "parquet":
        return "parquet"
    if not _jvm_class_available(spark, AVRO_FILE_FORMAT):
        raise FileSinkError(
            f"{what}: Spark's Avro reader ({AVRO_FILE_FORMAT}) is not on the classpath: add the spark-avro "
            f"package matching this Spark (spark.jars.packages=org.apache.spark:spark-avro_2.13:{spark.version})"
        )
    return AVRO_FILE_FORMAT


def _jvm_class_available(spark: SparkSession, name: str) -> bool:
    try:
        jvm: Any = spark.sparkContext._jvm  # noqa: SLF001 - no public way to probe a class
        jvm.org.apache.spark.util.Utils.classForName(name, False, False)
    except Exception:  # noqa: BLE001 - ClassNotFoundException via py4j, or no JVM at all (Spark Connect)
        return False
    return True


# -- on the executors: traces out of records ------------------------------------------------------

OBSERVED_ROWS = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("route", StringType(), True),
        StructField("trace_id", BinaryType(), True),
        StructField("stage", IntegerType(), True),
        StructField("topic", StringType(), False),  # a topic, or a file sink's name
        StructField("partition", LongType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp_ms", LongType(), True),
        StructField("origin_ms", LongType(), True),
        StructField("key", BinaryType(), True),
        StructField("file", StringType(), True),
        StructField("row", LongType(), True),
        StructField("archived_topic", StringType(), True),
        StructField("detail", StringType(), True),  # HEADER_ERROR: what is wrong with the header
    ]
)
_OBSERVED_ARROW = to_arrow_schema(OBSERVED_ROWS)
_OBSERVED_FIELDS = tuple(OBSERVED_ROWS.fieldNames())


class ExtractTask:
    """The function `mapInArrow` runs: batches of _EXTRACT_INPUT -> batches of OBSERVED_ROWS,
    one observation per traced record and route it is on, one HEADER_ERROR row per record
    whose trace header cannot be read (kdiv.trace.header's rules, the worker's)."""

    def __init__(self, stages: Mapping[str, Sequence[tuple[str, int]]]) -> None:
        # topic or file sink name -> the (route, stage)s it is.
        self.stages = stages

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in _EXTRACT_INPUT]
            out: list[dict[str, Any]] = []
            for topic, partition, offset, timestamp_ms, key, headers, trace, file, row, archived in zip(
                *columns, strict=True
            ):
                position = {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "key": key,
                    "file": file,
                    "row": row,
                    "archived_topic": archived,
                }
                stamp: TraceStamp | None
                try:
                    if trace is not None:
                        stamp = decode_trace(trace)
                    else:
                        stamp = find_trace([(h["key"], h["value"]) for h in headers or ()])
                except TraceHeaderError as bad:
                    out.append(_observed(HEADER_ERROR, position, detail=str(bad)))
                    continue
                if stamp is None:
                    continue
                for route, stage in self.stages.get(topic, ()):
                    out.append(
                        _observed(
                            OBSERVATION,
                            position,
                            route=route,
                            trace_id=stamp.trace_id,
                            stage=stage,
                            timestamp_ms=timestamp_ms,
                            origin_ms=stamp.origin_ms,
                        )
                    )
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=_OBSERVED_ARROW)


def _observed(kind: str, position: Mapping[str, Any], **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(_OBSERVED_FIELDS)
    row.update(position, kind=kind, **values)
    return row


# -- on the executors: the judge ----------------------------------------------------------------

# What JudgeTask reads, sorted by (route, trace_id) within each input partition.
_JUDGE_INPUT = (
    "route",
    "trace_id",
    "stage",
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "origin_ms",
    "key",
    "file",
    "row",
)

JUDGED_ROWS = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("route", StringType(), False),
        StructField("hop", IntegerType(), False),
        StructField("outcome", StringType(), False),
        StructField("trace_id", StringType(), True),  # hex
        StructField("group", StringType(), True),
        # The record at the hop's input (the first copy at its output when none was seen there).
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp_ms", LongType(), True),
        StructField("key", BinaryType(), True),
        StructField("committed_offset", LongType(), True),
        StructField("copies", ArrayType(COPY_TYPE), True),
        StructField("detail", StringType(), True),
        StructField("n", LongType(), False),  # FAULT: records it stands for; COUNT: traces
    ]
)
_JUDGED_ARROW = to_arrow_schema(JUDGED_ROWS)
_JUDGED_FIELDS = tuple(JUDGED_ROWS.fieldNames())


@dataclass(frozen=True)
class JudgePlan:
    """What a judging task needs, shipped with the function (plain, picklable data)."""

    routes: tuple[Route, ...]
    committed: Mapping[tuple[str, str, int], int]
    # (file sink name, file) -> number, for the records positioned by file and row: the judge
    # tells records apart by (sink, number, row).
    file_numbers: Mapping[tuple[str, str], int] = field(default_factory=dict)


class JudgeTask:
    """The function `mapInArrow` runs over observations sorted by (route, trace id) in each
    partition: batches of _JUDGE_INPUT -> batches of JUDGED_ROWS."""

    def __init__(self, plan: JudgePlan) -> None:
        self.plan = plan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts: Counter[tuple[str, int, str]] = Counter()
        # The rows of the trace the last batch ended in: it may go on in the next.
        held: list[tuple] = []
        last_key: tuple[str, bytes] | None = None
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in _JUDGE_INPUT]
            rows = list(zip(*columns, strict=True))
            if not rows:
                continue
            for row in rows:
                key = (row[0], row[1])
                # Whole traces are judged together only if each trace's rows are contiguous.
                if last_key is not None and key < last_key:
                    raise RuntimeError(
                        f"observations are not sorted by route and trace: {key[0]}/{key[1].hex()} "
                        f"after {last_key[0]}/{last_key[1].hex()}"
                    )
                last_key = key
            rows = held + rows
            cut = len(rows)
            while cut > 0 and (rows[cut - 1][0], rows[cut - 1][1]) == last_key:
                cut -= 1
            ready, held = rows[:cut], rows[cut:]
            if ready:
                faults = self._judge(ready, counts)
                if faults:
                    yield pa.RecordBatch.from_pylist(faults, schema=_JUDGED_ARROW)
        tail = self._judge(held, counts) if held else []
        tail += [_judged(COUNT, route, hop, outcome, n=n) for (route, hop, outcome), n in sorted(counts.items()) if n]
        if tail:
            yield pa.RecordBatch.from_pylist(tail, schema=_JUDGED_ARROW)

    def _judge(self, rows: list[tuple], counts: Counter[tuple[str, int, str]]) -> list[dict[str, Any]]:
        observations = []
        # position -> (copy, key, timestamp) of the record there
        records: dict[tuple[str, int, int], tuple[dict[str, Any], bytes | None, int]] = {}
        stages: dict[tuple[str, bytes], set[int]] = {}
        for route, trace_id, stage, topic, partition, offset, timestamp_ms, origin_ms, key, file, row in rows:
            timestamp = -1 if timestamp_ms is None else timestamp_ms
            copy = {"topic": topic, "partition": partition, "offset": offset, "file": file, "row": row}
            if partition is None:
                # An archive record without its Kafka position: its file and row tell it apart.
                partition, offset = self.plan.file_numbers[(topic, file)], row
            where = (topic, partition, offset)
            records.setdefault(where, (copy, key, timestamp))
            observations.append(Observation(trace_id, route, stage, topic, partition, offset, timestamp, origin_ms))
            stages.setdefault((route, trace_id), set()).add(stage)
        result = judge_at_rest(self.plan.routes, observations, self.plan.committed)
        for route, per_outcome in result.counts.items():
            for outcome, n in per_outcome.items():
                counts[(route, ROUTE_LEVEL, outcome)] += n
        terminal: set[tuple[str, bytes]] = set()
        faults = []
        for verdict in result.verdicts:
            counts[(verdict.route, verdict.hop, verdict.outcome.value)] += 1
            if verdict.outcome in (TraceOutcome.DELIVERED, TraceOutcome.LOST):
                terminal.add((verdict.route, verdict.trace_id))
            if verdict.outcome.value in FAULT_OUTCOMES:
                faults.append(_fault(verdict, records))
        for (route, trace_id), seen in stages.items():
            counts[(route, ROUTE_LEVEL, TRACED)] += 1
            for stage in seen:
                counts[(route, stage, SEEN)] += 1
            if (route, trace_id) not in terminal:
                # Waiting on the hop that reads the furthest stage it reached (the judge's PENDING).
                counts[(route, max(seen), PENDING)] += 1
        return faults


def _fault(
    verdict: TraceVerdict, records: Mapping[tuple[str, int, int], tuple[dict[str, Any], bytes | None, int]]
) -> dict:
    at = verdict.source if verdict.source is not None else verdict.copies[0]
    copy, key, timestamp = records[at]
    if copy["file"] is None:
        topic, partition, offset = at
    else:
        # Only a trace seen nowhere but in a file sink: the finding is on the sink.
        topic = copy["topic"]
        partition = copy["partition"] if copy["partition"] is not None else -1
        offset = copy["offset"] if copy["offset"] is not None else copy["row"] if copy["row"] is not None else -1
    lost = verdict.outcome is TraceOutcome.LOST
    return _judged(
        FAULT,
        verdict.route,
        verdict.hop,
        verdict.outcome.value,
        trace_id=verdict.trace_id.hex(),
        group=verdict.group,
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp,
        key=key,
        committed_offset=verdict.committed_offset,
        copies=[records[where][0] for where in verdict.copies] or None,
        detail=verdict.detail,
        # A lost record stands for itself; copies for the records beyond the one expected.
        n=1 if lost else len(verdict.copies) - 1,
    )


def _judged(kind: str, route: str, hop: int, outcome: str, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(_JUDGED_FIELDS)
    row.update(kind=kind, route=route, hop=hop, outcome=outcome, **values)
    return row


# -- on the driver: the check, its findings and its summary --------------------------------------


@dataclass(frozen=True)
class RoutesCheck:
    """The check's findings (ROUTE_REPORT_FIELDS, not collected) and summary.json's `routes`."""

    findings: DataFrame
    summary: dict[str, Any]


def check_routes(
    spark: SparkSession,
    routes: Sequence[Route],
    read: Callable[[list[str]], DataFrame],
    committed: CommittedOffsets,
    partitions: Mapping[str, int],
) -> RoutesCheck:
    """Judge every trace of `routes` at rest. `read(topics)`: the snapshot's records of topics
    (KAFKA_SCHEMA); `partitions`: topic -> partition count, for the summary."""
    from pyspark import StorageLevel

    topics = sorted({topic for route in routes for topic in route.kafka_topics})
    inputs = kafka_inputs(read(topics))
    files: dict[str, FileInput] = {}
    for route in routes:
        for sink in route.file_sinks:
            if sink.name not in files:
                files[sink.name] = read_file_sink(spark, route.name, sink)
                inputs = inputs.unionByName(files[sink.name].records)
    observed = inputs.mapInArrow(ExtractTask(stage_map(routes)), OBSERVED_ROWS).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        _check_one_topic_per_archive(observed, [f for f in files.values() if f.names_topics and not f.by_row])
        numbers = _file_numbers(observed, [f.sink.name for f in files.values() if f.by_row])
        plan = JudgePlan(tuple(routes), dict(committed.offsets), numbers)
        judged = (
            observed.where(F.col("kind") == OBSERVATION)
            .select(*_JUDGE_INPUT)
            .repartition("route", "trace_id")
            .sortWithinPartitions("route", "trace_id")
            .mapInArrow(JudgeTask(plan), JUDGED_ROWS)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        counts = {
            (r["route"], r["hop"], r["outcome"]): r["n"]
            for r in judged.where(F.col("kind") == COUNT)
            .groupBy("route", "hop", "outcome")
            .agg(F.sum("n").alias("n"))
            .collect()
        }
        errors = (
            observed.where(F.col("kind") == HEADER_ERROR)
            .groupBy("topic")
            .agg(F.count(F.lit(1)).alias("n"), F.min(F.struct("partition", "offset", "detail")).alias("first"))
            .collect()
        )
    finally:
        observed.unpersist()
    header_errors = {r["topic"]: (r["n"], r["first"]) for r in errors}
    summary = summary_of(routes, counts, committed, partitions, header_errors)
    return RoutesCheck(fault_findings(judged), summary)


def _check_one_topic_per_archive(observed: DataFrame, archives: Sequence[FileInput]) -> None:
    """An archive positioned by partition and offset must hold one topic's records: two topics'
    would share positions, and the judge would take two records for one."""
    if not archives:
        return
    names = [a.sink.name for a in archives]
    mixed = (
        observed.where(F.col("topic").isin(names) & F.col("archived_topic").isNotNull())
        .groupBy("topic")
        .agg(F.sort_array(F.collect_set("archived_topic")).alias("topics"))
        .where(F.size("topics") > 1)
        .collect()
    )
    for r in mixed:
        raise FileSinkError(
            f"file sink {r['topic']!r} holds records of {len(r['topics'])} topics ({', '.join(r['topics'][:5])}): "
            "positioned by partition and offset they would be taken for one another; archive one topic per path"
        )


def _file_numbers(observed: DataFrame, sinks: Sequence[str]) -> dict[tuple[str, str], int]:
    """A number per file of the `sinks` positioned by row, in file name order."""
    if not sinks:
        return {}
    rows = observed.where(F.col("topic").isin(list(sinks))).select("topic", "file").distinct().collect()
    numbers: dict[tuple[str, str], int] = {}
    for sink in sinks:
        for number, file in enumerate(sorted(r["file"] for r in rows if r["topic"] == sink)):
            numbers[(sink, file)] = number
    return numbers


def fault_findings(judged: DataFrame) -> DataFrame:
    """The faults of JUDGED_ROWS as findings (ROUTE_REPORT_FIELDS)."""
    faults = judged.where(F.col("kind") == FAULT)
    null = {
        "producer": "string",
        "segment": "long",
        "seq": "long",
        "schema_id": "long",
        "expected_subject": "string",
        "registered_subjects": "array<string>",
        "table": "string",
        "row_key": "string",
        "commit_ts": "long",
        "expected_checksum": "long",
        "computed_checksum": "long",
        "image": "string",
    }
    columns = {
        "class": F.concat(F.lit("ROUTE_"), F.col("outcome")),
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "offset": F.col("offset"),
        "key": F.col("key"),
        "timestamp_ms": F.coalesce(F.col("timestamp_ms"), F.lit(-1).cast("long")),
        "count": F.col("n"),
        "detail": F.col("detail"),
        "route": F.col("route"),
        "hop": F.col("hop"),
        "group": F.col("group"),
        "trace_id": F.col("trace_id"),
        "committed_offset": F.col("committed_offset"),
        "copies": F.col("copies"),
        **{name: F.lit(None).cast(data_type) for name, data_type in null.items()},
    }
    return faults.select(*(columns[name].alias(name) for name in ROUTE_REPORT_FIELDS))


def summary_of(
    routes: Sequence[Route],
    counts: Mapping[tuple[str, int, str], int],
    committed: CommittedOffsets,
    partitions: Mapping[str, int],
    header_errors: Mapping[str, tuple[int, Any]],
) -> dict[str, Any]:
    """summary.json's `routes`: per route its traces and the judge's count of each outcome, and
    per hop its group, the traces seen at its input and output, and the verdicts it is named in
    (DELIVERED on the last hop) or the traces waiting on it (PENDING)."""
    summary: dict[str, Any] = {}
    for route in routes:
        name = route.name

        def n(hop: int, outcome: str, name: str = name) -> int:
            return int(counts.get((name, hop, outcome), 0))

        hops = []
        for index, hop in enumerate(route.hops):
            inputs = [(topic, p) for topic in hop.sources for p in range(partitions.get(topic, 0))]
            hops.append(
                {
                    "hop": index,
                    "from": list(hop.sources),
                    "group": hop.group,
                    "to": list(hop.sinks),
                    "group_known": hop.group in committed.known_groups,
                    "input_partitions": len(inputs),
                    "committed_partitions": sum(1 for t, p in inputs if (hop.group, t, p) in committed.offsets),
                    "traced_in": n(index, SEEN),
                    "traced_out": n(index + 1, SEEN),
                    **{outcome.lower(): n(index, outcome) for outcome in HOP_OUTCOMES},
                }
            )
        unreadable = [(topic, *header_errors[topic]) for topic in route.topics if topic in header_errors]
        live = route.live()
        summary[name] = {
            "route": route_text(route),
            "traced": n(ROUTE_LEVEL, TRACED),
            **{outcome.lower(): n(ROUTE_LEVEL, outcome) for outcome in HOP_OUTCOMES},
            "hops": hops,
            "file_sinks": [sink.name for sink in route.file_sinks],
            # The hops the live worker judges (it cannot observe files).
            "live_hops": len(live.hops) if live is not None else 0,
            "unreadable_trace_headers": sum(count for _, count, _ in unreadable),
            "first_unreadable_trace_header": (
                {
                    "topic": unreadable[0][0],
                    "partition": unreadable[0][2]["partition"],
                    "offset": unreadable[0][2]["offset"],
                    "detail": unreadable[0][2]["detail"],
                }
                if unreadable
                else None
            ),
        }
    return summary


def route_text(route: Route) -> str:
    """The route's chain as KDIV_ROUTES writes it, without its name."""
    parts = ["|".join(route.stages[0])]
    for hop in route.hops:
        parts += [hop.group, "|".join(hop.sinks)]
    return ">".join(parts)
