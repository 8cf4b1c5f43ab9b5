"""Memory bounds of the worker's RocksDB stores, handed to each Faust table.

Faust opens one RocksDB database per table partition, each with its own memtables and block
cache; its defaults (three 64 MiB write buffers and a 2 GiB block cache per database) let
each partition's store grow by hundreds of MiB under a burst of new producers. The worker's
databases share one block cache and one memtable budget instead
(`kdiv.worker.faustcompat.stores`): its RocksDB memory does not grow with the partition count.
The worker reads a producer's saved state once, when it loads the partition, so a small cache
costs little; writes are batched per commit, so a few MiB of memtable hold many commits.
"""

from __future__ import annotations

from typing import Any

from kdiv.config.settings import Settings


def rocksdb_options(settings: Settings) -> dict[str, Any]:
    """`options` for `app.Table`: the bounds of each partition's RocksDB database."""
    return {
        "write_buffer_size": settings.rocksdb_write_buffer_bytes,
        "max_write_buffer_number": settings.rocksdb_write_buffers,
        # One cache and one memtable budget for every database of the worker.
        "shared_cache_bytes": settings.rocksdb_block_cache_bytes,
        "memtables_bytes": settings.rocksdb_memtables_bytes,
    }


def rocksdb_bytes(settings: Settings) -> int:
    """The most the worker's databases hold in memtables and block cache together."""
    return settings.rocksdb_memtables_bytes + settings.rocksdb_block_cache_bytes
