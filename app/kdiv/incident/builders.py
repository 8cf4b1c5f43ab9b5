"""Incidents of what the validators judge: a record's DIV verdict, a changefeed row's
checksum, a schema id, a partition's log, a trace's hop, each fitted to the incident's bounds
(`kdiv.incident.bounds`). Pure: no I/O.

The worker adds those only it finds (kdiv.worker.incidents); `kdiv check` prints these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from kdiv.div.faults import Verdict
from kdiv.div.validator import ValidationResult
from kdiv.incident.bounds import fitted
from kdiv.incident.shape import Incident
from kdiv.trace.judge import TraceOutcome, TraceVerdict

if TYPE_CHECKING:  # `kdiv check` without --ticdc loads no Avro library
    from kdiv.changefeed.verify import RowVerdict

NOT_FAULTS = frozenset({Verdict.OK, Verdict.UNTRACKED})
# What Kafka gives as the timestamp of a record that has none (message format v0).
KAFKA_NO_TIMESTAMP = -1
# A corrupt row reached the changefeed's consumers; a message kdiv cannot read is a warning.
_CHECKSUM_SEVERITY = {"CHECKSUM_MISMATCH": "fatal", "CORRUPTED_FLAG": "fatal"}


def severity_of(fatal: bool) -> str:
    return "fatal" if fatal else "warning"


def record_time(timestamp_ms: int) -> int | None:
    """A record's timestamp as an incident's record time: None when Kafka says it has none."""
    return None if timestamp_ms == KAFKA_NO_TIMESTAMP else timestamp_ms


def incident_for(result: ValidationResult, detected_at_ms: int) -> Incident | None:
    """The incident of a verdict on its own (one per record), or None for OK and UNTRACKED
    records; `kdiv.worker.incidents.incidents_for` gives a gap's records one incident."""
    if result.verdict in NOT_FAULTS:
        return None
    return verdict_incident(result, detected_at_ms)


def verdict_incident(result: ValidationResult, detected_at_ms: int) -> Incident:
    """A verdict in the incident's shape, faults or not (`kdiv check` prints every record's)."""
    record = result.record
    if result.guid is None:
        producer, segment, seq = None, None, None
    else:
        # A result that names its producer names its segment and seq too.
        producer, segment, seq = result.guid.hex(), cast(int, result.segment), cast(int, result.seq)
    return fitted(
        Incident(
            topic=record.topic,
            partition=record.partition,
            producer=producer,
            segment=segment,
            seq=seq,
            verdict=result.verdict.value,
            offset=record.offset,
            severity=severity_of(result.fatal),
            detail=result.detail,
            record_timestamp_ms=record_time(record.timestamp),
            detected_at_ms=detected_at_ms,
        )
    )


def gap_incident(result: ValidationResult, detected_at_ms: int, note: str = "") -> Incident:
    """A gap's one MISSING incident as it stands after `result`'s record (exact semantics):
    named by the gap's first seq and the offset of the record that found it, however many
    records are judged after it; resolved once every seq arrived. `note` ends its detail."""
    gap, record = result.gap, result.record
    if gap is None or result.guid is None:
        raise ValueError("a gap incident needs a record of a gap, with its producer")
    return fitted(
        Incident(
            topic=record.topic,
            partition=record.partition,
            producer=result.guid.hex(),
            segment=gap.segment,
            seq=gap.first,
            verdict=Verdict.MISSING.value,
            offset=gap.found_offset,
            severity=severity_of(gap.fatal),
            detail=gap.describe() + note,
            record_timestamp_ms=record_time(record.timestamp),
            detected_at_ms=detected_at_ms,
            resolved_at_ms=detected_at_ms if gap.resolved else None,
        )
    )


def checksum_incident(row: RowVerdict, detected_at_ms: int) -> Incident:
    """A TiCDC row whose checksum does not hold (or that TiCDC flagged, or that cannot be read);
    identified by its offset and row image, so verifying it again rewrites the same key."""
    from kdiv.changefeed.verify import fault_detail, key_columns

    result = row.result
    verdict = result.verdict.value
    return fitted(
        Incident(
            topic=row.topic,
            partition=row.partition,
            producer=None,
            segment=None,
            seq=None,
            verdict=verdict,
            offset=row.offset,
            severity=_CHECKSUM_SEVERITY.get(verdict, "warning"),
            detail=fault_detail(result),
            record_timestamp_ms=record_time(row.timestamp_ms),
            detected_at_ms=detected_at_ms,
            table=result.table,
            row_key=tuple(key_columns(result).items()) or None,
            row_image=result.image.value,
            commit_ts=result.commit_ts,
            expected_checksum=result.expected,
            computed_checksum=result.computed,
        )
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
    record_timestamp_ms: int | None,
    detected_at_ms: int,
    resolved_at_ms: int | None = None,
) -> Incident:
    """A record (or state value) whose schema id is unknown or under the wrong subject;
    `record_timestamp_ms` None (or Kafka's -1) for state found in a changelog, whose record time
    kdiv does not keep."""
    return fitted(
        Incident(
            topic=topic,
            partition=partition,
            producer=None,
            segment=None,
            seq=None,
            verdict=verdict,
            offset=offset,
            severity="warning",
            detail=detail,
            record_timestamp_ms=None if record_timestamp_ms is None else record_time(record_timestamp_ms),
            detected_at_ms=detected_at_ms,
            schema_id=schema_id,
            message_field=message_field,
            expected_subject=expected_subject,
            registered_subjects=registered,
            resolved_at_ms=resolved_at_ms,
        )
    )


def partition_incident(
    topic: str, partition: int, verdict: str, offset: int, severity: str, detail: str, detected_at_ms: int
) -> Incident:
    """An incident of a partition, not of one producer's record: keyed by the offset it
    begins at, so finding it again after a crash rewrites the same key."""
    return fitted(
        Incident(
            topic=topic,
            partition=partition,
            producer=None,
            segment=None,
            seq=None,
            verdict=verdict,
            offset=offset,
            severity=severity,
            detail=detail,
            record_timestamp_ms=None,
            detected_at_ms=detected_at_ms,
        )
    )


def trace_incident(verdict: TraceVerdict, detected_at_ms: int) -> Incident:
    """A traced record lost or duplicated between two hops of a route, or never resolved;
    identified by route, trace and hop, so judging it again after a crash rewrites the key.
    Its place is the record at the hop's input (to replay it), or, for copies whose input was
    never observed, the first copy; its record time the trace's origin (the trace header's)."""
    where = verdict.source if verdict.source is not None else verdict.copies[0]
    topic, partition, offset = where
    return fitted(
        Incident(
            topic=topic,
            partition=partition,
            producer=None,
            segment=None,
            seq=None,
            verdict=verdict.outcome.value,
            offset=offset,
            severity=severity_of(verdict.outcome is TraceOutcome.LOST),
            detail=verdict.detail,
            record_timestamp_ms=verdict.origin_ms,
            detected_at_ms=detected_at_ms,
            route=verdict.route,
            trace_id=verdict.trace_id.hex(),
            hop=verdict.hop,
            group=verdict.group,
        )
    )
