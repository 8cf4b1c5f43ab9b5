"""The `kdiv-trace` record header: the only place that knows its byte layout.

Layout (big-endian), version 1, 25 bytes:

    0   1  format version (1)
    1  16  trace id (random, unique per traced record)
    17  8  origin: the producer's wall time when it stamped the record, ms since epoch (signed)
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TRACE_HEADER = "kdiv-trace"
FORMAT_VERSION = 1
TRACE_ID_SIZE = 16

_LAYOUT = struct.Struct(">B16sq")
SIZE = _LAYOUT.size  # 25
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# Record headers as Kafka clients give them: (name, value) pairs (aiokafka, confluent-kafka)
# or a mapping (Faust's event headers). A null value is legal in Kafka.
Headers = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None]


class TraceHeaderError(ValueError):
    """A trace header cannot be decoded; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class TraceStamp:
    """What a traced record carries: its trace id and when its producer stamped it."""

    trace_id: bytes
    origin_ms: int

    @property
    def trace_id_hex(self) -> str:
        return self.trace_id.hex()


def new_trace_id() -> bytes:
    """16 random bytes: unique without coordination between producers."""
    return os.urandom(TRACE_ID_SIZE)


def encode_trace(stamp: TraceStamp) -> bytes:
    """The header value of `stamp`; ValueError if its id is not 16 bytes or its origin not an int64."""
    if not isinstance(stamp.trace_id, bytes) or len(stamp.trace_id) != TRACE_ID_SIZE:
        size = len(stamp.trace_id) if isinstance(stamp.trace_id, bytes) else type(stamp.trace_id).__name__
        raise ValueError(f"trace id must be {TRACE_ID_SIZE} bytes, got {size}")
    if not _INT64_MIN <= stamp.origin_ms <= _INT64_MAX:
        raise ValueError(f"trace origin_ms {stamp.origin_ms} does not fit a signed 64-bit integer")
    return _LAYOUT.pack(FORMAT_VERSION, stamp.trace_id, stamp.origin_ms)


def decode_trace(raw: bytes) -> TraceStamp:
    """The stamp in a header value, or TraceHeaderError naming what is wrong (type, version, length)."""
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise TraceHeaderError(f"{TRACE_HEADER} header value is a {type(raw).__name__}, not bytes")
    size = len(raw)
    if size == 0:
        raise TraceHeaderError(f"{TRACE_HEADER} header is empty; version {FORMAT_VERSION} is {SIZE} bytes")
    # The version first: a later version may have another length.
    version = raw[0]
    if version != FORMAT_VERSION:
        raise TraceHeaderError(f"{TRACE_HEADER} header version {version} is unknown (this kdiv reads {FORMAT_VERSION})")
    if size != SIZE:
        raise TraceHeaderError(f"{TRACE_HEADER} header is {size} bytes; version {FORMAT_VERSION} is {SIZE} bytes")
    _, trace_id, origin_ms = _LAYOUT.unpack(raw)
    return TraceStamp(trace_id, origin_ms)


def find_trace(headers: Headers) -> TraceStamp | None:
    """The record's trace, None when it carries no trace header.

    TraceHeaderError when the header is null or malformed, or when the record carries several
    trace headers that differ (several identical ones are harmless). One scan, and nothing
    allocated when the header is absent: this runs for every record.
    """
    if isinstance(headers, Mapping):
        if TRACE_HEADER not in headers:
            return None
        raw = headers[TRACE_HEADER]
    else:
        found = 0
        raw = None
        for name, value in headers:
            if name == TRACE_HEADER:
                if found and value != raw:
                    raise TraceHeaderError(f"the record carries several {TRACE_HEADER} headers with different values")
                found += 1
                raw = value
        if not found:
            return None
    if raw is None:
        raise TraceHeaderError(f"{TRACE_HEADER} header has a null value")
    return decode_trace(raw)
