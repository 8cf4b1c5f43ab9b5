"""Restore events of the state tables, like Kafka Streams' StateRestoreListener: start,
batches, end (records restored, duration) per changelog partition, as log lines and
metrics; and, per changelog partition, the schema ids its values carry with the first
offset of each, for the post-restore subject check.

Fed by the tables (`StateTable`): every changelog record Faust reads (active restore and
standby replication alike) and every batch it applies to RocksDB.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import faust
from faust.types import TP

from kdiv.state.framing import schema_id_of

log = logging.getLogger("kdiv.restore")


@dataclass
class PartitionRestore:
    """What one changelog partition's restore has read so far."""

    changelog: str
    partition: int
    started_ms: int
    start_offset: int
    end_offset: int | None  # the highwater Faust restores up to (None for standbys)
    records: int = 0
    batches: int = 0
    last_offset: int = -1


@dataclass
class RestoreTotals:
    """Restore counts of the worker's life, for the metrics."""

    records: int = 0
    batches: int = 0
    completed: int = 0
    last_duration_ms: int = 0


@dataclass
class RestoreListener:
    """Hears the changelog records a table restore applies: progress, timing, schema ids seen."""

    clock: Callable[[], int]  # ms
    # (changelog, partition) -> the restore under way
    active: dict[tuple[str, int], PartitionRestore] = field(default_factory=dict)
    totals: RestoreTotals = field(default_factory=RestoreTotals)
    # (changelog, partition) -> schema id -> first offset carrying it
    schema_ids: dict[tuple[str, int], dict[int, int]] = field(default_factory=dict)
    # Set when a changelog record shows an id not seen before (the check looks again).
    new_ids: bool = False
    unframed: int = 0

    def on_record(
        self, changelog: str, partition: int, offset: int, value: bytes | None, highwater: int | None
    ) -> None:
        """Count one restored changelog record and note its schema id."""
        tp = (changelog, partition)
        restore = self.active.get(tp)
        if restore is None:
            restore = self.active[tp] = PartitionRestore(changelog, partition, self.clock(), offset, highwater)
            log.info(
                "restore start: %s[%d] from offset %d to %s",
                changelog,
                partition,
                offset,
                "the end" if highwater is None else highwater,
            )
        restore.records += 1
        restore.last_offset = offset
        if value is None:
            return
        schema_id = schema_id_of(value)
        if schema_id is None:
            self.unframed += 1
            return
        ids = self.schema_ids.setdefault(tp, {})
        if schema_id not in ids:
            ids[schema_id] = offset
            self.new_ids = True

    def on_bulk(self, changelog: str, partition: int, records: list[tuple[int, bytes | None]], end: int) -> None:
        """Count a slice of changelog records (offset, value) restored in bulk up to `end`,
        and note their schema ids: as `on_record` for each and `on_batch` for all."""
        first, last = records[0][0], records[-1][0]
        tp = (changelog, partition)
        restore = self.active.get(tp)
        if restore is None:
            restore = self.active[tp] = PartitionRestore(changelog, partition, self.clock(), first, end)
            log.info("restore start: %s[%d] from offset %d to %d", changelog, partition, first, end)
        restore.records += len(records)
        restore.batches += 1
        restore.last_offset = last
        self.totals.batches += 1
        self.totals.records += len(records)
        ids = self.schema_ids.setdefault(tp, {})
        seen = -1
        for offset, value in records:
            if value is None:
                continue
            schema_id = schema_id_of(value)
            if schema_id is None:
                self.unframed += 1
            elif schema_id != seen:  # a run of one id: looked up once
                seen = schema_id
                if schema_id not in ids:
                    ids[schema_id] = offset
                    self.new_ids = True

    def on_batch(self, changelog: str, partitions: Iterable[int], size: int) -> None:
        """Note a batch of restored records."""
        self.totals.batches += 1
        self.totals.records += size
        for partition in set(partitions):
            restore = self.active.get((changelog, partition))
            if restore is not None:
                restore.batches += 1
                log.debug(
                    "restore batch: %s[%d] up to offset %d, %d records so far",
                    changelog,
                    partition,
                    restore.last_offset,
                    restore.records,
                )

    def on_end(self, changelog: str, partitions: Iterable[int]) -> list[PartitionRestore]:
        """Active recovery of these changelog partitions completed."""
        ended = []
        now = self.clock()
        for partition in sorted(partitions):
            restore = self.active.pop((changelog, partition), None)
            if restore is None:
                continue
            duration = now - restore.started_ms
            self.totals.completed += 1
            self.totals.last_duration_ms = duration
            log.info(
                "restore end: %s[%d] %d records (offsets %d..%d) in %.3f s",
                changelog,
                partition,
                restore.records,
                restore.start_offset,
                restore.last_offset,
                duration / 1000,
            )
            ended.append(restore)
        return ended

    def first_offsets(self, changelog: str) -> dict[int, tuple[int, int]]:
        """schema id -> (partition, first offset) over the changelog's partitions."""
        found: dict[int, tuple[int, int]] = {}
        for (topic, partition), ids in sorted(self.schema_ids.items()):
            if topic != changelog:
                continue
            for schema_id, offset in ids.items():
                if schema_id not in found:
                    found[schema_id] = (partition, offset)
        return found


class StateTable(faust.Table):
    """A Faust table that reports its changelog batches to a RestoreListener."""

    restore_listener: RestoreListener | None = None

    def apply_changelog_batch(self, batch: Iterable) -> None:
        """Faust's restore of a batch, told to the restore listener first."""
        batch = list(batch)
        if self.restore_listener is not None and batch:
            self.restore_listener.on_batch(
                self.changelog_topic.get_topic_name(), (event.message.partition for event in batch), len(batch)
            )
        super().apply_changelog_batch(batch)


def changelog_partitions(tps: Iterable[TP], changelog: str) -> list[int]:
    """The partitions of `changelog` among restored topic partitions."""
    return sorted(tp.partition for tp in tps if tp.topic == changelog)
