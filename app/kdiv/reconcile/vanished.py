"""Records deleted between the snapshot and the read: what the job could not read, reported.

The snapshot fixes each partition's offsets [start, end) when the job starts; the reads come
later. Records deleted from a partition's head meanwhile (DeleteRecords, retention; a
compacted topic's too) are gone when a reader gets there: both sources then read on from the
partition's new start (Spark's connector with failOnDataLoss=false, kdiv's own source by
moving to the log start the broker reports), and the job says what it missed.

Each read piece (Spark's connector: a partition's range; kdiv's source: a split, see
`kdiv.reconcile.kafka_source.plan_splits`) starts at a planned offset and reads forward, so
what it missed of its head is the offsets before the first record it read. Of those, the ones
below the partition's log start after the read are gone: offsets [piece start, min(first read,
log start now)) vanished before they could be read. Offsets the log still holds were compaction
gaps or transaction markers, not records lost to the read.

Executors never import this module; the Spark part runs on the driver's DataFrames.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kdiv.reconcile.snapshot import PartitionRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from kdiv.config.security import KafkaSecurity

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, order=True)
class Vanished:
    """Offsets [start, end) of a partition, planned but gone before they could be read."""

    topic: str
    partition: int
    start: int
    end: int
    # The partition's log start offset after the read.
    log_start: int

    def to_json(self) -> dict:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "from": self.start,
            "to": self.end,
            "log_start": self.log_start,
        }


def pieces_of(ranges: Iterable[PartitionRange], source: str, max_records_per_split: int) -> list[PartitionRange]:
    """The pieces `source` reads `ranges` in: kdiv's splits, or a range each for Spark's."""
    ranges = [r for r in ranges if r.end > r.start]
    if source != "python":
        return ranges
    from kdiv.reconcile.kafka_source import plan_splits

    return [PartitionRange(s.topic, s.partition, s.start, s.end) for s in plan_splits(ranges, max_records_per_split)]


def moved(ranges: Iterable[PartitionRange], log_starts: Mapping[TopicPartitionKey, int]) -> list[PartitionRange]:
    """The planned ranges whose partition's log now starts past their start."""
    return [r for r in ranges if r.end > r.start and log_starts.get((r.topic, r.partition), r.start) > r.start]


def vanished_ranges(
    pieces: Sequence[PartitionRange],
    first_read: Mapping[int, int],
    log_starts: Mapping[TopicPartitionKey, int],
) -> list[Vanished]:
    """Per partition, the offsets planned, not read, and now below its log start; adjacent
    ranges merged. `first_read`: piece index -> the lowest offset read in it (none read:
    absent)."""
    found: list[Vanished] = []
    for index, piece in enumerate(pieces):
        log_start = log_starts.get((piece.topic, piece.partition))
        if log_start is None:
            continue
        end = min(first_read.get(index, piece.end), log_start, piece.end)
        if end > piece.start:
            found.append(Vanished(piece.topic, piece.partition, piece.start, end, log_start))
    merged: list[Vanished] = []
    for v in sorted(found):
        last = merged[-1] if merged else None
        if last is not None and (last.topic, last.partition) == (v.topic, v.partition) and last.end >= v.start:
            merged[-1] = Vanished(v.topic, v.partition, last.start, max(last.end, v.end), v.log_start)
        else:
            merged.append(v)
    return merged


def first_offsets(frames: Iterable[DataFrame], pieces: Sequence[PartitionRange]) -> dict[int, int]:
    """Piece index -> the lowest offset any of `frames` (records with topic, partition,
    offset, read from the pieces) holds in it. One small aggregation per frame."""
    from pyspark.sql import functions as F

    if not pieces:
        return {}
    index = F.lit(None).cast("int")
    for i, p in reversed(list(enumerate(pieces))):
        inside = (
            (F.col("topic") == p.topic)
            & (F.col("partition") == p.partition)
            & (F.col("offset") >= p.start)
            & (F.col("offset") < p.end)
        )
        index = F.when(inside, F.lit(i)).otherwise(index)
    topics = sorted({p.topic for p in pieces})
    found: dict[int, int] = {}
    for frame in frames:
        rows = (
            frame.where(F.col("topic").isin(topics))
            .select(index.alias("piece"), "offset")
            .where(F.col("piece").isNotNull())
            .groupBy("piece")
            .agg(F.min("offset").alias("first"))
            .collect()
        )
        for row in rows:
            piece, first = int(row["piece"]), int(row["first"])
            found[piece] = min(found.get(piece, first), first)
    return found


async def log_starts(
    bootstrap: str, partitions: Iterable[TopicPartitionKey], *, security: KafkaSecurity | None = None
) -> dict[TopicPartitionKey, int]:
    """Each partition's log start offset now (a partition the cluster no longer has: absent)."""
    from aiokafka import TopicPartition

    from kdiv.config.security import PLAINTEXT
    from kdiv.kafka.consume import partitions_by_topic, standalone_consumer

    consumer = standalone_consumer(bootstrap, security=security or PLAINTEXT)
    await consumer.start()
    try:
        known = await partitions_by_topic(consumer)
        tps = [TopicPartition(t, p) for t, p in sorted(set(partitions)) if p in known.get(t, ())]
        starts = await consumer.beginning_offsets(tps) if tps else {}
    finally:
        await consumer.stop()
    return {(tp.topic, tp.partition): offset for tp, offset in starts.items()}
