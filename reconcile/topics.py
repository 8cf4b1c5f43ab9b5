"""Records at rest as the reconciliation compares them, computed in Spark SQL (JVM-side, no
Python per record): the `div` header's fields, the at-rest CRC32, the latest record per key.

The CRC is `kdiv.div.ledger.at_rest_crc`, i.e. `kdiv.div.wire.record_crc` with kind DATA:
CRC32 over the kind byte, the big-endian int32 key length (-1 for null), the key, the
value's length (-1 for null) and the value. tests/test_reconcile_compare.py holds the two
equal over real records.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kdiv.div.wire import COMMON_SIZE, FORMAT_VERSION, HEADER_NAME, Kind


def _int32_be(length: Column) -> Column:
    return F.unhex(F.lpad(F.hex(length), 8, "0"))


def _length_and_bytes(column: Column) -> Column:
    # Column expressions need a running session, so none is built at import.
    return F.when(column.isNull(), F.unhex(F.lit("FFFFFFFF"))).otherwise(F.concat(_int32_be(F.length(column)), column))


def at_rest_crc(key: Column, value: Column) -> Column:
    return F.crc32(F.concat(F.unhex(F.lit(f"{int(Kind.DATA):02X}")), _length_and_bytes(key), _length_and_bytes(value)))


def _unsigned(raw: Column, position: int, size: int) -> Column:
    # substring is 1-based.
    return F.conv(F.hex(F.substring(raw, position + 1, size)), 16, 10).cast("long")


def with_div_fields(records: DataFrame) -> DataFrame:
    """Adds div_kind, producer (GUID hex), segment, seq from a readable version-1 `div`
    header (nulls otherwise; two `div` headers count as unreadable, as for the validator)."""
    divs = F.filter("headers", lambda h: h["key"] == HEADER_NAME)
    raw = F.when((F.size(divs) == 1), divs[0]["value"])
    readable = (F.length(raw) >= COMMON_SIZE) & (_unsigned(raw, 0, 1) == FORMAT_VERSION)
    return records.withColumns(
        {
            "div_kind": F.when(readable, _unsigned(raw, 1, 1).cast("int")),
            "producer": F.when(readable, F.lower(F.hex(F.substring(raw, 3, 16)))),
            "segment": F.when(readable, _unsigned(raw, 18, 4)),
            "seq": F.when(readable, _unsigned(raw, 22, 4)),
        }
    )


def keyed_data(records: DataFrame) -> DataFrame:
    """Records the key ledger covers: keyed, not DIV control records."""
    return records.where(
        F.col("key").isNotNull() & (F.col("div_kind").isNull() | (F.col("div_kind") == int(Kind.DATA)))
    )


def at_rest_view(records: DataFrame) -> DataFrame:
    """What the comparisons need of each record, values reduced to their CRC32 so the view
    is small enough to keep for the several aggregations that read it."""
    return with_div_fields(records).select(
        "topic",
        "partition",
        "key",
        "offset",
        F.unix_millis("timestamp").alias("timestamp_ms"),
        at_rest_crc(F.col("key"), F.col("value")).alias("crc"),
        F.col("value").isNull().alias("tombstone"),
        "div_kind",
        "producer",
        "segment",
        "seq",
    )


def latest_per_key(view: DataFrame) -> DataFrame:
    """Per (topic, partition, key) of an `at_rest_view`, the record with the highest offset,
    tombstones included: what compaction keeps (or would keep, for a topic not compacted)."""
    latest = view.groupBy("topic", "partition", "key").agg(
        F.max(F.struct("offset", "timestamp_ms", "crc", "tombstone", "producer", "segment", "seq")).alias("r")
    )
    return latest.select("topic", "partition", "key", "r.*")


def highest_sequences(records: DataFrame) -> DataFrame:
    """Per (topic, partition, producer) the highest (segment, seq) any record of it carries."""
    stamped = records.where(F.col("producer").isNotNull())
    top = stamped.groupBy("topic", "partition", "producer").agg(
        F.max(F.struct("segment", "seq", "offset")).alias("top")
    )
    return top.select(
        "topic",
        "partition",
        "producer",
        F.col("top.segment").alias("topic_segment"),
        F.col("top.seq").alias("topic_seq"),
        F.col("top.offset").alias("topic_offset"),
    )
