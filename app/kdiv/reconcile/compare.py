"""Validator tables vs topics at rest: the per-key classes and the per-producer sequences.

Inputs are one consistent snapshot: the changelogs' ends were planned before the topics'
(kdiv.reconcile.job), so every record the tables mention lies below the topic snapshot's end.

Per key of a compacted topic (ledger L: last validated record; topic T: latest record now;
V: the partition's validated-to offset):
- L without T: LOST unless L was a tombstone (compaction may drop tombstones).
- T older than L: LOST (the validated record, or all after T, is gone).
- T at L's offset with another CRC32: DIVERGED.
- T newer than L, or T without L, at or below V: UNVALIDATED (the validator passed that
  offset without seeing this record). Above V it is ahead of the validator: not a finding.
Records compaction superseded are never looked at: only latest-per-key records compare.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kdiv.reconcile.findings import (
    DIVERGED,
    FINDING_FIELDS,
    LOST,
    SEQUENCE_BEHIND,
    UNVALIDATED,
)
from kdiv.reconcile.state import KEY, PARTITION, PRODUCER

# The per producer-partition sequence comparison's columns, as the report keeps them.
SEQUENCE_FIELDS = (
    "topic",
    "partition",
    "producer",
    "topic_segment",
    "topic_seq",
    "table_segment",
    "table_seq",
    "behind",
)


def _finding(
    cls: Column | str, offset: Column, producer: Column, segment: Column, seq: Column, timestamp: Column, detail: Column
) -> list[Column]:
    columns = {
        "class": F.lit(cls) if isinstance(cls, str) else cls,
        "topic": F.col("topic"),
        "partition": F.col("partition").cast("int"),
        "offset": offset.cast("long"),
        "key": F.col("key"),
        "producer": producer,
        "segment": segment.cast("long"),
        "seq": seq.cast("long"),
        "timestamp_ms": F.coalesce(timestamp.cast("long"), F.lit(-1).cast("long")),
        "count": F.lit(1).cast("long"),
        "schema_id": F.lit(None).cast("long"),
        "expected_subject": F.lit(None).cast("string"),
        "registered_subjects": F.lit(None).cast("array<string>"),
        "detail": detail,
    }
    return [columns[name].alias(name) for name in FINDING_FIELDS]


def compare_keys(topic_latest: DataFrame, state: DataFrame, compacted_topics: list[str]) -> DataFrame:
    """Findings of the key classes. `topic_latest`: kdiv.reconcile.topics.latest_per_key of the
    compacted topics' keyed data records; `state`: kdiv.reconcile.state.decoded_state rows."""
    ledger = (
        state.where(F.col("kind") == KEY)
        .where(F.col("topic").isin(compacted_topics))
        .select(
            "topic",
            "partition",
            "key",
            *(
                F.col(c).alias(f"l_{c}")
                for c in ("offset", "timestamp_ms", "crc", "tombstone", "producer", "segment", "seq")
            ),
        )
    )
    validated_to = state.where(F.col("kind") == PARTITION).select(
        "topic", "partition", F.col("offset").alias("validated_to")
    )
    at_rest = topic_latest.select(
        "topic",
        "partition",
        "key",
        *(
            F.col(c).alias(f"t_{c}")
            for c in ("offset", "timestamp_ms", "crc", "tombstone", "producer", "segment", "seq")
        ),
    )
    joined = ledger.join(at_rest, ["topic", "partition", "key"], "full_outer").join(
        validated_to, ["topic", "partition"], "left"
    )
    seen, held = F.col("l_offset").isNotNull(), F.col("t_offset").isNotNull()
    below_validated = F.col("t_offset") <= F.coalesce(F.col("validated_to"), F.lit(-1))
    lost_gone = seen & ~held & ~F.col("l_tombstone")
    lost_older = seen & held & (F.col("t_offset") < F.col("l_offset"))
    diverged = seen & held & (F.col("t_offset") == F.col("l_offset")) & (F.col("t_crc") != F.col("l_crc"))
    unvalidated = held & below_validated & (~seen | (F.col("t_offset") > F.col("l_offset")))
    cls = (
        F.when(lost_gone | lost_older, F.lit(LOST))
        .when(diverged, F.lit(DIVERGED))
        .when(unvalidated, F.lit(UNVALIDATED))
    )
    judged = joined.withColumn("cls", cls).where(F.col("cls").isNotNull())
    on_ledger = F.col("cls") != UNVALIDATED
    detail = (
        F.when(lost_gone, F.format_string("validated at offset %d; the key is gone, without a tombstone", "l_offset"))
        .when(
            lost_older,
            F.format_string(
                "validated at offset %d; the topic now holds only offset %d for the key", "l_offset", "t_offset"
            ),
        )
        .when(
            diverged,
            F.format_string("record at offset %d has CRC32 %d, validated with %d", "t_offset", "t_crc", "l_crc"),
        )
        .otherwise(
            F.when(
                seen,
                F.format_string(
                    "record at offset %d was never validated (validated to %d; last validated for the key: offset %d)",
                    "t_offset",
                    "validated_to",
                    "l_offset",
                ),
            ).otherwise(
                F.format_string(
                    "record at offset %d was never validated (validated to %d; the key was never seen)",
                    "t_offset",
                    "validated_to",
                )
            )
        )
    )
    pick = lambda name: F.when(on_ledger, F.col(f"l_{name}")).otherwise(F.col(f"t_{name}"))  # noqa: E731
    return judged.select(
        *_finding(
            F.col("cls"), pick("offset"), pick("producer"), pick("segment"), pick("seq"), pick("timestamp_ms"), detail
        )
    )


def compare_sequences(
    topic_sequences: DataFrame, state: DataFrame, compacted_topics: list[str]
) -> tuple[DataFrame, DataFrame]:
    """(sequence comparison rows, SEQUENCE_BEHIND findings).

    Every producer the table holds, beside its highest (segment, seq) in the topic. A topic
    behind the table is a finding only where nothing may remove records after they were
    validated: on compacted topics superseded records go legitimately, and the key
    classes speak for what they keep.
    """
    table = state.where(F.col("kind") == PRODUCER).select(
        "topic",
        "partition",
        "producer",
        F.col("segment").alias("table_segment"),
        F.col("seq").alias("table_seq"),
        F.col("offset").alias("table_offset"),
    )
    rows = table.join(topic_sequences, ["topic", "partition", "producer"], "left")
    behind = (
        F.col("topic_segment").isNull()
        | (F.col("topic_segment") < F.col("table_segment"))
        | ((F.col("topic_segment") == F.col("table_segment")) & (F.col("topic_seq") < F.col("table_seq")))
    )
    rows = rows.withColumn("behind", behind).select(*SEQUENCE_FIELDS, "table_offset")
    findings = rows.where(F.col("behind") & ~F.col("topic").isin(compacted_topics)).withColumn(
        "key", F.lit(None).cast("binary")
    )
    detail = F.when(
        F.col("topic_segment").isNull(),
        F.format_string(
            "the table holds segment %d seq %d (offset %d); the topic holds no record of the producer",
            "table_segment",
            "table_seq",
            "table_offset",
        ),
    ).otherwise(
        F.format_string(
            "the table holds segment %d seq %d (offset %d); the topic's highest is segment %d seq %d",
            "table_segment",
            "table_seq",
            "table_offset",
            "topic_segment",
            "topic_seq",
        )
    )
    findings = findings.select(
        *_finding(
            SEQUENCE_BEHIND,
            F.col("table_offset"),
            F.col("producer"),
            F.col("table_segment"),
            F.col("table_seq"),
            F.lit(None),
            detail,
        )
    )
    return rows.drop("table_offset"), findings
