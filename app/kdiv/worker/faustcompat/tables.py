"""Writing Faust tables outside a stream: the partition a write belongs to, named explicitly.

Faust's Table and its RocksDB store take the partition of a write (changelog partition and
store) from the stream's current event (`faust.streams._current_event`). The worker writes
after validating whole fetched batches, without events, so it sets a stand-in carrying only
what they read of it: the source message's topic, partition and timestamp.

`write_partition` writes many keys of one partition at once, as Faust's per-key writes
would leave the store, the changelog and the persisted offset, in whole batches.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from faust.streams import _current_event
from faust.types import TP

from kdiv.worker.faustcompat.internals import send_counted_batches, track_topic
from kdiv.worker.faustcompat.stores import PartitionDB, SharedMemoryStore, partition_db
from kdiv.worker.turns import loop_turns

# Changes written (a RocksDB write batch and their changelog records) in one step: the event
# loop may get a turn between steps (`kdiv.worker.turns`); one takes a few ms.
WRITE_SLICE = 500


class _Message:
    __slots__ = ("offset", "partition", "timestamp", "topic", "tp")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.tp = TP(topic, partition)
        self.offset = -1
        self.timestamp = None


class _PartitionEvent:
    __slots__ = ("__weakref__", "message")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _Message(topic, partition)


@contextmanager
def writing_in_partition(topic: str, partition: int) -> Iterator[None]:
    """Table writes inside go to the changelog and store partition of (topic, partition)."""
    event = _PartitionEvent(topic, partition)  # held here: Faust keeps only a weak reference
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _current_event.reset(token)


async def write_partition(
    app: Any,
    table: Any,
    source_topic: str,
    partition: int,
    changes: Sequence[tuple[bytes, bytes | None]],
    *,
    again: bool = False,
) -> list[asyncio.Future]:
    """Write `changes` (key, value; None deletes) to one partition of a plain table with raw
        keys and values, as `table[key] = value` and `table.pop(key, None)` under
        `writing_in_partition(source_topic, partition)` would, one after the other; the futures
        of the changelog batches, to await before the source offsets commit.

        Faust's per-key write is a RocksDB put, a changelog send through its producer buffer and,
        per acknowledged record, a RocksDB write of the persisted offset: several times the cost
        of the audit's own work per trace. Here: one RocksDB write batch, the changelog records
        appended to aiokafka record batches (`send_counted_batches`), and per acknowledged batch
        the persisted offset of its last record, which recovery restores after. Faust's key index
        (a cache of key -> partition for reads outside a stream) is not fed: such a read looks in
        every partition instead. Deleting an absent key writes nothing, as in Faust, except `again`
    (a retry of a failed commit): the key may be absent because the failed attempt deleted it
    without its tombstone being acknowledged, so every delete sends its tombstone.

        Under exactly_once the changelog records belong to the source partition's transaction,
        which only Faust's producer joins: the writes then go through Faust, key by key, as they
        do for a table not in kdiv's store (`kdiv.worker.faustcompat.stores`).

        In slices of `WRITE_SLICE` changes, each one written to the store before its changelog
        records are sent, in order, the event loop run between them: the same writes in the
        same order, as a crash between two slices leaves a prefix of them.
    """
    if not changes:
        return []
    store = table.data
    if table.key_serializer != "raw" or table.value_serializer != "raw" or table.window is not None:
        raise TypeError(f"table {table.name}: batched writes are for plain tables of raw keys and values")
    db = None if app.in_transaction else partition_db(table, partition)
    futures: list[asyncio.Future] = []
    turns = loop_turns()
    for at in range(0, len(changes), WRITE_SLICE):
        if at:
            await turns.pause_if_due()  # /health and heartbeats between slices
        part = changes[at : at + WRITE_SLICE]
        if db is not None:
            futures += await _write_slice(app, table, store, db, partition, part, again)
        else:
            # Faust's producer sends these: their topic tracked first, as for the batched path.
            await track_topic(app, table.changelog_topic.get_topic_name())
            with writing_in_partition(source_topic, partition):
                for key, value in part:
                    if value is None:
                        table.pop(key, None)
                    else:
                        table[key] = value
    return futures


async def _write_slice(
    app: Any,
    table: Any,
    store: Any,
    db: PartitionDB,
    partition: int,
    changes: Sequence[tuple[bytes, bytes | None]],
    again: bool,
) -> list[asyncio.Future]:
    """One RocksDB write batch of `changes`, then their changelog records (`write_partition`)."""
    batch = db.batch()
    deleted = [] if again else [key for key, value in changes if value is None]
    records: Sequence[tuple[bytes, bytes | None]] = changes
    if not deleted:
        put, delete = batch.put, batch.delete
        for key, value in changes:
            if value is None:
                delete(key)  # `again`: its tombstone is sent whether or not the key is there
            else:
                put(key, value)
    else:
        # Whether each deleted key is in the store at its turn: Faust's pop sends no
        # tombstone for an absent key.
        found = db.get(deleted)  # one multi-get
        present = {key: value is not None for key, value in zip(deleted, found, strict=True)}
        records = []
        for key, value in changes:
            if value is None:
                if not present[key]:
                    continue
                batch.delete(key)
                present[key] = False
            else:
                batch.put(key, value)
                if key in present:
                    present[key] = True
            records.append((key, value))
        if not records:
            return []
    # The store first: a changelog record acknowledged but not in the store would be skipped
    # by the next recovery, which starts after the persisted offset.
    db.write(batch)
    tp = TP(table.changelog_topic.get_topic_name(), partition)
    sent = await send_counted_batches(app, tp.topic, partition, records)
    for future, count in sent:
        future.add_done_callback(_persist_offset(store, tp, count))
    return [future for future, _ in sent]


def partition_items(table: Any, partition: int) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) items of one partition of a plain raw table: that partition's keys
    alone, where `table.items()` reads every partition's."""
    db = partition_db(table, partition)
    if db is None:
        yield from table.items()  # the caller filters by partition
        return
    offset_key = table.data.offset_key  # Faust's own entry, not the table's
    for key, value in db.items():
        if key != offset_key:
            yield key, value


def partition_values(table: Any, partitions: Iterable[int]) -> Iterator[bytes]:
    """The values of these partitions of a plain raw table, read from their keys alone
    (Faust's own `values()` decodes every partition's through its serializer: a takeover of a
    million producer states spent seconds there). Faust's persisted offset is among them."""
    if not isinstance(table.data, SharedMemoryStore):
        yield from table.values()
        return
    for partition in partitions:
        db = partition_db(table, partition)
        if db is not None:
            yield from db.values()


def _persist_offset(store: Any, tp: TP, count: int) -> Any:
    def persist(future: asyncio.Future) -> None:
        # A failed batch persists nothing: the caller awaits the future and sees the error.
        if not future.cancelled() and future.exception() is None:
            store.set_persisted_offset(tp, future.result().offset + count - 1)

    return persist
