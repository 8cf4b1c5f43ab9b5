"""Confluent's wire format: magic byte 0, a 4-byte big-endian schema id, then the body.

Pure. `schema_id_of` answers only for bytes that carry the framing; whether a topic's
records are meant to carry it is the caller's knowledge.
"""

from __future__ import annotations

import struct

MAGIC = 0
HEADER_SIZE = 5
_HEADER = struct.Struct(">bI")
# (byte offset, size) of the schema id, for readers that cannot call `schema_id_of` (Spark SQL).
SCHEMA_ID_POSITION = (1, _HEADER.size - 1)


class FramingError(ValueError):
    pass


def frame(schema_id: int, body: bytes) -> bytes:
    return _HEADER.pack(MAGIC, schema_id) + body


def schema_id_of(raw: bytes | None) -> int | None:
    """The schema id of a framed value, or None when the bytes are not framed."""
    if raw is None or len(raw) < HEADER_SIZE or raw[0] != MAGIC:
        return None
    return _HEADER.unpack_from(raw)[1]


def unframe(raw: bytes | None) -> tuple[int, bytes]:
    """(schema id, body); FramingError names what is wrong."""
    if raw is None:
        raise FramingError("no value (tombstone) where a framed value was expected")
    if len(raw) < HEADER_SIZE:
        raise FramingError(f"{len(raw)} bytes is shorter than the 5-byte Confluent header")
    if raw[0] != MAGIC:
        raise FramingError(f"magic byte {raw[0]} is not Confluent's 0")
    return _HEADER.unpack_from(raw)[1], raw[HEADER_SIZE:]
