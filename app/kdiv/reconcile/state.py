"""The validator's tables as their changelogs hold them: the latest value per table key,
decoded with the registered writer schema its framing names.

Decoding runs on executors (mapInArrow); writer schemas travel with the function. A value
that cannot be read becomes a row of kind "unreadable" naming changelog, partition, offset
and why: it is reported, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from kdiv.div.ledger import KeyValidation, parse_ledger_key
from kdiv.div.segment import Segment
from kdiv.div.validator import PartitionValidation
from kdiv.state.codec import StateDecodeError
from kdiv.state.framing import FramingError, unframe
from kdiv.state.tables import parse_key
from kdiv.untrusted import preview

PARTITION = "partition"
PRODUCER = "producer"
KEY = "key"
# Framed with a known schema, yet not kdiv state: a finding of its own.
UNREADABLE = "unreadable"
# Not framed, or framed with an id the registry does not know: the schema check reports these.
UNDECODED = "undecoded"

STATE_ROWS = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("changelog", StringType(), False),
        StructField("changelog_partition", IntegerType(), False),
        StructField("changelog_offset", LongType(), False),
        StructField("schema_id", LongType(), True),  # as framed: unsigned 32-bit
        # The watched topic and partition the state is about.
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        # The record key, for key ledger rows; the changelog record's own key, for values
        # the job cannot read (so a finding names the entry).
        StructField("key", BinaryType(), True),
        StructField("producer", StringType(), True),
        StructField("segment", LongType(), True),
        StructField("seq", LongType(), True),
        # Partition: validated up to; producer: its last record; key: the validated record.
        StructField("offset", LongType(), True),
        StructField("timestamp_ms", LongType(), True),
        StructField("crc", LongType(), True),
        StructField("tombstone", BooleanType(), True),
        StructField("error", StringType(), True),
    ]
)
_FIELDS = [f.name for f in STATE_ROWS.fields]


def latest_values(changelog_records: DataFrame) -> DataFrame:
    """Latest record per table key; tombstones delete (a deleted key is no state)."""
    latest = changelog_records.groupBy("topic", "partition", "key").agg(F.max(F.struct("offset", "value")).alias("r"))
    return latest.select(
        "topic", "partition", "key", F.col("r.offset").alias("offset"), F.col("r.value").alias("value")
    ).where(F.col("value").isNotNull())


def decoded_state(changelog_records: DataFrame, writer_schemas: Mapping[int, str]) -> DataFrame:
    """STATE_ROWS of every live table entry. `writer_schemas`: schema id -> Avro schema text."""
    schemas = dict(writer_schemas)

    def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from kdiv.state.values import StateValues

        values = StateValues(-1)
        usable: set[int] = set()
        for schema_id, text in schemas.items():
            try:
                values.add_writer_schema(schema_id, text)
                usable.add(schema_id)
            except StateDecodeError:
                pass
        for batch in batches:
            rows = [_decode_row(row, values, usable) for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(rows, schema=_ARROW_SCHEMA)

    return latest_values(changelog_records).mapInArrow(decode_batches, STATE_ROWS)


def _row(kind: str, entry: dict, **fields) -> dict:
    row = dict.fromkeys(_FIELDS)
    row.update(
        kind=kind,
        changelog=entry["topic"],
        changelog_partition=entry["partition"],
        changelog_offset=entry["offset"],
        **fields,
    )
    return row


def _decode_row(entry: dict, values, usable: set[int]) -> dict:
    raw_key, raw = entry["key"], entry["value"]
    try:
        schema_id, _body = unframe(raw)
    except FramingError as bad:
        return _row(UNDECODED, entry, key=raw_key, error=f"value is not Confluent-framed: {bad}")
    if schema_id not in usable:
        return _row(
            UNDECODED,
            entry,
            key=raw_key,
            schema_id=schema_id,
            error=f"schema id {schema_id} has no writer schema (unknown to the registry)",
        )
    try:
        state = values.decode(raw)
        if isinstance(state, KeyValidation):
            topic, partition, key = parse_ledger_key(raw_key or b"")
            return _row(
                KEY,
                entry,
                schema_id=schema_id,
                topic=topic,
                partition=partition,
                key=key,
                producer=state.producer.hex() if state.producer is not None else None,
                segment=state.segment,
                seq=state.seq,
                offset=state.offset,
                timestamp_ms=state.timestamp,
                crc=state.crc,
                tombstone=state.tombstone,
            )
        state_key = parse_key(raw_key or b"")
        if isinstance(state, PartitionValidation) and state_key.guid is None:
            return _row(
                PARTITION,
                entry,
                schema_id=schema_id,
                topic=state_key.topic,
                partition=state_key.partition,
                offset=state.last_offset,
            )
        if isinstance(state, Segment) and state_key.guid is not None:
            return _row(
                PRODUCER,
                entry,
                schema_id=schema_id,
                topic=state_key.topic,
                partition=state_key.partition,
                producer=state_key.guid.hex(),
                segment=state.segment_number,
                seq=state.sequence_number,
                offset=state.last_offset,
            )
        return _row(
            UNREADABLE,
            entry,
            key=raw_key,
            schema_id=schema_id,
            error=f"key {preview(raw_key)} holds a {type(state).__name__}, not what the key names",
        )
    except (StateDecodeError, ValueError) as bad:
        return _row(UNREADABLE, entry, key=raw_key, schema_id=schema_id, error=str(bad))


def _arrow_type(spark_type):
    return {
        StringType(): pa.string(),
        IntegerType(): pa.int32(),
        LongType(): pa.int64(),
        BinaryType(): pa.binary(),
        BooleanType(): pa.bool_(),
    }[spark_type]


_ARROW_SCHEMA = pa.schema([pa.field(f.name, _arrow_type(f.dataType), f.nullable) for f in STATE_ROWS.fields])
