"""Incidents: one per fault, keyed by the fault's identity so a replay rewrites a key.

The key is (topic, partition, producer, segment, seq, class): a worker that validates the
same record again after a crash produces the same key, which a compacted topic (and every
reader here) keeps once. Records without a readable producer (MALFORMED) are identified by
their offset instead.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import cast

from kdiv.changefeed.verify import RowVerdict, fault_detail, key_columns
from kdiv.div.faults import Verdict
from kdiv.div.validator import Eviction, ValidationResult
from kdiv.trace.judge import TraceOutcome, TraceVerdict
from kdiv.untrusted import json_object, type_name
from kdiv.worker.live import Rewind
from kdiv.worker.retention import LOSS_VERDICTS, Deletion

NOT_FAULTS = frozenset({Verdict.OK, Verdict.UNTRACKED})
NO_PRODUCER = "-"


@dataclass(frozen=True, slots=True)
class Incident:
    """One fault as the incidents topic and the views hold it."""

    topic: str
    partition: int
    producer: str  # GUID as hex, or "-" when the record has no readable producer
    segment: int
    seq: int
    verdict: str
    offset: int
    severity: str  # "fatal" inside a push, else "warning"
    detail: str
    record_timestamp_ms: int
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
    row_key: tuple[tuple[str, object], ...] | None = None
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
    def identity(self) -> tuple:
        """What makes two reports the same fault (the compacted topic's key fields)."""
        if self.trace_id is not None:
            return (self.route, self.trace_id, self.hop, self.verdict)
        if self.row_image is not None:
            return (self.topic, self.partition, self.offset, self.row_image, self.verdict)
        if self.schema_id is not None:
            return (self.topic, self.partition, self.message_field, self.schema_id, self.verdict)
        return (self.topic, self.partition, self.producer, self.segment, self.seq, self.verdict)

    @property
    def key(self) -> bytes:
        """The incidents topic key: the identity as JSON."""
        if self.trace_id is not None:
            fields = {"route": self.route, "trace": self.trace_id, "hop": self.hop, "class": self.verdict}
        elif self.row_image is not None:
            fields = {
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "image": self.row_image,
                "class": self.verdict,
            }
        elif self.schema_id is not None:
            fields = {
                "topic": self.topic,
                "partition": self.partition,
                "field": self.message_field,
                "schema_id": self.schema_id,
                "class": self.verdict,
            }
        else:
            fields = {
                "topic": self.topic,
                "partition": self.partition,
                "producer": self.producer,
                "segment": self.segment,
                "seq": self.seq,
                "class": self.verdict,
            }
        return json.dumps(fields, separators=(",", ":")).encode()

    def to_json(self) -> dict:
        """The incident as the views show it."""
        fields = asdict(self)
        if self.schema_id is None:  # DIV incidents keep their original shape (and a gap's resolution)
            for name in ("schema_id", "message_field", "expected_subject", "registered_subjects"):
                del fields[name]
            if self.resolved_at_ms is None:
                del fields["resolved_at_ms"]
        if self.row_image is None:
            for name in _ROW_FIELDS:
                del fields[name]
        if self.trace_id is None:
            for name in _TRACE_FIELDS:
                del fields[name]
        else:
            fields["row_key"] = dict(self.row_key or ())
        return fields

    @property
    def value(self) -> bytes:
        """The incidents topic value: the incident as JSON."""
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_value(cls, value: bytes) -> Incident:
        """An incident read back from the incidents topic, every field checked against its
        type; ValueError naming the first that is wrong (anyone can write to the topic)."""
        fields = json_object(value, "incident")
        unknown = sorted(fields.keys() - _FIELD_TYPES.keys())
        if unknown:
            raise ValueError(f"incident has unknown field(s) {', '.join(map(repr, unknown))}")
        missing = [name for name in _REQUIRED if name not in fields]
        if missing:
            raise ValueError(f"incident lacks field(s) {', '.join(missing)}")
        checked: dict[str, object] = {}
        for name, raw in fields.items():
            kind = _FIELD_TYPES[name]
            if raw is None and name not in _REQUIRED:
                checked[name] = None
            elif kind is int:
                # JSON true is a Python int too; an incident's numbers never are booleans.
                if not isinstance(raw, int) or isinstance(raw, bool):
                    raise ValueError(f"incident field {name} is {type_name(raw)} {_shown(raw)}, not an integer")
                checked[name] = raw
            elif kind is str:
                if not isinstance(raw, str):
                    raise ValueError(f"incident field {name} is {type_name(raw)} {_shown(raw)}, not a string")
                checked[name] = raw
            elif name == "registered_subjects":
                if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
                    raise ValueError(f"incident field registered_subjects is {_shown(raw)}, not a list of strings")
                checked[name] = tuple(raw)
            else:  # row_key: {column: value}, or the [[column, value], ...] pairs asdict gives
                checked[name] = _row_key(raw)
        return cls(**checked)  # type: ignore[arg-type]  # each field checked above


def _shown(raw: object, limit: int = 40) -> str:
    text = repr(raw)
    return text if len(text) <= limit else text[:limit] + "..."


def _row_key(raw: object) -> tuple[tuple[str, object], ...]:
    if isinstance(raw, dict):
        pairs: list = list(raw.items())
    elif isinstance(raw, list):
        pairs = raw
    else:
        raise ValueError(f"incident field row_key is {type_name(raw)} {_shown(raw)}, not an object")
    row_key = []
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError(f"incident field row_key holds {_shown(pair)}, not a column and its value")
        if not isinstance(pair[1], str | int | float | bool | None):
            raise ValueError(f"incident field row_key's column {pair[0]!r} is {type_name(pair[1])}, not a value")
        row_key.append((pair[0], pair[1]))
    return tuple(row_key)


# What `from_value` checks, from the annotations ("int", "str | None", "tuple[...] | None").
_FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "str": str, "tuple": tuple}[str(f.type).split("[")[0].split(" ")[0]] for f in fields(Incident)
}
_REQUIRED = frozenset(f.name for f in fields(Incident) if not str(f.type).endswith("| None"))
_TRACE_FIELDS = ("route", "trace_id", "hop", "group")
_ROW_FIELDS = ("table", "row_key", "row_image", "commit_ts", "expected_checksum", "computed_checksum")
# A corrupt row reached the changefeed's consumers; a message kdiv cannot read is a warning.
_CHECKSUM_SEVERITY = {"CHECKSUM_MISMATCH": "fatal", "CORRUPTED_FLAG": "fatal"}


def checksum_incident(row: RowVerdict, detected_at_ms: int) -> Incident:
    """A TiCDC row whose checksum does not hold (or that TiCDC flagged, or that cannot be read);
    identified by its offset and row image, so verifying it again rewrites the same key."""
    result = row.result
    verdict = result.verdict.value
    return Incident(
        topic=row.topic,
        partition=row.partition,
        producer=NO_PRODUCER,
        segment=-1,
        seq=row.offset,
        verdict=verdict,
        offset=row.offset,
        severity=_CHECKSUM_SEVERITY.get(verdict, "warning"),
        detail=fault_detail(result),
        record_timestamp_ms=row.timestamp_ms,
        detected_at_ms=detected_at_ms,
        table=result.table,
        row_key=tuple(key_columns(result).items()),
        row_image=result.image.value,
        commit_ts=result.commit_ts,
        expected_checksum=result.expected,
        computed_checksum=result.computed,
    )


def schema_incident(
    topic: str,
    partition: int,
    offset: int,
    message_field: str,
    schema_id: int,
    verdict: str,
    expected_subject: str | None,
    registered: tuple[str, ...],
    detail: str,
    record_timestamp_ms: int,
    detected_at_ms: int,
    resolved_at_ms: int | None = None,
) -> Incident:
    """A record (or state value) whose schema id is unknown or under the wrong subject."""
    return Incident(
        topic=topic,
        partition=partition,
        producer=NO_PRODUCER,
        segment=-1,
        seq=-1,
        verdict=verdict,
        offset=offset,
        severity="warning",
        detail=detail,
        record_timestamp_ms=record_timestamp_ms,
        detected_at_ms=detected_at_ms,
        schema_id=schema_id,
        message_field=message_field,
        expected_subject=expected_subject,
        registered_subjects=registered,
        resolved_at_ms=resolved_at_ms,
    )


def partition_incident(
    topic: str, partition: int, verdict: str, offset: int, severity: str, detail: str, detected_at_ms: int
) -> Incident:
    """An incident of a partition, not of one producer's record: keyed by the offset it
    begins at (in the seq field), so finding it again after a crash rewrites the same key."""
    return Incident(
        topic=topic,
        partition=partition,
        producer=NO_PRODUCER,
        segment=-1,
        seq=offset,
        verdict=verdict,
        offset=offset,
        severity=severity,
        detail=detail,
        record_timestamp_ms=-1,
        detected_at_ms=detected_at_ms,
    )


LOG_REWOUND = "LOG_REWOUND"


def rewind_incident(rewind: Rewind, detected_at_ms: int) -> Incident:
    """Validated records gone from a partition's log (`kdiv.worker.live.Rewind`); identified
    by the first offset gone, so finding it again after a crash rewrites the same key."""
    return partition_incident(
        rewind.topic,
        rewind.partition,
        LOG_REWOUND,
        rewind.first_offset,
        "fatal" if rewind.in_push else "warning",
        f"offsets {rewind.first_offset}..{rewind.last_offset} were validated, and their records are "
        f"gone from the log (found by {rewind.detected_by}): {rewind.detail}; records at those offsets "
        f"are validated as new",
        detected_at_ms,
    )


DELETED_BEFORE_VALIDATION = "DELETED_BEFORE_VALIDATION"


def deletion_incident(deletion: Deletion, detected_at_ms: int) -> Incident:
    """Records deleted from a partition's log before the worker validated them
    (`kdiv.worker.retention.Deletion`); identified by the first offset not validated, so
    finding it again after a crash rewrites the same key (with the range the log start then
    gives)."""
    return partition_incident(
        deletion.topic,
        deletion.partition,
        DELETED_BEFORE_VALIDATION,
        deletion.first_offset,
        "fatal" if deletion.in_push else "warning",
        f"offsets {deletion.first_offset}..{deletion.last_offset} ({deletion.size} offsets) were deleted from "
        f"the log (retention or DeleteRecords) before kdiv validated them (found by {deletion.detected_by}: "
        f"{deletion.detail}); their records are never validated, and the next MISSING of each producer whose "
        f"records were among them says so",
        detected_at_ms,
    )


PRODUCERS_LIMIT = "PRODUCERS_LIMIT"


def eviction_incident(eviction: Eviction, detected_at_ms: int) -> Incident:
    """Producers a partition stopped tracking over the producer limit
    (`kdiv.div.validator.Eviction`): one incident per overflow episode, identified by the
    offset the episode began at and rewritten with its running count at each eviction."""
    return partition_incident(
        eviction.topic,
        eviction.partition,
        PRODUCERS_LIMIT,
        eviction.since_offset,
        "warning",
        f"{eviction.episode_evicted} producers evicted since offset {eviction.since_offset}: the partition "
        f"tracked more than {eviction.limit} (KDIV_PRODUCERS_LIMIT), so the least recently seen were forgotten "
        f"(the latest evicted last seen at offset {eviction.newest_last_offset}). An evicted producer seen again "
        f"is judged as a new producer (Venice's rule for an unknown GUID): its records are not checked against "
        f"those before its eviction, and a first record past segment 0 inside a push is reported",
        detected_at_ms,
    )


def deleted_note(deletion: Deletion) -> str:
    """What a producer's loss incident adds when its missing records were deleted before validation."""
    return (
        f"; deleted before validation: the producer was last seen before offsets {deletion.first_offset}.."
        f"{deletion.last_offset}, which were deleted from the log (retention or DeleteRecords) before kdiv read "
        f"them ({DELETED_BEFORE_VALIDATION} at offset {deletion.first_offset}): its missing records were among "
        f"them, unless they never reached the log"
    )


def incidents_for(result: ValidationResult, detected_at_ms: int, deleted: Deletion | None = None) -> list[Incident]:
    """The incidents a verdict raises or updates: none for OK and UNTRACKED records; for a
    record of a gap (exact semantics), the gap's one MISSING incident as it stands now, and
    first the record's own when it is not MISSING (a LATE or late CORRUPT record).

    `deleted`: the deletion before validation the record's loss lies in
    (`kdiv.worker.live.LiveValidation.deletion_behind`), which its loss incident names."""
    own = incident_for(result, detected_at_ms)
    gap = result.gap
    if gap is None or result.guid is None:
        if own is not None and deleted is not None and result.verdict in LOSS_VERDICTS:
            own = replace(own, detail=own.detail + deleted_note(deleted))
        return [] if own is None else [own]
    record = result.record
    missing = Incident(
        topic=record.topic,
        partition=record.partition,
        producer=result.guid.hex(),
        segment=gap.segment,
        seq=gap.first,
        verdict=Verdict.MISSING.value,
        offset=gap.found_offset,
        severity="fatal" if gap.fatal else "warning",
        detail=gap.describe() if deleted is None else gap.describe() + deleted_note(deleted),
        record_timestamp_ms=record.timestamp,
        detected_at_ms=detected_at_ms,
        resolved_at_ms=detected_at_ms if gap.resolved else None,
    )
    if result.verdict is Verdict.MISSING or own is None:
        return [missing]
    return [own, missing]


def incident_for(result: ValidationResult, detected_at_ms: int) -> Incident | None:
    """The incident of a verdict on its own (one per record), or None for OK and UNTRACKED
    records; `incidents_for` gives a gap's records one incident."""
    if result.verdict in NOT_FAULTS:
        return None
    record = result.record
    if result.guid is None:
        producer, segment, seq = NO_PRODUCER, -1, record.offset
    else:
        # A result that names its producer names its segment and seq too.
        producer, segment, seq = result.guid.hex(), cast(int, result.segment), cast(int, result.seq)
    return Incident(
        topic=record.topic,
        partition=record.partition,
        producer=producer,
        segment=segment,
        seq=seq,
        verdict=result.verdict.value,
        offset=record.offset,
        severity="fatal" if result.fatal else "warning",
        detail=result.detail,
        record_timestamp_ms=record.timestamp,
        detected_at_ms=detected_at_ms,
    )


class RecentIncidents:
    """The latest incidents, newest last, one per identity, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_key: OrderedDict[bytes, Incident] = OrderedDict()

    def add(self, key: bytes, incident: Incident) -> None:
        """Keep an incident read from the topic, replacing an earlier one under the same key."""
        if key in self._by_key:
            self._by_key[key] = incident  # a replay: same fault, kept in its first place
            return
        self._by_key[key] = incident
        if len(self._by_key) > self.capacity:
            self._by_key.popitem(last=False)

    def __len__(self) -> int:
        return len(self._by_key)

    def newest_first(self) -> Iterator[Incident]:
        """The kept incidents, newest first."""
        return reversed(self._by_key.values())


class FaultRunLog:
    """Logs one warning when a producer starts a run of faults, and one line when it ends.

    Inside a push, Venice's rules report every record after a gap as MISSING; a log line
    per record would bury the first one, which is the one that matters.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        # (topic, partition, producer GUID or None) -> [verdict, first offset, last offset, count]
        self._runs: dict[tuple[str, int, bytes | None], list] = {}

    def producers_in_runs(self, topic: str, partition: int) -> set[bytes]:
        """Producers of the partition inside a run: their next OK record ends it, so the
        caller must show it to `observe` (the bulk path reports no other OK record)."""
        return {guid for (t, p, guid) in self._runs if guid is not None and t == topic and p == partition}

    def observe(self, results: Iterable[tuple[ValidationResult, Incident | None]]) -> None:
        """Log where a producer's run of faults starts and, with its length, where it ends."""
        for result, incident in results:
            record = result.record
            run_key = (record.topic, record.partition, result.guid)
            run = self._runs.get(run_key)
            if run is not None and (incident is None or run[0] != incident.verdict):
                self._end(run_key, run)
                run = None
            if incident is None:
                continue
            if run is None:
                self._runs[run_key] = [incident.verdict, record.offset, record.offset, 1]
                self._log.warning(
                    "%s (%s) at %s[%d]@%d producer %s segment %d seq %d: %s",
                    incident.verdict,
                    incident.severity,
                    record.topic,
                    record.partition,
                    record.offset,
                    incident.producer,
                    incident.segment,
                    incident.seq,
                    incident.detail,
                )
            else:
                run[2] = record.offset
                run[3] += 1

    def _end(self, run_key: tuple[str, int, bytes | None], run: list) -> None:
        del self._runs[run_key]
        verdict, first, last, count = run
        if count > 1:
            topic, partition, producer = run_key
            self._log.warning(
                "%d %s records at %s[%d] offsets %d..%d from producer %s",
                count,
                verdict,
                topic,
                partition,
                first,
                last,
                producer.hex() if producer is not None else NO_PRODUCER,
            )


def trace_incident(verdict: TraceVerdict, detected_at_ms: int) -> Incident:
    """A traced record lost or duplicated between two hops of a route, or never resolved;
    identified by route, trace and hop, so judging it again after a crash rewrites the key."""
    topic, partition, offset = verdict.source if verdict.source is not None else ("-", -1, -1)
    return Incident(
        topic=topic,
        partition=partition,
        producer=NO_PRODUCER,
        segment=-1,
        seq=offset,
        verdict=verdict.outcome.value,
        offset=offset,
        severity="fatal" if verdict.outcome is TraceOutcome.LOST else "warning",
        detail=verdict.detail,
        record_timestamp_ms=-1,
        detected_at_ms=detected_at_ms,
        route=verdict.route,
        trace_id=verdict.trace_id.hex(),
        hop=verdict.hop,
        group=verdict.group,
    )
