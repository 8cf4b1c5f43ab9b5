"""The tables' RocksDB: one database per table per worker, each table partition's keys under
its own prefix, within one memory budget.

Faust opens one RocksDB database per table partition. With 1,000 partitions that is 1,000
databases: about 200 KB of RocksDB's own structures each before a key is written, a WAL, a
manifest and a memtable each, and after a burst thousands of small table files (a million
producer states held 200-800 bytes each outside the Python heap, against 5 in one database),
and 1,000 opens at every takeover (about 10 s). Here a table's partitions share one database
(`PartitionDB`: each key after its partition's number, `kdiv.state.storekeys`, Faust's
persisted offset included), opened once, with one block cache and one memtable budget for the worker
(`KDIV_ROCKSDB_MEMTABLES_BYTES`, `KDIV_ROCKSDB_BLOCK_CACHE_BYTES`). A partition's keys are
read by one iterator bounded by its prefix; its writes go in one write batch as before.

Chosen by the store URL `kdiv-rocksdb://`; options as for Faust's `rocksdb://`, plus
`shared_cache_bytes` and `memtables_bytes`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast, overload

import rocksdict
from faust import stores
from faust.stores.rocksdb import RocksDBOptions, Store

from kdiv.state.storekeys import LAST_PARTITION, PREFIX_BYTES, partition_prefix

STORE_SCHEME = "kdiv-rocksdb"


class PartitionBatch:
    """One table partition's writes, to be written at once (`PartitionDB.write`)."""

    __slots__ = ("batch", "prefix")

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.batch = rocksdict.WriteBatch(raw_mode=True)

    def put(self, key: bytes, value: bytes) -> None:
        self.batch.put(self.prefix + key, value)

    def delete(self, key: bytes) -> None:
        self.batch.delete(self.prefix + key)

    def __len__(self) -> int:
        return len(self.batch)


class PartitionDB:
    """One table partition in its table's database: what Faust's store and kdiv's batched
    writes and restores ask of a partition's RocksDB, on the keys under its prefix."""

    __slots__ = ("_bounded", "db", "partition", "prefix")

    def __init__(self, db: rocksdict.Rdict, partition: int) -> None:
        self.db = db
        self.partition = partition
        self.prefix = partition_prefix(partition)
        # Iterators stop at the next partition's prefix (RocksDB's upper bound, exclusive).
        self._bounded = rocksdict.ReadOptions()
        if partition < LAST_PARTITION:
            self._bounded.set_iterate_upper_bound(partition_prefix(partition + 1))

    @overload
    def get(self, key: bytes) -> bytes | None: ...
    @overload
    def get(self, key: list[bytes]) -> list[bytes | None]: ...
    def get(self, key: bytes | list[bytes]) -> bytes | list[bytes | None] | None:
        """One key's value, or a list of keys' values in one multi-get."""
        prefix = self.prefix
        if isinstance(key, list):
            return self.db.get([prefix + k for k in key])
        return self.db.get(prefix + key)

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(self.prefix + key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(self.prefix + key)

    def key_may_exist(self, key: bytes) -> bool:
        return bool(self.db.key_may_exist(self.prefix + key))

    def batch(self) -> PartitionBatch:
        return PartitionBatch(self.prefix)

    def write(self, batch: PartitionBatch) -> None:
        if batch.prefix != self.prefix:
            raise ValueError(f"a write batch of another partition written to partition {self.partition}")
        self.db.write(batch.batch)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        cut = PREFIX_BYTES
        for key, value in self.db.items(from_key=self.prefix, read_opt=self._bounded):
            yield cast(bytes, key)[cut:], value  # a raw-mode database: bytes keys

    def keys(self) -> Iterator[bytes]:
        cut = PREFIX_BYTES
        for key in self.db.keys(from_key=self.prefix, read_opt=self._bounded):
            yield cast(bytes, key)[cut:]

    def values(self) -> Iterator[bytes]:
        return self.db.values(from_key=self.prefix, read_opt=self._bounded)

    def iter(self) -> Any:
        # Faust's `_visible_keys` makes one beside `keys()` and only seeks it.
        return self.db.iter()


@functools.cache
def shared_cache(capacity: int) -> rocksdict.Cache:
    """One block cache per size in the process: every database of the worker uses it."""
    return rocksdict.Cache(capacity)


@functools.cache
def shared_write_buffers(budget: int) -> rocksdict.WriteBufferManager:
    """One memtable budget per size in the process. No stall: past it RocksDB flushes the
    largest memtables; writers never wait on it."""
    return rocksdict.WriteBufferManager(budget, False)


def keep_memtables_within(stores: Iterable[Any]) -> int:
    """Flush the largest memtables of these stores' databases while their shared budget is
    exceeded, down to half of it; the number flushed (in RocksDB's background threads).

    RocksDB's write buffer manager, past its budget, flushes only the memtable of the
    database being written: the worker's other tables' databases would keep theirs."""
    # Each store once, however many tables share it.
    shared = list({id(store): store for store in stores if isinstance(store, SharedMemoryStore)}.values())
    dbs = [store.database for store in shared if store.database is not None]
    if not dbs:
        return 0
    budget = shared[0].memtables_bytes
    return flush_largest(dbs, shared_write_buffers(budget), budget)


def flush_largest(dbs: list[rocksdict.Rdict], manager: rocksdict.WriteBufferManager, budget: int) -> int:
    """Flush the largest active memtables of `dbs` (which share `manager`) while its usage is
    over `budget`, down to half of it; the number flushed."""
    used = manager.get_usage()
    if used <= budget:
        return 0
    sizes = sorted(((db.property_int_value(ACTIVE_MEMTABLE) or 0, n) for n, db in enumerate(dbs)), reverse=True)
    flushed = 0
    for size, n in sizes:
        if used <= budget // 2 or not size:
            break
        dbs[n].flush(False)  # in RocksDB's background threads
        used -= size
        flushed += 1
    return flushed


# The bytes held by a database's memtable being written (RocksDB's property).
ACTIVE_MEMTABLE = "rocksdb.cur-size-active-mem-table"


class SharedMemoryOptions(RocksDBOptions):
    """Faust's RocksDB options, with the worker's shared cache and memtable budget."""

    def __init__(self, *, shared_cache_bytes: int, memtables_bytes: int, **options: Any) -> None:
        super().__init__(**options)
        self.shared_cache_bytes = shared_cache_bytes
        self.memtables_bytes = memtables_bytes

    def as_options(self) -> Any:
        options = super().as_options()
        # What RocksDB does at each open that the worker does not need: 4 MiB of manifest
        # preallocated, statistics read from every file, stats dumped to the info log, 16
        # threads started to open the table files.
        options.set_manifest_preallocation_size(64 << 10)
        options.set_max_file_opening_threads(1)
        options.set_skip_stats_update_on_db_open(True)
        options.set_stats_dump_period_sec(0)
        options.set_stats_persist_period_sec(0)
        options.set_keep_log_file_num(1)
        table = rocksdict.BlockBasedOptions()
        # As Faust's own table options, but for the cache.
        table.set_bloom_filter(self.bloom_filter_size, block_based=True)
        table.set_block_cache(shared_cache(self.shared_cache_bytes))
        table.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(shared_write_buffers(self.memtables_bytes))
        return options


class SharedMemoryStore(Store):
    """Faust's RocksDB store (rocksdict), its partitions in one database (`PartitionDB`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.use_rocksdict:
            raise RuntimeError("kdiv's tables need rocksdict (the python-rocksdb driver has no shared memory bounds)")
        options = dict(self.options or {})
        shared_cache_bytes = options.pop("shared_cache_bytes")
        memtables_bytes = options.pop("memtables_bytes")
        self.memtables_bytes = memtables_bytes
        self.rocksdb_options = SharedMemoryOptions(
            shared_cache_bytes=shared_cache_bytes, memtables_bytes=memtables_bytes, use_rocksdict=True, **options
        )
        self.database: rocksdict.Rdict | None = None

    @property
    def database_path(self) -> Path:
        """The table's database: `<table>.db` under the worker's table directory."""
        return self._path_with_suffix(self.path / self.basename)

    def _open_for_partition(self, partition: int) -> PartitionDB:
        # Opened once, at the first partition's use: a lock still held by a process that
        # is stopping raises here, and Faust's `_try_open_db_for_partition` retries.
        if self.database is None:
            self.database = self.rocksdb_options.open(self.database_path)
        return PartitionDB(self.database, partition)

    def apply_changelog_batch(
        self, batch: Iterable[Any], to_key: Callable[[Any], Any], to_value: Callable[[Any], Any]
    ) -> None:
        """Faust's, with each partition's records in one `PartitionBatch`."""
        batches: dict[int, PartitionBatch] = {}
        offsets: dict[Any, int] = {}
        for event in batch:
            message = event.message
            tp, offset = message.tp, message.offset
            offsets[tp] = max(offset, offsets.get(tp, offset))
            writes = batches.get(message.partition)
            if writes is None:
                writes = batches[message.partition] = self._db_for_partition(message.partition).batch()
            if message.value is None:
                writes.delete(message.key)
            else:
                writes.put(message.key, message.value)
        for partition, writes in batches.items():
            self._db_for_partition(partition).write(writes)
        for tp, offset in offsets.items():
            self.set_persisted_offset(tp, offset)

    async def assign_partitions(self, table: Any, tps: Any, generation_id: int = 0) -> None:
        """Faust opens the assigned partitions here, inside the rebalance callback, where the
        group gets no heartbeat; they are opened by the recovery instead
        (`kdiv.worker.faustcompat.bulkrestore.open_stores`), or at their first use."""
        self.rebalance_ack = True

    def reset_state(self) -> None:
        """Faust's (the table directory removed), the shared database let go first."""
        self.database = None
        super().reset_state()


def partition_db(table: Any, partition: int) -> PartitionDB | None:
    """The table partition's part of its database; None for a table not in kdiv's store,
    which is read and written through Faust."""
    store = table.data
    return store._db_for_partition(partition) if isinstance(store, SharedMemoryStore) else None


stores.STORES.aliases[STORE_SCHEME] = f"{__name__}:SharedMemoryStore"
