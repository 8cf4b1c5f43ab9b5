"""What the reconciliation reports: discrepancy classes and the one row shape they share.

Every finding, whatever its class, is one row of `FINDINGS_SCHEMA`, so the Parquet files,
the JSON summary and the HTML report read one table. Findings on TiCDC changefeed topics
(`CHECKSUM_CLASSES`) also fill `CHECKSUM_COLUMNS`, which the job adds (null) to every other
finding: its rows are `REPORT_SCHEMA`. Findings of the pipeline routes (`ROUTE_CLASSES`) fill
`ROUTE_COLUMNS` too; a run that checks routes adds them (null) to every other finding.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# The validator's table saw a later validated record for the key than the topic now holds,
# or the key is gone without a tombstone (e.g. log truncation after an unclean election).
LOST = "LOST"
# The topic holds a record the validator never saw, below the offset it has validated to.
UNVALIDATED = "UNVALIDATED"
# The record at the validated offset is not the record validated (CRC32 differs).
DIVERGED = "DIVERGED"
# A producer's highest (segment, sequence) in the topic is below the one the table holds.
SEQUENCE_BEHIND = "SEQUENCE_BEHIND"
# Restored state carries a schema id not registered under its changelog's subject (KAFKA-10179).
SUBJECT_MISMATCH = "SUBJECT_MISMATCH"
# Restored state carries a schema id the registry does not know.
SCHEMA_UNKNOWN = "SCHEMA_UNKNOWN"
# A changelog value the job cannot read (not framed, or not kdiv state): reported, not dropped.
UNREADABLE = "UNREADABLE"

# A changefeed row whose TiCDC row checksum does not match its columns.
CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"
# A changefeed row TiCDC itself flagged corrupted (its checksum disagreed with TiDB's).
CORRUPTED_FLAG = "CORRUPTED_FLAG"
# A changefeed record that cannot be read as a TiCDC message, or whose writer schema is unknown.
MALFORMED = "MALFORMED"

# A traced record a route's processor consumed and committed past, never written to its sink.
# Not LOST: that one is a key the topic itself no longer holds.
ROUTE_LOST = "ROUTE_LOST"
# A traced record a route's processor wrote more than once to its sink.
ROUTE_DUPLICATED = "ROUTE_DUPLICATED"

# Records past the live worker's committed offset, written longer ago than KDIV_UNVALIDATED_AFTER_S
# (kdiv.reconcile.backlog): the worker has not validated them. Newer ones are lag, no finding.
NOT_VALIDATED = "NOT_VALIDATED"

KEY_CLASSES = (LOST, UNVALIDATED, DIVERGED)
CLASSES = (LOST, UNVALIDATED, DIVERGED, SEQUENCE_BEHIND, SUBJECT_MISMATCH, SCHEMA_UNKNOWN, UNREADABLE)
# Reported by runs that compared the topics with the worker's committed offsets.
BACKLOG_CLASSES = (NOT_VALIDATED,)
# The row checksum verdicts that are faults (kdiv.ticdc.checksum.FAULT_VERDICTS), by the same names.
CHECKSUM_CLASSES = (CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED)
# The trace verdicts that are faults (kdiv.trace.judge), by outcome.
ROUTE_CLASSES = (ROUTE_LOST, ROUTE_DUPLICATED)

FINDINGS_SCHEMA = StructType(
    [
        StructField("class", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        # The offset at issue: the validated offset (LOST, DIVERGED), the unvalidated
        # record's (UNVALIDATED), the table's last (SEQUENCE_BEHIND), the first record
        # carrying the schema id (schema classes). -1 when there is none.
        StructField("offset", LongType(), False),
        StructField("key", BinaryType(), True),
        # Producer GUID as hex, when the record or state names one.
        StructField("producer", StringType(), True),
        StructField("segment", LongType(), True),  # a header carries it unsigned 32-bit
        StructField("seq", LongType(), True),
        # Record time (ms since epoch) of the record at issue, -1 when unknown.
        StructField("timestamp_ms", LongType(), False),
        # Records the finding stands for (1 per key; records carrying a schema id).
        StructField("count", LongType(), False),
        StructField("schema_id", LongType(), True),  # as framed: unsigned 32-bit
        StructField("expected_subject", StringType(), True),
        StructField("registered_subjects", ArrayType(StringType()), True),
        StructField("detail", StringType(), False),
    ]
)
FINDING_FIELDS = tuple(f.name for f in FINDINGS_SCHEMA.fields)

# What a changefeed finding adds; null for every other class.
CHECKSUM_COLUMNS = StructType(
    [
        StructField("table", StringType(), True),  # database.table, as the message names it
        StructField("row_key", StringType(), True),  # the row's key columns as a JSON object
        StructField("commit_ts", LongType(), True),  # TiDB commit timestamp (TSO)
        # The checksum the message carries and the one computed from its columns (uint32).
        StructField("expected_checksum", LongType(), True),
        StructField("computed_checksum", LongType(), True),
        StructField("image", StringType(), True),  # "current" or "previous" row image
    ]
)
CHECKSUM_FIELDS = tuple(f.name for f in CHECKSUM_COLUMNS.fields)
REPORT_SCHEMA = StructType(FINDINGS_SCHEMA.fields + CHECKSUM_COLUMNS.fields)
REPORT_FIELDS = FINDING_FIELDS + CHECKSUM_FIELDS

# A position a trace was seen at: a topic's record, or a record in a route's file sink (topic
# is then the sink, `format:path`; partition and offset the archived record's when the files
# keep them, else `row` numbers it in `file`).
COPY_TYPE = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("file", StringType(), True),
        StructField("row", LongType(), True),
    ]
)
# What a route finding adds; null for every other class. The finding's topic, partition and
# offset are the record at the hop's input (to replay, for ROUTE_LOST).
ROUTE_COLUMNS = StructType(
    [
        StructField("route", StringType(), True),
        StructField("hop", IntegerType(), True),  # the hop that lost it, or whose output has copies
        StructField("group", StringType(), True),  # the hop's consumer group
        StructField("trace_id", StringType(), True),  # hex
        # ROUTE_LOST: the group's committed offset on the input partition, past the record.
        StructField("committed_offset", LongType(), True),
        StructField("copies", ArrayType(COPY_TYPE), True),  # ROUTE_DUPLICATED: every copy at the output
    ]
)
ROUTE_FIELDS = tuple(f.name for f in ROUTE_COLUMNS.fields)
ROUTE_REPORT_SCHEMA = StructType(REPORT_SCHEMA.fields + ROUTE_COLUMNS.fields)
ROUTE_REPORT_FIELDS = REPORT_FIELDS + ROUTE_FIELDS


def with_checksum_columns(findings: DataFrame) -> DataFrame:
    """`findings` with REPORT_FIELDS, in order: the checksum columns it lacks added as nulls."""
    missing = {f.name: F.lit(None).cast(f.dataType) for f in CHECKSUM_COLUMNS.fields if f.name not in findings.columns}
    return (findings.withColumns(missing) if missing else findings).select(*REPORT_FIELDS)


def with_report_columns(findings: DataFrame) -> DataFrame:
    """`findings` with ROUTE_REPORT_FIELDS, in order: the checksum and route columns it lacks
    added as nulls."""
    extra = CHECKSUM_COLUMNS.fields + ROUTE_COLUMNS.fields
    missing = {f.name: F.lit(None).cast(f.dataType) for f in extra if f.name not in findings.columns}
    return (findings.withColumns(missing) if missing else findings).select(*ROUTE_REPORT_FIELDS)
