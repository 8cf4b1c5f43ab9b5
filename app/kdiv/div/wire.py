"""The `div` record header, versions 1 and 2: the only place that knows its byte layout.

Layout (big-endian), documented for users in docs/wire-format.md:

    0   1  format version (1; 2: a DATA record of an implicit segment, see below)
    1   1  kind (see Kind)
    2  16  producer GUID
    18  4  segment number (unsigned)
    22  4  sequence number (unsigned)
    26  8  producer timestamp, ms since epoch (signed)
    34  4  record CRC32 over kind, key and value (see record_crc)
    38  1  START_OF_SEGMENT only: checksum type
    38  9  END_OF_SEGMENT only: segment checksum (8, unsigned) and final-segment flag (1)

Version 2 has version 1's layout and only kind DATA: its segment was opened implicitly by
its first record (seq 0) and no END_OF_SEGMENT will close it, as stamped by producers that
cannot send control records (kdiv's Java producer interceptor, docs/java-producers.md).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterable
from typing import NamedTuple

HEADER_NAME = "div"
FORMAT_VERSION = 1
# A DATA record whose segment has no START_OF_SEGMENT nor END_OF_SEGMENT (module docstring).
IMPLICIT_SEGMENT_VERSION = 2
# The versions a DATA header may carry; the fast paths read these without `decode`.
DATA_VERSIONS = (FORMAT_VERSION, IMPLICIT_SEGMENT_VERSION)

_COMMON_FIELDS = (
    ("version", "B"),
    ("kind", "B"),
    ("guid", "16s"),
    ("segment", "I"),
    ("seq", "I"),
    ("producer_ts", "q"),
    ("crc", "I"),
)
_COMMON = struct.Struct(">" + "".join(code for _, code in _COMMON_FIELDS))
_SOS_TAIL = struct.Struct(">B")
_EOS_TAIL = struct.Struct(">QB")
COMMON_SIZE = _COMMON.size  # 38


def _field_positions() -> dict[str, tuple[int, int]]:
    positions, offset = {}, 0
    for name, code in _COMMON_FIELDS:
        size = struct.calcsize(">" + code)
        positions[name] = (offset, size)
        offset += size
    return positions


# (byte offset, size) of each common field, for readers that cannot call `decode` (Spark SQL).
COMMON_FIELD_POSITIONS = _field_positions()
SOS_CHECKSUM_TYPE_POSITION = (COMMON_SIZE, _SOS_TAIL.size)
EOS_FINAL_FLAG_POSITION = (COMMON_SIZE + _EOS_TAIL.size - 1, 1)
# (version, kind, guid, segment, seq, producer_ts, crc) of any header, without validation.
unpack_common = _COMMON.unpack_from
SOS_SIZE = COMMON_SIZE + _SOS_TAIL.size  # 39
EOS_SIZE = COMMON_SIZE + _EOS_TAIL.size  # 47

_LEN = struct.Struct(">i")
_KIND_LEN = struct.Struct(">Bi")
_NULL_LEN = _LEN.pack(-1)
_CONTROL_KEY = struct.Struct(">16sII")
_UINT64_MASK = (1 << 64) - 1


class Kind(enum.IntEnum):
    """The kind of a `div` header: a data record or one of the control records."""

    DATA = 0
    START_OF_SEGMENT = 1
    END_OF_SEGMENT = 2
    START_OF_PUSH = 3
    END_OF_PUSH = 4


class ChecksumType(enum.IntEnum):
    """Segment checksum types. The codes are Venice's, so 1-3 stay reserved."""

    NONE = 0
    ADHASH = 4


_KINDS = {k.value: k for k in Kind}
_CHECKSUM_TYPES = {c.value: c for c in ChecksumType}
SIZE_BY_KIND = {
    Kind.DATA: COMMON_SIZE,
    Kind.START_OF_SEGMENT: SOS_SIZE,
    Kind.END_OF_SEGMENT: EOS_SIZE,
    Kind.START_OF_PUSH: COMMON_SIZE,
    Kind.END_OF_PUSH: COMMON_SIZE,
}


class MalformedHeader(ValueError):
    """The `div` header cannot be decoded; the message says which field is wrong."""


class DivHeader(NamedTuple):
    """A decoded `div` header."""

    # A tuple, not a dataclass: one is decoded per consumed record.
    kind: Kind
    guid: bytes
    segment: int
    seq: int
    producer_ts: int
    crc: int
    checksum_type: ChecksumType | None = None  # START_OF_SEGMENT only
    segment_checksum: int | None = None  # END_OF_SEGMENT only
    final_segment: bool | None = None  # END_OF_SEGMENT only
    implicit_segment: bool = False  # format version 2: a DATA record of an implicit segment


def record_crc(kind: int, key: bytes | None, value: bytes | None, _crc32=zlib.crc32) -> int:
    """CRC32 (zlib/IEEE) over kind byte, int32 key length (-1 if null), key, int32 value length, value."""
    if key is None:
        crc = _crc32(_KIND_LEN.pack(kind, -1))
    else:
        crc = _crc32(key, _crc32(_KIND_LEN.pack(kind, len(key))))
    if value is None:
        return _crc32(_NULL_LEN, crc)
    return _crc32(value, _crc32(_LEN.pack(len(value)), crc))


def adhash_add(checksum: int, crc: int) -> int:
    """ADHASH: the order-independent sum of record CRC32s, mod 2^64."""
    return (checksum + crc) & _UINT64_MASK


def control_key(guid: bytes, segment: int, seq: int) -> bytes:
    """Key of a control record: unique per (GUID, segment, seq), so compaction never collapses two."""
    return _CONTROL_KEY.pack(guid, segment, seq)


def encode(header: DivHeader) -> bytes:
    """The bytes of a `div` header."""
    if header.implicit_segment and header.kind != Kind.DATA:
        raise ValueError(f"an implicit segment holds DATA records only, not {header.kind.name}")
    common = _COMMON.pack(
        IMPLICIT_SEGMENT_VERSION if header.implicit_segment else FORMAT_VERSION,
        header.kind,
        header.guid,
        header.segment,
        header.seq,
        header.producer_ts,
        header.crc,
    )
    if header.kind == Kind.START_OF_SEGMENT:
        ctype = ChecksumType.ADHASH if header.checksum_type is None else header.checksum_type
        return common + _SOS_TAIL.pack(ctype)
    if header.kind == Kind.END_OF_SEGMENT:
        return common + _EOS_TAIL.pack(header.segment_checksum or 0, 1 if header.final_segment else 0)
    return common


def scan_div_header(headers: Iterable[tuple[str, bytes | None]]) -> tuple[int, bytes | None]:
    """How many `div` headers a record carries, and the value of the last one.

    The one scan every reader of DIV metadata makes, so all follow one rule: a record's DIV
    metadata is readable only when it carries exactly one `div` header whose value decodes
    (`readable_div_header`); none makes it UNTRACKED, anything else MALFORMED.
    """
    found = 0
    raw = None
    for name, value in headers:
        if name == HEADER_NAME:
            found += 1
            raw = value
    return found, raw


def readable_div_header(headers: Iterable[tuple[str, bytes | None]]) -> DivHeader | None:
    """The record's one decodable `div` header, or None (absent, duplicated, null or malformed)."""
    return readable_scanned(*scan_div_header(headers))


def readable_scanned(found: int, raw: bytes | None) -> DivHeader | None:
    """`readable_div_header` of a record whose headers `scan_div_header` has scanned."""
    if found != 1 or raw is None:
        return None
    try:
        return decode(raw)
    except MalformedHeader:
        return None


def decode(raw: bytes | None) -> DivHeader:
    """Decode one `div` header value, or raise MalformedHeader saying what is wrong."""
    if raw is None:
        raise MalformedHeader("div header has a null value")
    size = len(raw)
    if size < COMMON_SIZE:
        raise MalformedHeader(f"div header is {size} bytes, shorter than the {COMMON_SIZE}-byte minimum")
    version, kind_code, guid, segment, seq, producer_ts, crc = _COMMON.unpack_from(raw)
    if version == IMPLICIT_SEGMENT_VERSION:
        if kind_code != Kind.DATA:
            raise MalformedHeader(f"div header format version 2 has kind {kind_code}, not 0 (DATA)")
        if size != COMMON_SIZE:
            raise MalformedHeader(f"div header of format version 2 is {size} bytes, expected {COMMON_SIZE}")
        return DivHeader(Kind.DATA, guid, segment, seq, producer_ts, crc, implicit_segment=True)
    if version != FORMAT_VERSION:
        raise MalformedHeader(f"div header format version {version} is neither 1 nor 2")
    kind = _KINDS.get(kind_code)
    if kind is None:
        raise MalformedHeader(f"div header kind {kind_code} is unknown")
    expected = SIZE_BY_KIND[kind]
    if size != expected:
        raise MalformedHeader(f"div header of kind {kind.name} is {size} bytes, expected {expected}")
    if kind == Kind.START_OF_SEGMENT:
        (ctype_code,) = _SOS_TAIL.unpack_from(raw, COMMON_SIZE)
        ctype = _CHECKSUM_TYPES.get(ctype_code)
        if ctype is None:
            raise MalformedHeader(f"START_OF_SEGMENT checksum type {ctype_code} is neither 0 (NONE) nor 4 (ADHASH)")
        return DivHeader(kind, guid, segment, seq, producer_ts, crc, checksum_type=ctype)
    if kind == Kind.END_OF_SEGMENT:
        checksum, final = _EOS_TAIL.unpack_from(raw, COMMON_SIZE)
        if final > 1:
            raise MalformedHeader(f"END_OF_SEGMENT final-segment flag {final} is neither 0 nor 1")
        return DivHeader(
            kind, guid, segment, seq, producer_ts, crc, segment_checksum=checksum, final_segment=bool(final)
        )
    return DivHeader(kind, guid, segment, seq, producer_ts, crc)
