"""JSON from outside the process (Kafka records, kdiv's own topics included, files, answers),
parsed within bounds: a size, a nesting depth, and one error type naming what is wrong.

`json.loads` recurses once per nesting level: a value of 100,000 `[` raises RecursionError,
which no reader catches as a bad input. Here nesting deeper than `MAX_DEPTH` is refused
before parsing, and every failure is an `UntrustedJSONError` (a ValueError).

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Deeper than any JSON kdiv reads (incidents, schemas, TiCDC messages nest a few levels).
MAX_DEPTH = 64
# Kafka's default largest record (message.max.bytes) is 1 MiB.
MAX_BYTES = 1 << 20

_STRING_BYTES = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRING_TEXT = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET_BYTES = re.compile(rb"[\[\]{}]")
_BRACKET_TEXT = re.compile(r"[\[\]{}]")


class UntrustedJSONError(ValueError):
    """Input that is not JSON, or JSON beyond the bounds; the message says which."""


def nesting_depth(raw: bytes | str) -> int:
    """The deepest nesting of arrays and objects in `raw`, brackets inside strings not
    counted; for malformed input, about as deep as a parser would go before it fails."""
    if isinstance(raw, str):
        brackets = [m.group() for m in _BRACKET_TEXT.finditer(_STRING_TEXT.sub("", raw))]
    else:
        brackets = [m.group().decode() for m in _BRACKET_BYTES.finditer(_STRING_BYTES.sub(b"", raw))]
    depth = deepest = 0
    for bracket in brackets:
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_json(
    raw: bytes | bytearray | memoryview | str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES
) -> Any:
    """The JSON value in `raw`; UntrustedJSONError when it is not JSON, is larger than
    `max_bytes` or nests deeper than `max_depth`."""
    if isinstance(raw, bytearray | memoryview):
        raw = bytes(raw)
    if len(raw) > max_bytes:
        raise UntrustedJSONError(f"JSON of {len(raw):,} bytes is larger than the {max_bytes:,} read")
    # Cheap for the common case: fewer opening brackets than the bound cannot nest deeper.
    openings = raw.count("[") + raw.count("{") if isinstance(raw, str) else raw.count(b"[") + raw.count(b"{")
    if openings > max_depth:
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise UntrustedJSONError(f"JSON nests {depth} levels deep, more than the {max_depth} read")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as bad:
        raise UntrustedJSONError(f"not JSON: {bad.msg} at line {bad.lineno} column {bad.colno}") from None
    except RecursionError:  # a bound above the interpreter's recursion limit
        raise UntrustedJSONError("JSON nests deeper than the parser can follow") from None
    except ValueError as bad:  # not UTF-8, an integer of more digits than Python converts
        raise UntrustedJSONError(f"not JSON: {bad}") from None


def json_object(raw: bytes | bytearray | memoryview | str, what: str = "value") -> dict[str, Any]:
    """`parse_json` of a value that must be a JSON object; UntrustedJSONError otherwise."""
    parsed = parse_json(raw)
    if not isinstance(parsed, dict):
        raise UntrustedJSONError(f"{what} is JSON {type_name(parsed)}, not an object")
    return parsed


def type_name(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
