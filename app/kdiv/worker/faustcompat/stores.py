"""The tables' RocksDB databases share one memory budget: a block cache and a memtable budget
for the whole worker, not one of each per table partition.

Faust opens one RocksDB database per table partition, each with memtables and a block cache of
its own. With 1,000 partitions that is 1,000 budgets: a burst of a million new producers left
about 200 KB of unflushed memtable in each (200 MB) while every budget was far from full. Here
every database of the worker takes the same `rocksdict.Cache` and `rocksdict.WriteBufferManager`,
and past the shared memtable budget the largest memtables are flushed after each commit
(`keep_memtables_within`: RocksDB itself flushes only the database being written), so the
worker's RocksDB memory is bounded by two settings, whatever the partition count
(`KDIV_ROCKSDB_MEMTABLES_BYTES`, `KDIV_ROCKSDB_BLOCK_CACHE_BYTES`).

Chosen by the store URL `kdiv-rocksdb://`; options as for Faust's `rocksdb://`, plus
`shared_cache_bytes` and `memtables_bytes`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import rocksdict
from faust import stores
from faust.stores.rocksdb import RocksDBOptions, Store

STORE_SCHEME = "kdiv-rocksdb"


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
    database being written: with 1,000 databases each written once a commit, every one kept
    its latest writes, and a budget of 64 MiB held 526 MB (about 500 bytes per producer
    written, measured with 1,000 databases of 1,000 producers). Flushed here, the memtables
    stay within the budget whatever the number of databases."""
    # Each store once, however many tables share it.
    shared = list({id(store): store for store in stores if isinstance(store, SharedMemoryStore)}.values())
    if not shared:
        return 0
    budget = shared[0].memtables_bytes
    return flush_largest([db for store in shared for db in store._dbs.values()], shared_write_buffers(budget), budget)


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
        # What RocksDB does at each open that a worker opening 1,000 databases does not need:
        # 4 MiB of manifest preallocated, statistics read from every file, stats dumped to the
        # info log (11 ms an open, 5 without), 16 threads started to open a store's few table
        # files (a fifth of an open's time).
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
    """Faust's RocksDB store (rocksdict), its databases under `SharedMemoryOptions`."""

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

    async def assign_partitions(self, table: Any, tps: Any, generation_id: int = 0) -> None:
        """Faust opens the assigned partitions' databases here, inside the rebalance callback,
        where the group gets no heartbeat (1,000 of them outlasted the session); they are
        opened by the recovery instead (`kdiv.worker.faustcompat.bulkrestore.open_stores`), or
        at their first use."""
        self.rebalance_ack = True


stores.STORES.aliases[STORE_SCHEME] = f"{__name__}:SharedMemoryStore"
