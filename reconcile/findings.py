"""What the reconciliation reports: discrepancy classes and the one row shape they share.

Every finding, whatever its class, is one row of `FINDINGS_SCHEMA`, so the Parquet files,
the JSON summary and the HTML report read one table. Findings on TiCDC changefeed topics
(`CHECKSUM_CLASSES`) also fill `CHECKSUM_COLUMNS`, which the job adds (null) to every other
finding: its rows are `REPORT_SCHEMA`.
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

KEY_CLASSES = (LOST, UNVALIDATED, DIVERGED)
CLASSES = (LOST, UNVALIDATED, DIVERGED, SEQUENCE_BEHIND, SUBJECT_MISMATCH, SCHEMA_UNKNOWN, UNREADABLE)
# The row checksum verdicts that are faults (kdiv.ticdc.checksum.FAULT_VERDICTS), by the same names.
CHECKSUM_CLASSES = (CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED)

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


def with_checksum_columns(findings: DataFrame) -> DataFrame:
    """`findings` with REPORT_FIELDS, in order: the checksum columns it lacks added as nulls."""
    missing = {f.name: F.lit(None).cast(f.dataType) for f in CHECKSUM_COLUMNS.fields if f.name not in findings.columns}
    return (findings.withColumns(missing) if missing else findings).select(*REPORT_FIELDS)
