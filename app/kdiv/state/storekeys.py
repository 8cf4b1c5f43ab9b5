"""How a worker's table database holds its partitions' keys: each key after its partition's
number, 4 bytes big-endian, so one partition's keys are one range of the database
(`kdiv.worker.faustcompat.stores`; read back by `kdiv.reconcile.schemas`)."""

from __future__ import annotations

import struct

_PARTITION = struct.Struct(">I")
PREFIX_BYTES = _PARTITION.size
LAST_PARTITION = (1 << (8 * PREFIX_BYTES)) - 1


def partition_prefix(partition: int) -> bytes:
    """What every key of `partition` starts with."""
    return _PARTITION.pack(partition)


def split_key(stored: bytes) -> tuple[int, bytes] | None:
    """(partition, key) of a key as the database holds it; None for one too short to be."""
    if len(stored) < PREFIX_BYTES:
        return None
    return _PARTITION.unpack_from(stored)[0], stored[PREFIX_BYTES:]
