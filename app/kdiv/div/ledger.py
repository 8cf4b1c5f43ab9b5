"""The key ledger: per key of a compacted topic, the last record the validator saw.

Compaction keeps the latest record per key, so what a compacted topic must still hold is
known from that record alone. The nightly reconciliation compares the ledger with the
topic at rest: a key whose ledger record is gone (LOST), a record at a ledger offset whose
bytes changed (DIVERGED), a record the ledger never saw below the validated offset
(UNVALIDATED).

Pure. DIV control records are left out: their keys are unique per segment and they carry
no user data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kdiv.div.record import FetchedRecord
from kdiv.div.wire import (
    COMMON_SIZE,
    DATA_VERSIONS,
    Kind,
    readable_div_header,
    record_crc,
    scan_div_header,
    unpack_common,
)
from kdiv.untrusted import preview

_SEP = b"|"


@dataclass(frozen=True, slots=True)
class KeyValidation:
    """The key ledger's entry: the last record validated for one key of a compacted topic."""

    offset: int
    timestamp: int
    # record_crc(DATA, key, value) of the bytes as validated, whatever the header claims.
    crc: int
    tombstone: bool
    producer: bytes | None = None
    segment: int | None = None
    seq: int | None = None


def at_rest_crc(key: bytes | None, value: bytes | None) -> int:
    """The CRC32 a ledger entry keeps, computed the same way over a record read back later."""
    return record_crc(Kind.DATA, key, value)


def ledger_key(topic: str, partition: int, key: bytes) -> bytes:
    """The table key of a ledger entry: topic, partition and record key, separable again."""
    # Topic names cannot contain "|"; the record key follows verbatim, "|" or not.
    return f"{topic}|{partition}|".encode() + key


def parse_ledger_key(raw: bytes) -> tuple[str, int, bytes]:
    """(topic, partition, record key); ValueError names the key when it is not a ledger key."""
    parts = raw.split(_SEP, 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
        raise ValueError(f"ledger key {preview(raw)} is not topic|partition|key")
    return parts[0].decode(), int(parts[1]), parts[2]


def key_validation_of(record: FetchedRecord) -> KeyValidation | None:
    """The ledger entry for a validated record, or None when it has no key or is DIV control."""
    if record.key is None:
        return None
    producer = segment = seq = None
    header = readable_div_header(record.headers)
    if header is not None:
        if header.kind != Kind.DATA:
            return None
        producer, segment, seq = header.guid, header.segment, header.seq
    return KeyValidation(
        record.offset,
        record.timestamp,
        at_rest_crc(record.key, record.value),
        record.value is None,
        producer,
        segment,
        seq,
    )


# An entry in 53 bytes, little-endian: offset i64, timestamp i64, crc u32, flags u8
# (1: tombstone, 2: producer, segment and seq present), producer 16 bytes, segment i64,
# seq i64. A ledger holds one per key of a compacted topic, written at the topic's rate:
# packing is a tenth of what a general Avro encoder costs (the state codec carries it).
_PACKED = struct.Struct("<qqIB16sqq")
PACKED_SIZE = _PACKED.size
_TOMBSTONE = 1
_PRODUCER = 2
# For a validator that has a DATA record's header fields and CRC at hand (`validate_run`):
# pack_fields(offset, timestamp, crc, flags, guid, segment, seq), flags DATA_FLAGS for a
# value, TOMBSTONE_FLAGS for none. The same bytes as `packed_key_validation_of`.
pack_fields = _PACKED.pack
DATA_FLAGS = _PRODUCER
TOMBSTONE_FLAGS = _PRODUCER | _TOMBSTONE
_NO_PRODUCER = bytes(16)
_DATA = int(Kind.DATA)


def pack_key_validation(entry: KeyValidation) -> bytes:
    """The entry's packed form (`unpack_key_validation` gives it back)."""
    flags = _TOMBSTONE if entry.tombstone else 0
    if entry.producer is not None:
        flags |= _PRODUCER
    return _PACKED.pack(
        entry.offset,
        entry.timestamp,
        entry.crc,
        flags,
        entry.producer or _NO_PRODUCER,
        entry.segment or 0,
        entry.seq or 0,
    )


def unpack_key_validation(packed: bytes) -> KeyValidation:
    """The entry `pack_key_validation` packed; ValueError when `packed` is not one."""
    if len(packed) != PACKED_SIZE:
        raise ValueError(f"a packed key validation is {PACKED_SIZE} bytes, not {len(packed)}")
    offset, timestamp, crc, flags, producer, segment, seq = _PACKED.unpack(packed)
    if flags & _PRODUCER:
        return KeyValidation(offset, timestamp, crc, bool(flags & _TOMBSTONE), producer, segment, seq)
    return KeyValidation(offset, timestamp, crc, bool(flags & _TOMBSTONE))


def packed_key_validation_of(record: FetchedRecord, _pack=_PACKED.pack) -> bytes | None:
    """`pack_key_validation(key_validation_of(record))`, or None as there, without the
    intermediate entry for the common record: one readable DATA header."""
    key, value = record.key, record.value
    if key is None:
        return None
    found, raw = scan_div_header(record.headers)
    if found == 1 and raw is not None and len(raw) == COMMON_SIZE and raw[0] in DATA_VERSIONS and raw[1] == _DATA:
        _version, _kind, guid, segment, seq, _ts, _crc = unpack_common(raw)
        flags = DATA_FLAGS if value is not None else TOMBSTONE_FLAGS
        return _pack(record.offset, record.timestamp, record_crc(_DATA, key, value), flags, guid, segment, seq)
    entry = key_validation_of(record)
    return None if entry is None else pack_key_validation(entry)
