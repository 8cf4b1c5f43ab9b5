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

from kdiv.div.wire import (
    COMMON_FIELD_POSITIONS,
    COMMON_SIZE,
    EOS_FINAL_FLAG_POSITION,
    FORMAT_VERSION,
    HEADER_NAME,
    IMPLICIT_SEGMENT_VERSION,
    SIZE_BY_KIND,
    SOS_CHECKSUM_TYPE_POSITION,
    ChecksumType,
    Kind,
)


def _int32_be(length: Column) -> Column:
    return F.unhex(F.lpad(F.hex(length), 8, "0"))


def _length_and_bytes(column: Column) -> Column:
    # Column expressions need a running session, so none is built at import.
    return F.when(column.isNull(), F.unhex(F.lit("FFFFFFFF"))).otherwise(F.concat(_int32_be(F.length(column)), column))


def at_rest_crc(key: Column, value: Column) -> Column:
    return F.crc32(F.concat(F.unhex(F.lit(f"{int(Kind.DATA):02X}")), _length_and_bytes(key), _length_and_bytes(value)))


def unsigned_at(raw: Column, position: tuple[int, int]) -> Column:
    """The big-endian unsigned integer at (byte offset, size) of a binary column."""
    offset, size = position
    # substring is 1-based.
    return F.conv(F.hex(F.substring(raw, offset + 1, size)), 16, 10).cast("long")


def _field(raw: Column, name: str) -> Column:
    return unsigned_at(raw, COMMON_FIELD_POSITIONS[name])


def readable_div_header(records_headers: Column) -> Column:
    """The value of a record's one decodable `div` header, else null: kdiv.div.wire's rule
    (`readable_div_header`) as a column, from the same layout constants."""
    divs = F.filter(records_headers, lambda h: h["key"] == HEADER_NAME)
    raw = F.when(F.size(divs) == 1, divs[0]["value"])
    kind = _field(raw, "kind")
    expected_size = F.lit(None).cast("int")
    for known, size in SIZE_BY_KIND.items():
        expected_size = F.when(kind == int(known), F.lit(size)).otherwise(expected_size)
    checksum_types = [int(c) for c in ChecksumType]
    readable = (
        (F.length(raw) >= COMMON_SIZE)
        & (
            (_field(raw, "version") == FORMAT_VERSION)
            # Version 2: a DATA record of an implicit segment, version 1's DATA layout.
            | ((_field(raw, "version") == IMPLICIT_SEGMENT_VERSION) & (kind == int(Kind.DATA)))
        )
        & (F.length(raw) == expected_size)
        & F.when(
            kind == int(Kind.START_OF_SEGMENT), unsigned_at(raw, SOS_CHECKSUM_TYPE_POSITION).isin(checksum_types)
        ).otherwise(True)
        & F.when(kind == int(Kind.END_OF_SEGMENT), unsigned_at(raw, EOS_FINAL_FLAG_POSITION) <= 1).otherwise(True)
    )
    return F.when(readable, raw)


def with_div_fields(records: DataFrame) -> DataFrame:
    """Adds div_kind, producer (GUID hex), segment, seq from the record's readable `div`
    header (nulls otherwise: none, several, null or malformed, as for the validator)."""
    raw = readable_div_header(F.col("headers"))
    guid_offset, guid_size = COMMON_FIELD_POSITIONS["guid"]
    return records.withColumns(
        {
            "div_kind": _field(raw, "kind").cast("int"),
            "producer": F.lower(F.hex(F.substring(raw, guid_offset + 1, guid_size))),
            "segment": _field(raw, "segment"),
            "seq": _field(raw, "seq"),
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
