"""The JSON Lines formats of `kdiv dump` (records) and `kdiv check` (verdicts, faults).

Record line:  {"topic", "partition", "offset", "timestamp", "key": base64|null,
               "value": base64|null, "headers": [[name, base64|null], ...]}
Verdict line (`kdiv check`, `kdiv validate`) and checksum fault line (`kdiv check --ticdc`):
              an incident (kdiv/incident/schema.json, docs/incidents.md), as the incidents
              topic holds it; a verdict line of a record that is no fault has severity null,
              and one of a gap's record (exact semantics) adds "gap"; a MISSING one is the
              gap's incident, and adds "record" (the offset and seq judged).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING

from kdiv.div.exact import GapReport
from kdiv.div.faults import Verdict
from kdiv.div.record import ConsumedRecord
from kdiv.div.validator import ValidationResult
from kdiv.incident.builders import checksum_incident, gap_incident, verdict_incident
from kdiv.untrusted import UntrustedJSONError, parse_json

if TYPE_CHECKING:  # `kdiv check` without --ticdc loads no Avro library
    from kdiv.changefeed.verify import RowVerdict


class InputError(ValueError):
    """A line that is not a valid record; the message names the source and line."""


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode("ascii")


def _unb64(value, what: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a base64 string or null, not {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as bad:
        raise ValueError(f"{what} is not valid base64: {bad}") from None


def _int(obj: dict, name: str, minimum: int | None = None) -> int:
    if name not in obj:
        raise ValueError(f"missing field {name!r}")
    value = obj[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field {name!r} must be an integer, not {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"field {name!r} must be >= {minimum}, not {value}")
    return value


def _record_from_obj(obj) -> ConsumedRecord:
    if not isinstance(obj, dict):
        raise ValueError(f"a record must be a JSON object, not {type(obj).__name__}")
    topic = obj.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ValueError("field 'topic' must be a non-empty string")
    raw_headers = obj.get("headers", [])
    if not isinstance(raw_headers, list):
        raise ValueError("field 'headers' must be a list of [name, base64|null] pairs")
    headers = []
    for i, pair in enumerate(raw_headers):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError(f"headers[{i}] must be a [name, base64|null] pair")
        headers.append((pair[0], _unb64(pair[1], f"headers[{i}] value")))
    return ConsumedRecord(
        topic=topic,
        partition=_int(obj, "partition", 0),
        offset=_int(obj, "offset", 0),
        timestamp=_int(obj, "timestamp"),
        key=_unb64(obj.get("key"), "key"),
        value=_unb64(obj.get("value"), "value"),
        headers=tuple(headers),
    )


def not_json_lines(head: bytes) -> str | None:
    """Why input whose first bytes are `head` is no JSON Lines at all (compressed or binary,
    said once rather than once per line), or None."""
    if head.startswith(b"\x1f\x8b"):
        return "is gzip-compressed, not JSON Lines: decompress it first (gunzip -c FILE | kdiv check)"
    if b"\x00" in head:
        return "is binary data (a NUL byte in its first bytes), not JSON Lines as `kdiv dump` writes"
    return None


def ticdc_protocol_of(record: ConsumedRecord) -> str | None:
    """The TiCDC protocol a record without a div header looks written in ("avro": Confluent-framed
    key and value; "simple": a JSON message naming its table and type), or None."""
    value = record.value
    if not value:
        return None
    if value[0] == 0 and len(value) > 5 and record.key is not None and record.key[:1] == b"\x00":
        return "avro"
    if value[:1] == b"{":
        try:
            message = json.loads(value)
        except ValueError:
            return None
        if isinstance(message, dict) and "table" in message and "type" in message:
            return "simple"
    return None


# A line holds one record with its key, value and headers base64-encoded (a third larger);
# brokers are often configured for records well past Kafka's 1 MiB default.
MAX_LINE_BYTES = 64 << 20


def parse_record(line: str, source: str, lineno: int) -> ConsumedRecord:
    try:
        obj = parse_json(line, max_bytes=MAX_LINE_BYTES)
    except UntrustedJSONError as bad:
        raise InputError(f"{source}:{lineno}: {bad}") from None
    try:
        return _record_from_obj(obj)
    except ValueError as bad:
        raise InputError(f"{source}:{lineno}: {bad}") from None


def parse_record_bytes(raw: bytes, source: str, lineno: int) -> ConsumedRecord:
    """`parse_record` of a line as read from a binary file."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise InputError(f"{source}:{lineno}: not UTF-8 (byte {bad.start + 1} of the line)") from None
    return parse_record(line, source, lineno)


def record_to_line(record: ConsumedRecord) -> str:
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "key": _b64(record.key),
            "value": _b64(record.value),
            "headers": [[name, _b64(value)] for name, value in record.headers],
        },
        separators=(",", ":"),
    )


def result_to_line(result: ValidationResult, checked_at_ms: int) -> str:
    """A verdict as an incident line, judged at `checked_at_ms` (its detected_at_ms). A
    MISSING record of a gap (exact semantics) is the gap's incident as the worker writes it
    at that record (the gap's first seq, the offset that found it), with the record judged
    beside it in `record`."""
    record = result.record
    if result.gap is not None and result.guid is not None and result.verdict is Verdict.MISSING:
        line = gap_incident(result, checked_at_ms).to_json()
        line["record"] = {"offset": record.offset, "seq": result.seq}
    else:
        line = verdict_incident(result, checked_at_ms).to_json()
    if not result.verdict.is_fault:
        line["severity"] = None
    if result.gap is not None:
        line["gap"] = _gap_fields(result.gap)
    return json.dumps(line, separators=(",", ":"))


def _gap_fields(gap: GapReport) -> dict:
    """The gap a MISSING or LATE record belongs to (exact semantics), as it stands after it."""
    return {
        "segment": gap.segment,
        "first": gap.first,
        "last": gap.last,
        "found_offset": gap.found_offset,
        "judged_after": gap.judged,
        "arrived": gap.arrived_count,
        "resolved": gap.resolved,
    }


def checksum_fault_to_line(row: RowVerdict, checked_at_ms: int) -> str:
    """A faulty row as an incident line, found at `checked_at_ms` (its detected_at_ms)."""
    return json.dumps(checksum_incident(row, checked_at_ms).to_json(), separators=(",", ":"))
