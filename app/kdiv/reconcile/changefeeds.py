"""TiCDC changefeed topics at rest: every row checksum of the snapshot verified in Spark.

Decoding and verifying run on the executors (`mapInArrow`), each task over its input
partition in offset order, with the verifier the worker uses (`kdiv.changefeed.verify`): the
worker and the nightly job give the same verdicts for the same bytes. A task yields one row per
fault (CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED) and, at its end, its row counts per
(topic, partition, table, verdict, skip reason) and the records it read. The driver collects
only Spark's aggregates of those counts; the faults become findings of the report.

Writer schemas (Avro protocol) are fetched by the executors from the registry, per task and
cached per Python worker (ids never change): the driver knows no id before the data is read.
When the job replays the registry's log (`--schemas-topic`) the driver holds every schema
already; they travel with the function and executors ask no registry. A registry that cannot
answer fails the task (after a few tries): a row is never judged without its schema. The
registry settings travel with the function too (basic auth included); TLS files
(KDIV_SCHEMA_REGISTRY_CA/CERT/KEY) must be at the same paths on the executors.

Simple protocol: a DML's column types come from BOOTSTRAP and DDL messages earlier in its
partition, so each partition of a Simple topic must be read whole by one task: `read_plan`
says how to read them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.errors import PythonException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from kdiv.config.settings import ChangefeedSettings, RegistrySettings
from kdiv.reconcile.findings import REPORT_FIELDS

# What a task yields: one row per fault, then its counts.
FAULT, ROWS, RECORDS = "fault", "rows", "records"
# The worker's name for rows whose message names no table (kdiv.worker.changefeeds).
UNKNOWN_TABLE = "(unknown)"
VERDICTS = ("OK", "CHECKSUM_MISMATCH", "CORRUPTED_FLAG", "SKIPPED", "MALFORMED")
# A Simple topic's partitions are read whole: one split as large as any partition can be.
WHOLE_PARTITION = 1 << 62

# Registry tries per schema id before the task fails; waits between them double from this.
REGISTRY_ATTEMPTS = 4
REGISTRY_FIRST_WAIT_S = 1.0

VERIFIED_ROWS = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), True),
        StructField("timestamp_ms", LongType(), True),
        StructField("key", BinaryType(), True),  # the Kafka record's key, as stored
        StructField("verdict", StringType(), True),
        StructField("table", StringType(), True),
        StructField("row_key", StringType(), True),  # the row's key columns, JSON
        StructField("commit_ts", LongType(), True),
        StructField("expected", LongType(), True),
        StructField("computed", LongType(), True),
        StructField("image", StringType(), True),
        StructField("skip_reason", StringType(), True),
        StructField("schema_id", LongType(), True),
        StructField("detail", StringType(), True),
        StructField("n", LongType(), True),  # rows (ROWS) or records (RECORDS) counted
    ]
)
_ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "binary": pa.binary()}
_ARROW_SCHEMA = pa.schema(
    [pa.field(f.name, _ARROW_TYPES[f.dataType.simpleString()], f.nullable) for f in VERIFIED_ROWS.fields]
)
_FIELDS = tuple(VERIFIED_ROWS.fieldNames())


class ChangefeedSchemaError(RuntimeError):
    """A writer schema the registry could not give (down, or an answer that is not one)."""


# -- what the driver decides ------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyPlan:
    """Everything a task needs, shipped with the function (so: plain, picklable data)."""

    protocols: Mapping[str, str]  # topic -> "avro" | "simple"
    time_zone: str
    timestamp_mode: str
    # Ask the registry for writer schemas not in `schemas`; None: ask nothing (unknown ids
    # are then unknown to the registry, as when its whole log was replayed).
    registry: RegistrySettings | None
    schemas: Mapping[int, str] = field(default_factory=dict)


def plan_for(
    settings: ChangefeedSettings,
    topics: Iterable[str],
    registry: RegistrySettings,
    replayed_schemas: Mapping[int, str] | None = None,
) -> VerifyPlan:
    """The plan for `topics`; `replayed_schemas`: every schema of the registry's replayed log."""
    return VerifyPlan(
        protocols={topic: settings.protocol_of(topic) for topic in topics},
        time_zone=settings.time_zone,
        timestamp_mode=settings.timestamp_mode,
        registry=None if replayed_schemas is not None else registry,
        schemas=dict(replayed_schemas or {}),
    )


def read_plan(plan: VerifyPlan, max_records_per_split: int) -> list[tuple[list[str], int]]:
    """(topics, max records per split) groups to read: Simple topics' partitions whole."""
    avro = sorted(t for t, p in plan.protocols.items() if p != "simple")
    simple = sorted(t for t, p in plan.protocols.items() if p == "simple")
    return [(topics, size) for topics, size in ((avro, max_records_per_split), (simple, WHOLE_PARTITION)) if topics]


# -- on the executors -------------------------------------------------------------------------

# Schema texts by (registry URL, id), kept for the Python worker's life: ids never change.
_FETCHED: dict[tuple[str, int], str] = {}


def fetch_schemas(registry: RegistrySettings, ids: Iterable[int], where: str) -> dict[int, str | None]:
    """Schema texts of `ids` (None: unknown to the registry), with the worker's client, so
    basic auth and TLS settings apply as they do there. Raises ChangefeedSchemaError naming
    `where` when the registry cannot answer after REGISTRY_ATTEMPTS tries."""
    from kdiv.registry.client import RegistryUnavailable

    texts: dict[int, str | None] = {}
    wanted = []
    for schema_id in ids:
        cached = _FETCHED.get((registry.url, schema_id))
        if cached is not None:
            texts[schema_id] = cached
        else:
            wanted.append(schema_id)
    if not wanted:
        return texts
    if not registry.configured:
        raise ChangefeedSchemaError(
            f"{where}: records framed with schema ids {sorted(wanted)}, but there is no registry "
            "(KDIV_SCHEMA_REGISTRY_URL=none)"
        )
    wait = REGISTRY_FIRST_WAIT_S
    for attempt in range(1, REGISTRY_ATTEMPTS + 1):
        try:
            fetched = asyncio.run(_fetch(registry, wanted))
            break
        except RegistryUnavailable as down:
            if attempt == REGISTRY_ATTEMPTS:
                raise ChangefeedSchemaError(
                    f"{where}: writer schema ids {sorted(wanted)}: no answer from the registry after "
                    f"{REGISTRY_ATTEMPTS} tries: {down}"
                ) from None
            time.sleep(wait)
            wait *= 2
    for schema_id, text in fetched.items():
        if text is not None:
            _FETCHED[(registry.url, schema_id)] = text
        texts[schema_id] = text
    return texts


async def _fetch(registry: RegistrySettings, ids: Sequence[int]) -> dict[int, str | None]:
    from kdiv.registry.client import SchemaNotFound, SchemaRegistry

    client = SchemaRegistry(registry)
    texts: dict[int, str | None] = {}
    try:
        for schema_id in ids:
            try:
                texts[schema_id] = await client.schema_text(schema_id)
            except SchemaNotFound:
                texts[schema_id] = None  # a verdict (MALFORMED, "unknown to the registry"), not an outage
    finally:
        await client.close()
    return texts


class VerifyTask:
    """The function `mapInArrow` runs: Arrow batches of (topic, partition, offset,
    timestamp_ms, key, value) in offset order per partition -> batches of VERIFIED_ROWS."""

    def __init__(self, plan: VerifyPlan, fetch: Callable[..., Mapping[int, str | None]] = fetch_schemas) -> None:
        self.plan = plan
        self.fetch = fetch

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from kdiv.changefeed.verify import ChangefeedVerifier

        plan = self.plan
        verifier = ChangefeedVerifier(
            plan.protocols.__getitem__, time_zone=plan.time_zone, timestamp_mode=plan.timestamp_mode
        )
        for schema_id, text in plan.schemas.items():
            verifier.learn_schema(schema_id, text)
        rows: Counter[tuple[str, int, str, str, str | None]] = Counter()
        records: Counter[tuple[str, int]] = Counter()
        current: tuple[str, int] | None = None
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in _INPUT_COLUMNS]
            faults: list[dict[str, Any]] = []
            # Runs of one (topic, partition): a task normally reads one. A Simple partition must
            # come whole and in order (read_plan): its schemas are forgotten when its run ends.
            for (topic, partition), run in itertools.groupby(zip(*columns, strict=True), key=lambda r: (r[0], r[1])):
                if current != (topic, partition):
                    if current is not None:
                        faults += self._give_up_held(verifier, current, rows)
                    current = (topic, partition)
                held = list(run)
                records[current] += len(held)
                faults += self._verify_run(verifier, topic, partition, held, rows)
            if faults:
                yield _batch(faults)
        tail = self._give_up_held(verifier, current, rows) if current is not None else []
        tail += [
            _row(ROWS, topic, partition, table=table, verdict=verdict, skip_reason=reason, n=n)
            for (topic, partition, table, verdict, reason), n in sorted(rows.items(), key=repr)
        ]
        tail += [_row(RECORDS, topic, partition, n=n) for (topic, partition), n in sorted(records.items())]
        if tail:
            yield _batch(tail)

    def _verify_run(
        self, verifier, topic: str, partition: int, run: list[tuple], rows: Counter
    ) -> list[dict[str, Any]]:
        missing = verifier.missing_schemas((r[4], r[5]) for r in run)
        if missing:
            if self.plan.registry is None:
                texts: Mapping[int, str | None] = dict.fromkeys(missing)
            else:
                where = f"changefeed topic {topic}[{partition}] from offset {run[0][2]}"
                texts = self.fetch(self.plan.registry, sorted(missing), where)
            for schema_id in sorted(missing):
                verifier.learn_schema(schema_id, texts.get(schema_id))
        verdicts = verifier.verify_many(topic, partition, ((r[2], r[3], r[4], r[5]) for r in run))
        by_offset: dict[int, tuple] | None = None
        faults = []
        for verdict in verdicts:
            _count(rows, verdict)
            if verdict.result.is_fault:
                if by_offset is None:
                    by_offset = {r[2]: r for r in run}
                faults.append(_fault(verdict, by_offset.get(verdict.offset)))
        return faults

    @staticmethod
    def _give_up_held(verifier, where: tuple[str, int], rows: Counter) -> list[dict[str, Any]]:
        """Simple DMLs whose schema never came, at the end of their partition's records."""
        faults = []
        for verdict in verifier.take_held(*where):
            _count(rows, verdict)
            if verdict.result.is_fault:
                faults.append(_fault(verdict, None))
        verifier.forget(*where)
        return faults


_INPUT_COLUMNS = ("topic", "partition", "offset", "timestamp_ms", "key", "value")


def _count(rows: Counter, verdict) -> None:
    result = verdict.result
    reason = result.skip_reason.value if result.skip_reason is not None else None
    rows[(verdict.topic, verdict.partition, result.table or UNKNOWN_TABLE, result.verdict.value, reason)] += 1


def _fault(verdict, record: tuple | None) -> dict[str, Any]:
    from kdiv.changefeed.verify import fault_detail, framed_ids, key_columns

    result = verdict.result
    value_ids = framed_ids(record[5]) if record is not None else []
    return _row(
        FAULT,
        verdict.topic,
        verdict.partition,
        offset=verdict.offset,
        timestamp_ms=verdict.timestamp_ms,
        key=record[4] if record is not None else None,
        verdict=result.verdict.value,
        table=result.table,
        row_key=json.dumps(key_columns(result)),
        commit_ts=result.commit_ts,
        expected=result.expected,
        computed=result.computed,
        image=result.image.value,
        schema_id=value_ids[0] & 0xFFFFFFFF if value_ids else None,  # as framed: unsigned 32-bit
        detail=fault_detail(result),
    )


def _row(kind: str, topic: str, partition: int, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(_FIELDS)
    row.update(kind=kind, topic=topic, partition=partition, **values)
    return row


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=_ARROW_SCHEMA)


# -- on the driver: Spark plans and the aggregates -------------------------------------------


def verified_rows(records: DataFrame, plan: VerifyPlan) -> DataFrame:
    """VERIFIED_ROWS of the changefeed `records` (KAFKA_SCHEMA rows, each partition's records
    in offset order within its input partition, as kdiv's and Spark's kafka sources give them)."""
    inputs = records.select(
        "topic",
        "partition",
        "offset",
        F.unix_millis("timestamp").alias("timestamp_ms"),
        "key",
        "value",
    )
    return inputs.mapInArrow(VerifyTask(plan), VERIFIED_ROWS)


def fault_findings(verified: DataFrame) -> DataFrame:
    """The faults of `verified_rows` as findings (REPORT_FIELDS)."""
    faults = verified.where(F.col("kind") == FAULT)
    columns = {
        "class": F.col("verdict"),
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "offset": F.col("offset"),
        "key": F.col("key"),
        "producer": F.lit(None).cast("string"),
        "segment": F.lit(None).cast("long"),
        "seq": F.lit(None).cast("long"),
        "timestamp_ms": F.coalesce(F.col("timestamp_ms"), F.lit(-1).cast("long")),
        "count": F.lit(1).cast("long"),
        "schema_id": F.col("schema_id"),
        "expected_subject": F.lit(None).cast("string"),
        "registered_subjects": F.lit(None).cast("array<string>"),
        "detail": F.col("detail"),
        "table": F.col("table"),
        "row_key": F.col("row_key"),
        "commit_ts": F.col("commit_ts"),
        "expected_checksum": F.col("expected"),
        "computed_checksum": F.col("computed"),
        "image": F.col("image"),
    }
    return faults.select(*(columns[name].alias(name) for name in REPORT_FIELDS))


@dataclass(frozen=True)
class ChangefeedCounts:
    """Spark's aggregates of a run's verified rows, collected."""

    # (topic, table, verdict) -> rows; (topic, skip reason) -> rows; topic -> records
    rows: dict[tuple[str, str, str], int]
    skipped: dict[tuple[str, str], int]
    records: dict[str, int]


def collect_counts(verified: DataFrame) -> ChangefeedCounts:
    """The counts, aggregated in Spark. Raises ChangefeedSchemaError for a task that could
    not get its writer schemas, with the executor's message instead of Spark's traceback."""
    try:
        rows = (
            verified.where(F.col("kind") == ROWS)
            .groupBy("topic", "table", "verdict", "skip_reason")
            .agg(F.sum("n").alias("n"))
            .collect()
        )
        records = verified.where(F.col("kind") == RECORDS).groupBy("topic").agg(F.sum("n").alias("n")).collect()
    except PythonException as failed:
        raise _unwrapped(failed) from None
    by_verdict: Counter[tuple[str, str, str]] = Counter()
    skipped: Counter[tuple[str, str]] = Counter()
    for r in rows:
        by_verdict[(r["topic"], r["table"], r["verdict"])] += r["n"]
        if r["skip_reason"] is not None:
            skipped[(r["topic"], r["skip_reason"])] += r["n"]
    return ChangefeedCounts(dict(by_verdict), dict(skipped), {r["topic"]: r["n"] for r in records})


def _unwrapped(failed: PythonException) -> Exception:
    name = ChangefeedSchemaError.__name__
    lines = [line for line in str(failed).splitlines() if line.startswith(f"{name}: ")]
    if lines:
        return ChangefeedSchemaError(lines[-1][len(name) + 2 :])
    return failed


def summary_of(plan: VerifyPlan, counts: ChangefeedCounts) -> dict[str, Any]:
    """summary.json's `changefeeds`: per topic its protocol, records read, rows per verdict
    (zeros included), rows per table and verdict, and why rows were skipped."""
    summary: dict[str, Any] = {}
    for topic in sorted(plan.protocols):
        tables: dict[str, dict[str, int]] = {}
        for (t, table, verdict), n in counts.rows.items():
            if t == topic:
                tables.setdefault(table, dict.fromkeys(VERDICTS, 0))[verdict] = n
        summary[topic] = {
            "protocol": plan.protocols[topic],
            "records_read": counts.records.get(topic, 0),
            "rows": {v: sum(per[v] for per in tables.values()) for v in VERDICTS},
            "tables": dict(sorted(tables.items())),
            "skipped": {reason: n for (t, reason), n in sorted(counts.skipped.items()) if t == topic},
        }
    return summary
