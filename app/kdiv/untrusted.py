"""JSON from outside the process (Kafka records, kdiv's own topics included, files, answers),
parsed within bounds: a size, a nesting depth, and one error type naming what is wrong.

`json.loads` recurses once per nesting level: a value of 100,000 `[` raises RecursionError,
which no reader catches as a bad input. Here nesting deeper than `MAX_DEPTH` is refused
before parsing, and every failure is an `UntrustedJSONError` (a ValueError).

The depth is counted in one pass whose cost is linear in the input whatever its shape:
strings are cut out by `JSON_STRINGS`, which matches from every quote (to the closing quote,
or to the end of an unclosed string), so no byte is read more than twice; what is left but
brackets is dropped, and the brackets summed (bench/untrusted.py).

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
import reprlib
from itertools import accumulate
from typing import Any

# Deeper than any JSON kdiv reads (incidents, schemas, TiCDC messages nest a few levels).
MAX_DEPTH = 64
# Kafka's default largest record (message.max.bytes) is 1 MiB.
MAX_BYTES = 1 << 20
# How much of an outside value a log line or an error message shows (`preview`).
PREVIEW_CHARS = 80

# A JSON string in UTF-8, from its opening quote to its closing one, or to the end of the
# input when it is not closed (a trailing lone backslash included). It matches wherever a
# quote is: a pattern of closed strings only fails at each quote of an unclosed run of \"
# after reading to the end, which is quadratic. Possessive loops: no backtracking.
JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
# Strings with what separates them but no bracket (`"a", "b": "c"`): one match, not one
# each, where a run of strings is long. Its start is a quote, so it matches where a quote is;
# the bytes after its last string are read twice at most (by it, then by the next search).
JSON_STRINGS = re.compile(JSON_STRING.pattern + rb'(?:[^"\[\]{}]*+' + JSON_STRING.pattern + rb")*+", re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHUNK = 4096
_NESTING_STEP = [0] * 256
for _bracket in b"[{":
    _NESTING_STEP[_bracket] = 1
for _bracket in b"]}":
    _NESTING_STEP[_bracket] = -1


class UntrustedJSONError(ValueError):
    """Input that is not JSON, or JSON beyond the bounds; the message says which."""


def nesting_depth(raw: bytes | str) -> int:
    """The deepest nesting of arrays and objects in `raw`, brackets inside strings not
    counted; for malformed input, about as deep as a parser would go before it fails (an
    unclosed string runs to the end). Linear in len(raw)."""
    return _deepest(JSON_STRINGS.sub(b"", _utf8(raw)).translate(None, _NOT_BRACKETS))


def _deepest(brackets: bytes) -> int:
    """The largest running sum of +1 per opening and -1 per closing bracket (0 at least).
    Chunk by chunk: one that cannot go deeper than before, or only opens, is counted, not
    summed (an int object per bracket, when a million brackets deep)."""
    depth = deepest = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        chunk = brackets[start : start + _DEPTH_CHUNK]
        openings = chunk.count(b"[") + chunk.count(b"{")
        if depth + openings > deepest:
            if openings == len(chunk):
                deepest = depth + openings
            else:
                deepest = max(deepest, max(accumulate(map(_NESTING_STEP.__getitem__, chunk), initial=depth)))
        depth += 2 * openings - len(chunk)
    return deepest


def _utf8(raw: bytes | str) -> bytes:
    """`raw` as UTF-8, where a quote, backslash or bracket byte is always that character
    (in UTF-16 or UTF-32, which json.loads also takes, it may be half of another)."""
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    encoding = json.detect_encoding(raw)
    if encoding.startswith("utf-8"):
        return raw
    # What does not decode is not JSON either; json.loads refuses it after this count.
    return raw.decode(encoding, "replace").encode("utf-8", "surrogatepass")


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


def preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    """An outside value as a log line or an error message shows it: the repr of bytes or a
    string cut after `limit` bytes or characters, with its length when cut (a key of 1 MiB is
    not a log line of megabytes); of an exception, its message (its type when it has none); of anything else (a
    parsed JSON value), a repr bounded as it is built; those two cut after `limit` characters."""
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if isinstance(value, bytes | str):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value):,} {unit})"
    if isinstance(value, BaseException):  # its message, which may quote what it read
        text = str(value) or type(value).__name__
        return text if len(text) <= limit else text[:limit] + "..."
    try:
        text = _BOUNDED_REPR.repr(value)
    except ValueError:  # an integer of more digits than Python converts
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


# Containers shown a few items deep and wide, strings cut: no repr of megabytes built to be cut.
_BOUNDED_REPR = reprlib.Repr()
_BOUNDED_REPR.maxlevel = 3
_BOUNDED_REPR.maxdict = _BOUNDED_REPR.maxlist = _BOUNDED_REPR.maxtuple = 6
_BOUNDED_REPR.maxset = _BOUNDED_REPR.maxfrozenset = _BOUNDED_REPR.maxdeque = 6
_BOUNDED_REPR.maxstring = _BOUNDED_REPR.maxother = _BOUNDED_REPR.maxlong = PREVIEW_CHARS
