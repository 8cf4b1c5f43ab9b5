"""The JSON shapes of the views' items: producers, partitions, incidents, and their times.

Times are given as ms since the epoch and, beside them, as ISO 8601 UTC (null when no date
can show them); the field names are those of docs/web-views.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kdiv.clock import iso_utc
from kdiv.div.wire import ChecksumType
from kdiv.worker.readmodel import PartitionState, WorkerReadModel


@dataclass(slots=True)
class ProducerFaults:
    """A producer's incidents among those a worker holds: how many of each class, and when."""

    counts: dict[str, int] = field(default_factory=dict)
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, incident) -> None:
        self.counts[incident.verdict] = self.counts.get(incident.verdict, 0) + 1
        at = incident.detected_at_ms
        self.first_ms = at if self.first_ms is None else min(self.first_ms, at)
        self.last_ms = at if self.last_ms is None else max(self.last_ms, at)


def faults_by_producer(incidents) -> dict[tuple[str, int, str], ProducerFaults]:
    """(topic, partition, producer hex) -> its incidents' counts and times."""
    found: dict[tuple[str, int, str], ProducerFaults] = {}
    for incident in incidents:
        if incident.producer is not None:
            key = (incident.topic, incident.partition, incident.producer)
            found.setdefault(key, ProducerFaults()).add(incident)
    return found


def producer_json(topic: str, partition: int, guid: bytes, segment, faults: ProducerFaults | None = None) -> dict:
    """A producer's state as the views show it, with its incidents among those the worker holds."""
    faults = faults or ProducerFaults()
    return {
        "topic": topic,
        "partition": partition,
        "producer": guid.hex(),
        "segment": segment.segment_number,
        "seq": segment.sequence_number,
        "status": segment.status.name,
        "registered": segment.registered,
        "checksum_type": ChecksumType(segment.checksum_type).name,
        "last_offset": segment.last_offset,
        "last_producer_timestamp_ms": segment.last_producer_ts,
        "last_producer_time": iso_utc(segment.last_producer_ts),
        "first_producer_timestamp_ms": segment.first_seen_ts if segment.first_seen_ts >= 0 else None,
        "first_producer_time": iso_utc(segment.first_seen_ts),
        "incidents": dict(sorted(faults.counts.items())),
        "first_incident_ms": faults.first_ms,
        "first_incident_time": iso_utc(faults.first_ms),
        "last_incident_ms": faults.last_ms,
        "last_incident_time": iso_utc(faults.last_ms),
    }


def changefeed_partition_json(worker: WorkerReadModel, topic: str, partition: int) -> dict:
    """A changefeed partition assigned here: verified by row checksum, so no DIV state
    (phase, producers); `records` and `counts` are the rows this worker verified since it started."""
    changefeed = worker.changefeed_partition(topic, partition)
    return {
        "topic": topic,
        "partition": partition,
        "recovering": False,
        "phase": None,
        "push_failed": None,
        "last_offset": changefeed.last_offset,
        "records": changefeed.records,
        "counts": changefeed.counts,
        "producers": None,
        **progress_json(worker, topic, partition),
        "worker": worker.canonical_url,
    }


def recovering_partition_json(worker: WorkerReadModel, topic: str, partition: int) -> dict:
    """An assigned partition whose state is still being restored: its owner, no state yet."""
    return {
        "topic": topic,
        "partition": partition,
        "recovering": True,
        "phase": None,
        "push_failed": None,
        "last_offset": None,
        "records": None,
        "counts": None,
        "producers": None,
        **progress_json(worker, topic, partition),
        "worker": worker.canonical_url,
    }


def partition_json(worker: WorkerReadModel, topic: str, partition: int, part: PartitionState) -> dict:
    """A partition's state, owner and lag as the views show it."""
    return {
        "topic": topic,
        "partition": partition,
        "recovering": False,
        "phase": "push" if part.in_push else "stream",
        "push_failed": part.push_failed,
        "last_offset": part.last_offset,
        "records": part.records,
        "counts": {verdict.value: n for verdict, n in part.counts.items()},
        "producers": part.producers,
        **progress_json(worker, topic, partition),
        "worker": worker.canonical_url,
    }


def progress_json(worker: WorkerReadModel, topic: str, partition: int) -> dict:
    """A partition's progress against its true log end: lag (records), the oldest unvalidated
    record's age, and since when it is stalled (docs/worker.md#liveness); None: not measured."""
    measured = worker.progress_of(topic, partition)
    if measured is None:
        return {"lag": None, "lag_age_s": None, "stalled_since": None, "stalled_since_ms": None}
    return {
        "lag": measured.lag,
        "lag_age_s": None if measured.lag_age_ms is None else measured.lag_age_ms / 1000,
        "stalled_since": iso_utc(measured.stalled_since_ms),
        "stalled_since_ms": measured.stalled_since_ms,
    }


def incident_json(incident) -> dict:
    """An incident as the views show it: its fields (kdiv/incident/schema.json), and its times
    also as ISO 8601 UTC."""
    fields = incident.to_json()
    fields["detected_at"] = iso_utc(incident.detected_at_ms)
    fields["record_time"] = iso_utc(incident.record_timestamp_ms)
    return fields


def cursor_of(item: dict) -> str:
    """A producer item's place in the pages of /producers/: its `next_cursor` when last."""
    return f"{item['topic']}/{item['partition']}/{item['producer']}"
