"""Memory bounds of the worker's RocksDB stores, handed to each Faust table.

Faust opens one RocksDB database per table partition, each with its own memtables and block
cache; its defaults (three 64 MiB write buffers and a 2 GiB block cache per database) let
each partition's store grow by hundreds of MiB under a burst of new producers. The worker
reads a producer's saved state once, when it loads the partition, so a small cache costs
little; writes are batched per commit, so a few MiB of memtable hold many commits.
"""

from __future__ import annotations

from typing import Any

from kdiv.config.settings import Settings


def rocksdb_options(settings: Settings) -> dict[str, Any]:
    """`options` for `app.Table`: the bounds of each partition's RocksDB database."""
    return {
        "write_buffer_size": settings.rocksdb_write_buffer_bytes,
        "max_write_buffer_number": settings.rocksdb_write_buffers,
        "block_cache_size": settings.rocksdb_block_cache_bytes,
        # Used by the python-rocksdb driver only (rocksdict has no compressed cache).
        "block_cache_compressed_size": settings.rocksdb_block_cache_bytes,
    }


def rocksdb_bytes_per_partition(settings: Settings) -> int:
    """The most one partition's database holds in memtables and block cache."""
    return settings.rocksdb_write_buffer_bytes * settings.rocksdb_write_buffers + settings.rocksdb_block_cache_bytes
