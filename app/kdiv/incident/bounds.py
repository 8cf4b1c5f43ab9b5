"""The bounds of an incident: the longest each field may be, and the largest record.

Anyone can write to the incidents topic and every worker holds what it reads, so a value over
a bound is no incident (`shape.Incident.from_value` refuses it). What kdiv builds itself is
`fitted` to the bounds: details and row keys embed outside data (a record's header, a
changefeed row, a schema's subjects), so what is over is cut, with a marker saying how much.
schema.json and docs/incidents.md give the same numbers (a unit test holds them together).

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kdiv.incident.shape import Incident

# Characters (code points, as JSON Schema's maxLength counts them) of each string field.
MAX_CHARS = {
    "topic": 249,  # Kafka's longest topic name
    "verdict": 64,
    "detail": 4096,
    "expected_subject": 256,
    "table": 256,
    "route": 256,
    "group": 256,
}
MAX_REGISTERED_SUBJECTS = 16
MAX_SUBJECT_CHARS = 256
MAX_ROW_KEY_COLUMNS = 16
MAX_COLUMN_CHARS = 64  # TiDB's longest identifier
MAX_ROW_KEY_VALUE_CHARS = 256
# Every integer field, and a row key's integers: 64 bits, signed or not (a TiDB commit ts is unsigned).
MIN_INT = -(1 << 63)
MAX_INT = (1 << 64) - 1
# Producer GUIDs and trace ids as every incident writes them: 16 bytes as lowercase hex.
HEX_ID = re.compile(r"[0-9a-f]{32}")
# A class as kdiv names them (MISSING, LOG_REWOUND, ...): what the views count incidents by.
VERDICT = re.compile(r"[A-Z][A-Z0-9_]*")
# The largest incidents topic value read; refused before parsing. Every value within the
# bounds above fits, even one whose every character JSON escapes as a surrogate pair (12 bytes).
MAX_INCIDENT_BYTES = 256 * 1024

# The integer fields that may be null; the others are Kafka's numbers or the clock's.
_OPTIONAL_INTS = (
    "segment", "seq", "record_timestamp_ms", "resolved_at_ms", "schema_id", "commit_ts",
    "expected_checksum", "computed_checksum", "hop",
)  # fmt: skip
_CUT = "…[{} more characters cut]"


def cut(text: str, limit: int) -> str:
    """`text` within `limit` characters: as it is, or its start and a marker of what was cut."""
    if len(text) <= limit:
        return text
    # The marker's own length depends on the count; the count includes the room it takes.
    kept = limit - len(_CUT.format(len(text)))
    return text[:kept] + _CUT.format(len(text) - kept)


def over_bound(fields: dict[str, object]) -> str | None:
    """What in an incident's checked fields is over its bound, the first found; None when nothing is."""
    for name, limit in MAX_CHARS.items():
        value = fields.get(name)
        if isinstance(value, str) and len(value) > limit:
            return f"incident field {name} is {len(value):,} characters long, more than {limit:,}"
    for name, value in fields.items():
        if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
            return f"incident field {name} is outside 64 bits"
    verdict = fields.get("verdict")
    if isinstance(verdict, str) and not VERDICT.fullmatch(verdict):
        return f"incident field verdict is {verdict[:40]!r}, not a class (capital letters, digits and _)"
    for name in ("producer", "trace_id"):
        value = fields.get(name)
        if isinstance(value, str) and not HEX_ID.fullmatch(value):
            return f"incident field {name} is {value[:40]!r}, not 32 lowercase hex digits"
    subjects = fields.get("registered_subjects")
    if isinstance(subjects, tuple):
        if len(subjects) > MAX_REGISTERED_SUBJECTS:
            return (
                f"incident field registered_subjects has {len(subjects):,} items, more than {MAX_REGISTERED_SUBJECTS}"
            )
        if any(len(s) > MAX_SUBJECT_CHARS for s in subjects):
            return f"incident field registered_subjects has a subject longer than {MAX_SUBJECT_CHARS} characters"
    row_key = fields.get("row_key")
    if isinstance(row_key, tuple):
        return _row_key_over(row_key)
    return None


def _row_key_over(row_key: tuple) -> str | None:
    if len(row_key) > MAX_ROW_KEY_COLUMNS:
        return f"incident field row_key has {len(row_key):,} columns, more than {MAX_ROW_KEY_COLUMNS}"
    for column, value in row_key:
        if len(column) > MAX_COLUMN_CHARS:
            return f"incident field row_key has a column name longer than {MAX_COLUMN_CHARS} characters"
        if isinstance(value, str) and len(value) > MAX_ROW_KEY_VALUE_CHARS:
            return f"incident field row_key's column {column!r} is longer than {MAX_ROW_KEY_VALUE_CHARS} characters"
        if isinstance(value, int) and not isinstance(value, bool) and not MIN_INT <= value <= MAX_INT:
            return f"incident field row_key's column {column!r} is outside 64 bits"
    return None


def fitted(incident: Incident) -> Incident:
    """`incident` within the bounds: what is over is cut, with a marker (a list's or a row
    key's cut is said in the detail); an integer outside 64 bits becomes null (said in the
    detail). The incident itself when it fits, as every incident kdiv builds from its own
    numbers does."""
    changes: dict[str, object] = {}
    notes: list[str] = []
    subjects = incident.registered_subjects
    if subjects is not None:
        fit = tuple(cut(s, MAX_SUBJECT_CHARS) for s in subjects[:MAX_REGISTERED_SUBJECTS])
        if len(subjects) > MAX_REGISTERED_SUBJECTS:
            notes.append(f"registered under {len(subjects)} subjects, the first {MAX_REGISTERED_SUBJECTS} listed")
        if fit != subjects:
            changes["registered_subjects"] = fit
    if incident.row_key is not None:
        row_key = tuple((cut(column, MAX_COLUMN_CHARS), _fitted_value(value)) for column, value in incident.row_key)[
            :MAX_ROW_KEY_COLUMNS
        ]
        if len(incident.row_key) > MAX_ROW_KEY_COLUMNS:
            notes.append(f"the row key has {len(incident.row_key)} columns, the first {MAX_ROW_KEY_COLUMNS} listed")
        if row_key != incident.row_key:
            changes["row_key"] = row_key
    for name in _OPTIONAL_INTS:
        changes.update(_fitted_int(incident, name, notes))
    # The notes are kdiv's own few words: the detail from outside is cut to make room for them.
    said = "".join(f" ({note})" for note in notes)
    detail = cut(incident.detail, MAX_CHARS["detail"] - len(said)) + said
    if detail != incident.detail:
        changes["detail"] = detail
    for name, limit in MAX_CHARS.items():
        value = getattr(incident, name)
        if name != "detail" and isinstance(value, str) and len(value) > limit:
            changes[name] = cut(value, limit)
    return replace(incident, **changes) if changes else incident  # type: ignore[arg-type]


def _fitted_value(value: object) -> object:
    if isinstance(value, str):
        return cut(value, MAX_ROW_KEY_VALUE_CHARS)
    if isinstance(value, int) and not isinstance(value, bool) and not MIN_INT <= value <= MAX_INT:
        return cut(hex(value), MAX_ROW_KEY_VALUE_CHARS)  # str() refuses ints of over 4300 digits
    return value


def _fitted_int(incident: Incident, name: str, notes: list[str]) -> dict[str, object]:
    value = getattr(incident, name)
    if value is None or MIN_INT <= value <= MAX_INT:
        return {}
    notes.append(f"{name} {cut(hex(value), 40)} is outside 64 bits, left out")
    return {name: None}
