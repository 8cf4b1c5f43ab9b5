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

from dataclasses import dataclass

from kdiv.div.record import FetchedRecord
from kdiv.div.wire import Kind, readable_div_header, record_crc

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
        raise ValueError(f"ledger key {raw[:80]!r} is not topic|partition|key")
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
