"""The aggregates report.html and summary.json are drawn from, computed in Spark.

Findings and the sequence comparison can be as large as the topics; what reaches the driver
is bounded: counts per (topic, class) and per (topic, partition, class), a time histogram of
about TIME_BINS_MAX bins per class, and capped samples of rows. Every sample is taken in a
total order, so the same findings give the same sample whatever their partitioning.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Row, Window
from pyspark.sql import functions as F

from kdiv.clock import LAST_RENDERABLE_MS
from kdiv.reconcile.compare import SEQUENCE_FIELDS
from kdiv.reconcile.findings import CHECKSUM_FIELDS, ROUTE_FIELDS
from kdiv.reconcile.summary import ClassCount

# Caps that keep the page readable and the driver's share small whatever the findings' number.
FINDINGS_SHOWN_PER_CLASS = 50
SEQUENCE_ROWS_SHOWN = 200
TIME_BINS_MAX = 60

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
# Round widths a reader can take in at a glance; the narrowest that fits TIME_BINS_MAX bins wins.
_BIN_WIDTHS_MS = (
    SECOND_MS,
    10 * SECOND_MS,
    MINUTE_MS,
    5 * MINUTE_MS,
    15 * MINUTE_MS,
    HOUR_MS,
    3 * HOUR_MS,
    6 * HOUR_MS,
    12 * HOUR_MS,
    DAY_MS,
    7 * DAY_MS,
    30 * DAY_MS,
    365 * DAY_MS,
)


def class_counts(findings: DataFrame) -> list[ClassCount]:
    rows = (
        findings.groupBy("topic", "class")
        .agg(F.count(F.lit(1)).alias("findings"), F.sum("count").alias("records"))
        .collect()
    )
    return sorted(ClassCount(r["topic"], r["class"], r["findings"], r["records"] or 0) for r in rows)


def partition_counts(findings: DataFrame) -> list[tuple[str, int, str, int]]:
    """(topic, partition, class, finding rows), sorted."""
    rows = findings.groupBy("topic", "partition", "class").count().collect()
    return sorted((r["topic"], r["partition"], r["class"], r["count"]) for r in rows)


@dataclass(frozen=True)
class Timeline:
    """Findings per class in bins of record time; `untimed` of the `total` have no time a date
    can show and are in no bin."""

    untimed: int
    total: int
    bin_width_ms: int
    first_bin_ms: int
    last_bin_ms: int
    # (class, bin start ms) -> findings
    counts: dict[tuple[str, int], int]


def timeline(findings: DataFrame) -> Timeline:
    timestamp = F.col("timestamp_ms")
    # A time no date can show (a producer clock gone wrong) is not plotted: it would stretch
    # the axis past what the plot's dates hold.
    timed = (timestamp >= 0) & (timestamp <= LAST_RENDERABLE_MS)
    stats = findings.agg(
        F.min(F.when(timed, timestamp)).alias("first"),
        F.max(F.when(timed, timestamp)).alias("last"),
        F.count(F.when(~timed, 1)).alias("untimed"),
        F.count(F.lit(1)).alias("total"),
    ).first()
    assert stats is not None, "an aggregation without grouping has one row"
    if stats["first"] is None:
        return Timeline(stats["untimed"], stats["total"], 0, 0, 0, {})
    width = bin_width_ms(stats["last"] - stats["first"])
    rows = findings.where(timed).groupBy((timestamp - timestamp % width).alias("bin"), "class").count().collect()
    return Timeline(
        stats["untimed"],
        stats["total"],
        width,
        stats["first"] - stats["first"] % width,
        stats["last"] - stats["last"] % width,
        {(r["class"], r["bin"]): r["count"] for r in rows},
    )


def bin_width_ms(span_ms: int) -> int:
    for width in _BIN_WIDTHS_MS:
        if span_ms // width < TIME_BINS_MAX:
            return width
    days = -(-span_ms // (TIME_BINS_MAX * DAY_MS)) + 1
    return days * DAY_MS


# Every column, so the ranking is a total order and the sample the same on every run.
_FINDING_ORDER = (
    "topic",
    "partition",
    "offset",
    "key",
    "producer",
    "segment",
    "seq",
    "timestamp_ms",
    "count",
    "schema_id",
    "expected_subject",
    "registered_subjects",
    "detail",
    *CHECKSUM_FIELDS,
    # The copies are a list: the other columns order the findings of routes fully without them.
    *(name for name in ROUTE_FIELDS if name != "copies"),
)


def first_findings(findings: DataFrame) -> dict[str, list[Row]]:
    """Up to FINDINGS_SHOWN_PER_CLASS rows of each class, in topic, partition, offset order."""
    ranking = Window.partitionBy("class").orderBy(*_FINDING_ORDER)
    rows = (
        findings.withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= FINDINGS_SHOWN_PER_CLASS)
        .collect()
    )
    by_class: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda r: (r["class"], r["rank"])):
        by_class.setdefault(row["class"], []).append(row)
    return by_class


@dataclass(frozen=True)
class SequenceSample:
    """How many producer-partitions were compared and are behind, and the first rows to show."""

    total: int
    behind: int
    rows: list[Row]


def sequence_sample(sequences: DataFrame) -> SequenceSample:
    """Up to SEQUENCE_ROWS_SHOWN rows of SEQUENCE_FIELDS, those behind first."""
    stats = sequences.agg(F.count(F.lit(1)).alias("total"), F.count(F.when(F.col("behind"), 1)).alias("behind")).first()
    assert stats is not None, "an aggregation without grouping has one row"
    rows = (
        sequences.orderBy(F.col("behind").desc_nulls_last(), *SEQUENCE_FIELDS[:-1]).limit(SEQUENCE_ROWS_SHOWN).collect()
    )
    return SequenceSample(stats["total"], stats["behind"], rows)
