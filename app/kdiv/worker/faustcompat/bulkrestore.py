"""The tables' restore in bulk, and its check: a table partition is whole when its store has
read its changelog to the end offset read at assignment, as kdiv saw it, not as Faust says.

Faust restores a changelog record by record through its recovery queue, and after each one
asks every assigned changelog partition how much is left: with 1,000 partitions a takeover of
a million producer states read 850 records a second (20 minutes). Faust also said "Recovery
complete" with most of the state still unread after a rejoin during the restore.

kdiv restores first, in the recovery's own task (`KdivRecovery`, once Faust has read the end
offsets and before it plans its reads): a consumer of its own reads each assigned active
changelog partition from the store's persisted offset to that end, and each fetched slice goes
into the partition's RocksDB in one write batch with the persisted offset of its last record,
as Kafka Streams restores through write batches since KIP-167. Faust then finds nothing left
and resumes the streams. What kdiv could not read (a broker that stopped answering, a rejoin)
Faust reads, from the persisted offset on; then, before a partition's state is loaded,
`ensure_whole` checks it against the end read at assignment and reads what is still missing.
Until then the partition is `recovering` (`BulkRestore.remaining`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP

from kdiv.worker.faustcompat.stores import PartitionDB, keep_memtables_within, partition_db
from kdiv.worker.turns import loop_turns

log = logging.getLogger("kdiv.restore")

# Records a fetch returns at most: one write batch per partition per slice, and the event loop
# (the /health page) served between slices.
SLICE_RECORDS = 20_000
# Between two attempts of `ensure_whole` that left records unread (a broker not answering).
RETRY_S = 1.0


class RestoredRecords(Protocol):
    """Who hears each slice of restored records (kdiv.worker.restore.RestoreListener)."""

    def on_bulk(self, changelog: str, partition: int, records: list[tuple[int, bytes | None]], end: int) -> None: ...


@dataclass
class Target:
    """One changelog partition's restore: the end offset read at assignment, and how far its
    store has read (the offset after its last record applied)."""

    end: int
    position: int

    @property
    def remaining(self) -> int:
        return max(self.end - self.position, 0)


@dataclass
class BulkRestore:
    """What the restore in bulk needs, and where each assigned changelog partition stands."""

    new_consumer: Callable[[], AIOKafkaConsumer]
    listener: RestoredRecords
    # A fetch that brings nothing for this long ends this attempt (a broker that stopped
    # answering); what is left is read again by Faust, then by `ensure_whole`.
    idle_timeout_s: float
    targets: dict[TP, Target] = field(default_factory=dict)
    # Set while a restore in bulk reads: recovering, whatever Faust says.
    running: bool = False

    def remaining(self, tps: Iterable[TP] | None = None) -> int:
        """Changelog records left to restore for the assigned active partitions (those of `tps`)."""
        targets = self.targets
        chosen = targets.values() if tps is None else (targets[tp] for tp in tps if tp in targets)
        return sum(t.remaining for t in chosen)

    def is_whole(self, tp: TP) -> bool:
        target = self.targets.get(tp)
        return target is not None and target.remaining == 0

    def keep_only(self, tps: Iterable[TP]) -> None:
        """Forget targets of changelog partitions no longer assigned as actives."""
        keep = set(tps)
        for tp in [tp for tp in self.targets if tp not in keep]:
            del self.targets[tp]


class KdivRecovery(Recovery):
    """Faust's recovery, with the stores opened and restored in bulk by kdiv before Faust plans
    its own reads.

    Faust opens every assigned partition's database inside the rebalance callback (reading
    its persisted offset), during which the group gets no heartbeat: 1,000 databases took 10 s
    against a session of 6 s, and a lone worker was thrown out of its group and joined again at
    every start. Here the callback only notes the partitions; their databases are opened in
    the recovery's own task, the event loop served between them."""

    bulk: BulkRestore | None = None

    def _add(self, table: Any, tp: TP, offsets: Any) -> None:
        # Faust's, without the persisted offset (read with the database opened, below).
        self.tp_to_table[tp] = table
        offsets.setdefault(tp, None)

    async def _build_offsets(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
        tables = {tp: self.tp_to_table[tp] for tp in tps if tp in self.tp_to_table}
        await open_stores(tables, self.app.consumer_generation_id)
        bulk = self.bulk
        if title == "active" and bulk is not None:
            bulk.keep_only(tps)
            ends = {tp: highwater + 1 for tp, highwater in self.active_highwaters.items() if tp in tps}
            await restore_in_bulk(bulk, tables, ends)
        for tp, table in tables.items():
            persisted = persisted_offset(table, tp)
            if persisted is not None and (destination.get(tp) is None or destination[tp] < persisted):
                destination[tp] = persisted
        await super()._build_offsets(consumer, tps, destination, title)


async def open_stores(tables: Mapping[TP, Any], generation_id: int) -> None:
    """Open each table partition not open yet: its part of its table's database, the database
    itself at the first (with Faust's retries while another process still holds its lock),
    the event loop given turns between them."""
    turns = loop_turns()
    for tp, table in tables.items():
        store = table.data
        if isinstance(store, RocksDBStore) and tp.partition not in store._dbs:
            await store._try_open_db_for_partition(tp.partition, generation_id=generation_id)
            await turns.pause_if_due()


class KdivTableManager(TableManager):
    """Faust's table manager with `KdivRecovery`."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = KdivRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


def bulk_restore_of(app: Any) -> BulkRestore | None:
    recovery = app.tables.recovery
    return recovery.bulk if isinstance(recovery, KdivRecovery) else None


def install_bulk_restore(app: Any, bulk: BulkRestore) -> None:
    """Restore the app's tables in bulk (its TableManager must be `KdivTableManager`)."""
    recovery = app.tables.recovery
    if not isinstance(recovery, KdivRecovery):
        raise TypeError("the app's TableManager is not KdivTableManager: restores in bulk need its recovery")
    recovery.bulk = bulk


def persisted_offset(table: Any, tp: TP) -> int | None:
    """The offset of the last changelog record the table partition's store applied."""
    return table.persisted_offset(tp)


def _advance_to_store(target: Target, table: Any, tp: TP) -> None:
    """The target's position moved to where the store has read (after its persisted offset)."""
    persisted = persisted_offset(table, tp)
    if persisted is not None:
        target.position = max(target.position, min(persisted + 1, target.end))


async def restore_in_bulk(bulk: BulkRestore, tables: Mapping[TP, Any], ends: Mapping[TP, int]) -> None:
    """Read each changelog partition of `tables` from its store's persisted offset to its end
    in `ends` into the store; its target is recorded first, so it is `recovering` until
    read. A partition of a table not in kdiv's store is left to Faust."""
    todo: dict[TP, tuple[Any, PartitionDB, int]] = {}
    for tp, table in tables.items():
        end = ends.get(tp)
        if end is None or end < 0:
            continue
        target = bulk.targets.get(tp)
        if target is None or target.end < end:
            bulk.targets[tp] = target = Target(end, 0)
        _advance_to_store(target, table, tp)
        db = partition_db(table, tp.partition)
        if db is not None and target.remaining:
            todo[tp] = (table, db, target.end)
    if not todo:
        return
    bulk.running = True
    started = time.monotonic()
    total = sum(bulk.targets[tp].remaining for tp in todo)
    log.info("restore in bulk: %d changelog offsets of %d partitions to read", total, len(todo))
    try:
        read = await _read_into_stores(bulk, todo)
    finally:
        bulk.running = False
    left = bulk.remaining(todo)
    took = time.monotonic() - started
    if left:
        log.warning(
            "restore in bulk stopped after %.1f s with %d changelog records read, %d offsets left; the rest is "
            "read before the partitions are loaded",
            took,
            read,
            left,
        )
    else:
        log.info("restore in bulk: %d changelog records in %.1f s", read, took)


async def _read_into_stores(bulk: BulkRestore, todo: dict[TP, tuple[Any, PartitionDB, int]]) -> int:
    consumer = bulk.new_consumer()
    await consumer.start()
    read = 0
    try:
        topic_partitions = {TopicPartition(tp.topic, tp.partition): tp for tp in todo}
        consumer.assign(list(topic_partitions))
        for tp_, tp in topic_partitions.items():
            consumer.seek(tp_, bulk.targets[tp].position)
        waiting = set(topic_partitions)
        last_progress = time.monotonic()
        while waiting:
            fetched = await consumer.getmany(*waiting, timeout_ms=500, max_records=SLICE_RECORDS)
            moved = False
            for tp_, records in fetched.items():
                tp = topic_partitions[tp_]
                table, db, end = todo[tp]
                records = [r for r in records if r.offset < end]
                if records:
                    _apply(table, db, records)
                    read += len(records)
                    bulk.listener.on_bulk(tp.topic, tp.partition, [(r.offset, r.value) for r in records], end)
            for tp_ in list(waiting):
                tp = topic_partitions[tp_]
                target = bulk.targets[tp]
                position = await consumer.position(tp_)
                if position > target.position:
                    target.position = min(position, target.end)
                    moved = True
                if target.position >= target.end:
                    waiting.discard(tp_)
            keep_memtables_within(table.data for table, _, _ in todo.values())
            now = time.monotonic()
            if moved:
                last_progress = now
            elif now - last_progress > bulk.idle_timeout_s:
                break
            await asyncio.sleep(0)  # /health between slices
    finally:
        await consumer.stop()
    return read


def _apply(table: Any, db: PartitionDB, records: list) -> None:
    """One write batch: the records' keys (a tombstone deletes), then the persisted offset of
    the last, so a crash keeps both or neither."""
    batch = db.batch()
    put, delete = batch.put, batch.delete
    for record in records:
        if record.value is None:
            delete(record.key)
        else:
            put(record.key, record.value)
    batch.put(table.data.offset_key, str(records[-1].offset).encode())
    db.write(batch)


async def ensure_whole(bulk: BulkRestore, tables: Mapping[TP, Any], *, still_wanted: Callable[[], bool]) -> None:
    """Before the partitions' state is loaded: read what their stores still lack of their
    changelogs up to the end read at assignment, again until none is missing or they are not
    wanted any more (a rejoin: the next assignment restores on)."""
    while still_wanted():
        missing = {tp: table for tp, table in tables.items() if not bulk.is_whole(tp)}
        if not missing:
            return
        ends = {tp: bulk.targets[tp].end for tp in missing if tp in bulk.targets}
        for tp, table in missing.items():
            if tp in bulk.targets:
                _advance_to_store(bulk.targets[tp], table, tp)
        left = bulk.remaining(missing)
        if not left:
            return
        log.warning(
            "the tables' restore reported complete with %d changelog records of %d partitions unread: reading them now",
            left,
            len(missing),
        )
        await restore_in_bulk(bulk, missing, ends)
        if any(not bulk.is_whole(tp) for tp in missing):
            await asyncio.sleep(RETRY_S)
