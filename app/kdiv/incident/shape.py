"""The incident: one fault, as the incidents topic, the views and `kdiv check` hold it.

Every incident carries every field (schema.json), null where it does not apply. The topic's
key stays the one earlier releases wrote, so a fault found again after an upgrade rewrites
its key instead of adding a second record; values written before the shape was versioned
(no `incident_version`: -1 for an unknown time, "-" for no producer, `{}` for no row key)
are still read, and normalised.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from kdiv.incident.bounds import MAX_INCIDENT_BYTES, over_bound
from kdiv.untrusted import json_object, preview, type_name

# The version of the shape `Incident.to_json` writes; values without the field are version 1.
INCIDENT_VERSION = 2
# What the key and version-1 values name a producer-less incident's producer.
NO_PRODUCER = "-"
SEVERITIES = ("fatal", "warning")
# An error names this many of a value's unknown fields, then counts the rest.
_UNKNOWN_SHOWN = 5

RowKey = tuple[tuple[str, object], ...]


@dataclass(frozen=True, slots=True)
class Incident:
    """One fault. `producer`, `segment` and `seq` are None for a record without a readable
    producer and for incidents of a partition, a schema, a row or a trace."""

    topic: str
    partition: int
    producer: str | None  # the writer's GUID as hex
    segment: int | None
    seq: int | None
    verdict: str
    offset: int
    severity: str  # "fatal" or "warning"
    detail: str
    record_timestamp_ms: int | None  # the record's time; a trace's origin; None when unknown
    detected_at_ms: int
    # Schema incidents (SCHEMA_UNKNOWN, SUBJECT_MISMATCH) are identified by schema id and
    # field ("key"/"value") instead of producer and sequence.
    schema_id: int | None = None
    message_field: str | None = None
    expected_subject: str | None = None
    registered_subjects: tuple[str, ...] | None = None
    resolved_at_ms: int | None = None
    # Row checksum incidents (TiCDC changefeeds): the row, as the message names it.
    table: str | None = None
    row_key: RowKey | None = None
    row_image: str | None = None
    commit_ts: int | None = None
    expected_checksum: int | None = None
    computed_checksum: int | None = None
    # Pipeline audit incidents (LOST, DUPLICATED, UNRESOLVED): the trace and the hop.
    route: str | None = None
    trace_id: str | None = None
    hop: int | None = None
    group: str | None = None

    @property
    def _key_fields(self) -> dict:
        # The key earlier releases wrote: "-", -1 and the offset fill what a value now leaves null.
        if self.trace_id is not None:
            return {"route": self.route, "trace": self.trace_id, "hop": self.hop, "class": self.verdict}
        if self.row_image is not None:
            return {
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "image": self.row_image,
                "class": self.verdict,
            }
        if self.schema_id is not None:
            return {
                "topic": self.topic,
                "partition": self.partition,
                "field": self.message_field,
                "schema_id": self.schema_id,
                "class": self.verdict,
            }
        return {
            "topic": self.topic,
            "partition": self.partition,
            "producer": NO_PRODUCER if self.producer is None else self.producer,
            "segment": -1 if self.segment is None else self.segment,
            "seq": self.offset if self.seq is None else self.seq,
            "class": self.verdict,
        }

    @property
    def identity(self) -> tuple:
        """What makes two reports the same fault (the compacted topic's key fields)."""
        return tuple(self._key_fields.values())

    @property
    def key(self) -> bytes:
        """The incidents topic key: the identity as JSON."""
        return json.dumps(self._key_fields, separators=(",", ":")).encode()

    def to_json(self) -> dict:
        """The incident as schema.json describes it: every field, null where it does not apply."""
        shown: dict = {"incident_version": INCIDENT_VERSION}
        shown.update(asdict(self))
        shown["registered_subjects"] = None if self.registered_subjects is None else list(self.registered_subjects)
        shown["row_key"] = row_key_json(self.row_key)
        return shown

    @property
    def value(self) -> bytes:
        """The incidents topic value: the incident as JSON."""
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_value(cls, value: bytes) -> Incident:
        """An incident read back from the incidents topic, every field checked against its
        type; ValueError naming the first that is wrong (anyone can write to the topic).
        Version-1 values are normalised: -1 times and segments, "-" producers and `{}` row
        keys become null. A value over the bounds (`kdiv.incident.bounds`) is refused too,
        one larger than MAX_INCIDENT_BYTES before it is parsed."""
        if len(value) > MAX_INCIDENT_BYTES:
            raise ValueError(f"incident of {len(value):,} bytes is larger than the {MAX_INCIDENT_BYTES:,} read")
        raw_fields = json_object(value, "incident")
        version = raw_fields.pop("incident_version", 1)
        if version not in (1, INCIDENT_VERSION) or isinstance(version, bool):
            raise ValueError(f"incident_version is {preview(version)}, not 1 or {INCIDENT_VERSION}")
        unknown = sorted(raw_fields.keys() - _FIELD_TYPES.keys())
        if unknown:
            shown = ", ".join(map(preview, unknown[:_UNKNOWN_SHOWN]))
            more = f" and {len(unknown) - _UNKNOWN_SHOWN:,} more" if len(unknown) > _UNKNOWN_SHOWN else ""
            raise ValueError(f"incident has unknown field(s) {shown}{more}")
        missing = [name for name in _REQUIRED if name not in raw_fields]
        if missing:
            raise ValueError(f"incident lacks field(s) {', '.join(missing)}")
        # A field a value leaves out does not apply to it (version 1 wrote only those that did).
        checked: dict[str, object] = dict.fromkeys(_FIELD_TYPES)
        for name, raw in raw_fields.items():
            kind = _FIELD_TYPES[name]
            if raw is None and name not in _REQUIRED:
                checked[name] = None
            elif kind is int:
                # JSON true is a Python int too; an incident's numbers never are booleans.
                if not isinstance(raw, int) or isinstance(raw, bool):
                    raise ValueError(f"incident field {name} is {type_name(raw)} {preview(raw)}, not an integer")
                checked[name] = raw
            elif kind is str:
                if not isinstance(raw, str):
                    raise ValueError(f"incident field {name} is {type_name(raw)} {preview(raw)}, not a string")
                checked[name] = raw
            elif name == "registered_subjects":
                if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
                    raise ValueError(f"incident field registered_subjects is {preview(raw)}, not a list of strings")
                checked[name] = tuple(raw)
            else:  # row_key: {column: value}, or the [[column, value], ...] pairs version 1 wrote
                checked[name] = _row_key(raw)
        if checked["severity"] not in SEVERITIES:
            raise ValueError(f"incident field severity is {preview(checked['severity'])}, not fatal or warning")
        normalised = _normalised(checked)
        problem = over_bound(normalised)
        if problem is not None:
            raise ValueError(problem)
        return cls(**normalised)  # type: ignore[arg-type]  # each field checked above


def row_key_json(row_key: RowKey | None) -> dict | None:
    """A row's key columns as every report shows them: {column: value}, or null."""
    return None if not row_key else dict(row_key)


def _normalised(checked: dict[str, object]) -> dict[str, object]:
    """Version 1's stand-ins for "does not apply" as null."""
    if checked.get("producer") == NO_PRODUCER:
        checked.update(producer=None, segment=None, seq=None)
    for name in ("segment", "record_timestamp_ms"):
        if checked.get(name) == -1:
            checked[name] = None
    if checked.get("row_key") == ():
        checked["row_key"] = None
    return checked


def _row_key(raw: object) -> RowKey:
    if isinstance(raw, dict):
        pairs: list = list(raw.items())
    elif isinstance(raw, list):
        pairs = raw
    else:
        raise ValueError(f"incident field row_key is {type_name(raw)} {preview(raw)}, not an object")
    row_key = []
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError(f"incident field row_key holds {preview(pair)}, not a column and its value")
        if not isinstance(pair[1], str | int | float | bool | None):
            raise ValueError(f"incident field row_key's column {preview(pair[0])} is {type_name(pair[1])}, not a value")
        row_key.append((pair[0], pair[1]))
    return tuple(row_key)


# What `from_value` checks, from the annotations ("int", "str | None", "RowKey | None", ...).
_KINDS = {"int": int, "str": str, "tuple": tuple, "RowKey": tuple}
_FIELD_TYPES: dict[str, type] = {f.name: _KINDS[str(f.type).split("[")[0].split(" ")[0]] for f in fields(Incident)}
_REQUIRED = frozenset(f.name for f in fields(Incident) if not str(f.type).endswith("| None"))
