"""TiCDC's column-level row checksum: verdicts, results, and the bytes each column appends.

The checksum is CRC-32/IEEE (`zlib.crc32`, init 0) over the concatenated column encodings, in
column-ID order, NULL columns appending nothing:

- integers (every INT size, signed or unsigned, BOOL, YEAR), ENUM index, SET bitmask, BIT value:
  8 bytes little-endian of the value mod 2^64;
- FLOAT and DOUBLE: the IEEE-754 binary64 bits, little-endian, of the value widened to double;
  NaN and ±Inf hash as 0.0;
- strings, binary strings, DECIMAL, DATE, DATETIME, TIME, JSON, TIMESTAMP (in UTC): 4-byte
  little-endian length and the bytes exactly as sent;
- VECTOR: 4-byte little-endian element count and each element as float32 little-endian;
- GEOMETRY: nothing.

Each encoder here takes one column value as a protocol sends it and returns its bytes, raising
ValueError, TypeError, KeyError, OverflowError or struct.error when the value is not of the
expected form; the protocol modules turn those into MALFORMED verdicts naming the column.
Encoders are plain callables (many C-level: `struct.Struct.pack`, `dict.__getitem__`) so that a
row is a walk over a precomputed list of them.
"""

from __future__ import annotations

import binascii
import enum
import itertools
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final

from kdiv.untrusted import preview

Encoder = Callable[[Any], bytes]

UINT32_MAX: Final = (1 << 32) - 1
_UINT64_MASK: Final = (1 << 64) - 1
_INT64_MIN: Final = -(1 << 63)

# Exceptions an encoder raises on a value of the wrong form (binascii.Error and UnicodeError are
# ValueErrors; zoneinfo's ZoneInfoNotFoundError is a KeyError).
BAD_VALUE_ERRORS: Final = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, struct.error)

_pack_int64 = struct.Struct("<q").pack
_pack_uint64 = struct.Struct("<Q").pack
_pack_uint32 = struct.Struct("<I").pack
_pack_double = struct.Struct("<d").pack
_pack_float = struct.Struct("<f").pack
_unpack_float = struct.Struct("<f").unpack
_ZERO_DOUBLE: Final = _pack_double(0.0)
_SIGNED_DECIMAL = re.compile(r"-?[0-9]+")
# Columns in a repeated hour whose two readings are tried together (2^12 combinations at most).
_MAX_ALTERNATIVES = 12
_crc32 = zlib.crc32
NO_KEY: Final[Mapping[str, object]] = MappingProxyType({})


class ChecksumVerdict(enum.Enum):
    """What the verifier says of one row image's checksum."""

    OK = "OK"
    CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"
    # TiCDC itself found the row inconsistent with TiDB's checksum (`corrupted` flag set).
    CORRUPTED_FLAG = "CORRUPTED_FLAG"
    # Nothing to verify; `skip_reason` says why. Never counts as OK.
    SKIPPED = "SKIPPED"
    # The message cannot be interpreted as a TiCDC checksum message; `detail` names what is wrong.
    MALFORMED = "MALFORMED"


class SkipReason(enum.Enum):
    """Why a row image was not verified."""

    TOMBSTONE = "tombstone"  # Avro DELETE: key record and empty value
    CHECKSUM_ABSENT = "checksum absent"  # integrity off for the changefeed, or an older message
    CHECKSUM_ZERO = "checksum 0"  # checksum not enabled when the row was written (or BR-restored)
    HANDLE_KEY_ONLY = "handle key only"  # Simple: only key columns sent; the row is upstream
    CLAIM_CHECK = "claim check"  # Simple: the row is in external storage
    SCHEMA_UNKNOWN = "schema unknown"  # Simple: no BOOTSTRAP or DDL message for the DML's schema


class RowImage(enum.Enum):
    """Which image of the row a checksum covers."""

    CURRENT = "current"  # the row after the change (INSERT, UPDATE)
    PREVIOUS = "previous"  # the row before the change (Simple UPDATE and DELETE)


@dataclass(frozen=True, slots=True, init=False)
class ChecksumResult:
    """The verdict on one row image, with what identifies the row."""

    verdict: ChecksumVerdict
    # The checksum the message carries and the one recomputed (uint32), when known.
    expected: int | None
    computed: int | None
    # `database.table`, when the message names it.
    table: str | None
    # The row's key columns, name -> value as sent (empty when the message does not say).
    key: Mapping[str, object] = field(hash=False)
    commit_ts: int | None
    detail: str
    image: RowImage
    skip_reason: SkipReason | None

    # One result is made per row on the hot path: setting the slots directly costs half of the
    # frozen dataclass __init__'s object.__setattr__ per field.
    def __init__(
        self,
        verdict: ChecksumVerdict,
        expected: int | None,
        computed: int | None,
        table: str | None,
        key: Mapping[str, object],
        commit_ts: int | None,
        detail: str = "",
        image: RowImage = RowImage.CURRENT,
        skip_reason: SkipReason | None = None,
    ) -> None:
        _set_verdict(self, verdict)
        _set_expected(self, expected)
        _set_computed(self, computed)
        _set_table(self, table)
        _set_key(self, key)
        _set_commit_ts(self, commit_ts)
        _set_detail(self, detail)
        _set_image(self, image)
        _set_skip_reason(self, skip_reason)

    @property
    def is_fault(self) -> bool:
        """True for the verdicts to report as incidents: a mismatch, TiCDC's flag, a bad message."""
        return self.verdict in FAULT_VERDICTS


(
    _set_verdict,
    _set_expected,
    _set_computed,
    _set_table,
    _set_key,
    _set_commit_ts,
    _set_detail,
    _set_image,
    _set_skip_reason,
) = (getattr(ChecksumResult, f.name).__set__ for f in fields(ChecksumResult))

FAULT_VERDICTS: Final = frozenset(
    {ChecksumVerdict.CHECKSUM_MISMATCH, ChecksumVerdict.CORRUPTED_FLAG, ChecksumVerdict.MALFORMED}
)


def row_checksum(parts: Iterable[bytes]) -> int:
    """CRC-32/IEEE over the concatenated column encodings (NULL columns contribute no part)."""
    return _crc32(b"".join(parts))


def match_with_alternatives(
    parts: Sequence[bytes], alternatives: Sequence[tuple[int, bytes]], expected: int
) -> tuple[int, ...] | None:
    """The positions whose alternative bytes, put in place of `parts[position]`, give the CRC
    `expected` (a TIMESTAMP in a repeated hour has two readings), or None. The parts as they
    are are taken as already compared; at most 2^12 combinations are tried.
    """
    alternatives = alternatives[:_MAX_ALTERNATIVES]
    for chosen in itertools.product((False, True), repeat=len(alternatives)):
        if not any(chosen):
            continue
        candidate = list(parts)
        used = []
        for use, (position, other) in zip(chosen, alternatives, strict=True):
            if use:
                candidate[position] = other
                used.append(position)
        if _crc32(b"".join(candidate)) == expected:
            return tuple(used)
    return None


# Integers ----------------------------------------------------------------------------------------

# A signed 64-bit value (every Avro int and long) as its 8 bytes mod 2^64.
encode_int64: Final[Encoder] = _pack_int64


def encode_integer(value: int) -> bytes:
    """An integer in [-2^63, 2^64 - 1] as 8 bytes little-endian, mod 2^64."""
    if value.__class__ is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if not _INT64_MIN <= value <= _UINT64_MASK:
        raise ValueError(f"{value} is outside the 64-bit range")
    return _pack_uint64(value & _UINT64_MASK)


def encode_unsigned_text(value: str) -> bytes:
    """BIGINT UNSIGNED sent as base-10 digits (Avro string mode)."""
    if not (value.isdigit() and value.isascii()):
        raise ValueError(f"not base-10 digits: {preview(value)}")
    return _pack_uint64(int(value))


def encode_unsigned_long(value: int) -> bytes:
    """A uint64 sent as its two's-complement signed long (Avro long mode, Simple UnsignedBigint)."""
    if value.__class__ is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return _pack_uint64(value & _UINT64_MASK)


def encode_integer_text(value: str) -> bytes:
    """An integer sent as decimal text (`"-128"`, `"18446744073709551615"`)."""
    if _SIGNED_DECIMAL.fullmatch(value) is None:
        raise ValueError(f"not a base-10 integer: {preview(value)}")
    return encode_integer(int(value))


def encode_bit_bytes(value: bytes) -> bytes:
    """BIT sent as big-endian bytes (leading zero bytes allowed): its unsigned value."""
    return _pack_uint64(int.from_bytes(value, "big"))


# Floating point ----------------------------------------------------------------------------------


def encode_double(value: float) -> bytes:
    """A double (or a float32 already widened exactly) as its binary64 bits; NaN and ±Inf as 0.0."""
    try:
        # x - x is 0.0 for every finite x, NaN for NaN and ±Inf; -0.0 keeps its sign bit.
        finite = value - value == 0.0
    except TypeError:
        raise TypeError(f"expected a floating-point number, got {type(value).__name__}") from None
    return _pack_double(value) if finite else _ZERO_DOUBLE


def encode_float32(value: float) -> bytes:
    """A FLOAT: rounded to the nearest binary32 (exact for a float32 already), then widened."""
    if value.__class__ is not float:
        raise TypeError(f"expected a floating-point number, got {type(value).__name__}")
    if value - value != 0.0:
        return _ZERO_DOUBLE
    return _pack_double(_unpack_float(_pack_float(value))[0])


def encode_float32_text(value: str) -> bytes:
    """A FLOAT sent as its shortest float32 text (`"3.14"`)."""
    return encode_float32(_parse_float(value))


def encode_double_text(value: str) -> bytes:
    """A DOUBLE sent as text (`"602214076000000000000000"`)."""
    return encode_double(_parse_float(value))


def _parse_float(text: str) -> float:
    # float() also takes '1_000', ' 1 ' and non-ASCII digits, none of which TiCDC sends.
    if text.__class__ is not str:
        raise TypeError(f"expected text, got {type(text).__name__}")
    if not text.isascii() or "_" in text or text != text.strip():
        raise ValueError(f"not a number: {preview(text)}")
    return float(text)


# Strings -----------------------------------------------------------------------------------------


def encode_text(value: str) -> bytes:
    """Text (CHAR, VARCHAR, TEXT, DECIMAL, DATE, DATETIME, TIME, JSON): length and UTF-8 bytes."""
    data = value.encode()
    return _pack_uint32(len(data)) + data


def encode_optional_text(value: str | None) -> bytes:
    """`encode_text` of a nullable column: NULL appends nothing."""
    if value is None:
        return b""
    data = value.encode()
    return _pack_uint32(len(data)) + data


def optional(encode: Encoder) -> Encoder:
    """The encoder of a nullable column: NULL appends nothing, anything else is `encode`d."""
    if encode is encode_text:
        return encode_optional_text

    def encode_or_nothing(value: Any) -> bytes:
        return b"" if value is None else encode(value)

    return encode_or_nothing


def encode_bytes(value: bytes) -> bytes:
    """A binary string (BINARY, VARBINARY, BLOB): length and the bytes."""
    if value.__class__ is not bytes:
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    return _pack_uint32(len(value)) + value


def encode_base64(value: str) -> bytes:
    """A binary string sent as standard base64 (Simple JSON)."""
    return encode_bytes(binascii.a2b_base64(value, strict_mode=True))


# ENUM, SET and VECTOR ----------------------------------------------------------------------------


def parse_allowed(allowed: str) -> list[str]:
    """The members of an Avro ENUM/SET `allowed` parameter: split on unescaped commas, `\\,` -> `,`."""
    members: list[str] = []
    current: list[str] = []
    index = 0
    while index < len(allowed):
        char = allowed[index]
        if char == "\\" and allowed.startswith(",", index + 1):
            current.append(",")
            index += 2
            continue
        if char == ",":
            members.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    members.append("".join(current))
    return members


def _as_listed(name: str) -> str:
    # TiCDC rewrites `\'` and `''` to `'` in the members it lists (escapeEnumAndSetOptions), not in
    # the values it sends: a value is looked up this way when it is not found as is.
    return name.replace("\\'", "'").replace("''", "'")


class EnumIndex(dict[str, bytes]):
    """ENUM member name -> the 8 bytes of its 1-based index; a miss is an unknown member."""

    __slots__ = ("members",)

    def __init__(self, members: Sequence[str]) -> None:
        super().__init__()
        self.members = tuple(members)
        for position, name in enumerate(self.members):
            self.setdefault(name, _pack_uint64(position + 1))

    def __missing__(self, name: str) -> bytes:
        if name.__class__ is not str:
            raise TypeError(f"expected an ENUM member name, got {type(name).__name__}")
        listed = _as_listed(name)
        if listed != name and listed in self:
            return self[listed]
        raise ValueError(f"{preview(name)} is not a member of ENUM({', '.join(map(repr, self.members))})")


# Distinct SET values memoised per column.
_SET_MEMO_LIMIT = 4096


class SetMask(dict[str, bytes]):
    """SET value (member names joined by `,`, `""` empty) -> the 8 bytes of its bitmask."""

    __slots__ = ("bits", "members")

    def __init__(self, members: Sequence[str]) -> None:
        super().__init__()
        self.members = tuple(members)
        self.bits: dict[str, int] = {}
        for position, name in enumerate(self.members):
            self.bits.setdefault(name, 1 << position)

    def __missing__(self, value: str) -> bytes:
        if value.__class__ is not str:
            raise TypeError(f"expected SET member names, got {type(value).__name__}")
        mask = 0
        if value:
            for name in value.split(","):
                bit = self.bits.get(name)
                if bit is None:
                    bit = self.bits.get(_as_listed(name))
                if bit is None:
                    raise ValueError(f"{preview(name)} is not a member of SET({', '.join(map(repr, self.members))})")
                mask |= bit
        encoded = _pack_uint64(mask)
        if len(self) < _SET_MEMO_LIMIT:
            self[value] = encoded
        return encoded


def encode_vector_text(value: str) -> bytes:
    """A VECTOR sent as text (`"[1,2.5]"`): element count, then each element as float32."""
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"not a vector text '[x,y,...]': {preview(value)}")
    body = text[1:-1].strip()
    elements = [_parse_float(item.strip()) for item in body.split(",")] if body else []
    count = len(elements)
    return struct.pack(f"<I{count}f", count, *elements)


def encode_nothing(value: object) -> bytes:
    """GEOMETRY (and any type TiDB leaves out of the checksum): no bytes."""
    return b""


# Expected values ---------------------------------------------------------------------------------


def parse_expected(value: object) -> int | None:
    """A carried checksum as a uint32; None for 'absent' (`None`, `""`). ValueError when malformed."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        if not (value.isdigit() and value.isascii()):
            raise ValueError(f"checksum {preview(value)} is not a decimal uint32")
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ValueError(f"checksum {preview(value)} is not a decimal uint32")
    if not 0 <= number <= UINT32_MAX:
        raise ValueError(f"checksum {number} is outside the uint32 range")
    return number


def describe_value(value: object, limit: int = 60) -> str:
    """A short repr of a column value for a detail line."""
    return preview(value, limit)
