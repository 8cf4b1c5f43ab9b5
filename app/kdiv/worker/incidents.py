"""The worker's incidents: one per fault, keyed by the fault's identity so a replay rewrites a key.

The key is (topic, partition, producer, segment, seq, class): a worker that validates the
same record again after a crash produces the same key, which a compacted topic (and every
reader here) keeps once. Records without a readable producer (MALFORMED) are identified by
their offset instead. The shape is `kdiv.incident.shape.Incident`'s; this module adds the
incidents only the live worker finds (log rewinds, deletions before validation, producer
evictions, a gap's running MISSING) and the incidents it keeps for the views.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace

from kdiv.div.faults import Verdict
from kdiv.div.validator import Eviction, ValidationResult
from kdiv.incident.bounds import fitted
from kdiv.incident.builders import (
    gap_incident,
    incident_for,
    partition_incident,
    severity_of,
)
from kdiv.incident.shape import Incident
from kdiv.worker.live import Rewind
from kdiv.worker.retention import LOSS_VERDICTS, Deletion

__all__ = [
    "DELETED_BEFORE_VALIDATION",
    "LOG_REWOUND",
    "PRODUCERS_LIMIT",
    "RecentIncidents",
    "deleted_note",
    "deletion_incident",
    "eviction_incident",
    "incidents_for",
    "rewind_incident",
]

LOG_REWOUND = "LOG_REWOUND"


def rewind_incident(rewind: Rewind, detected_at_ms: int) -> Incident:
    """Validated records gone from a partition's log (`kdiv.worker.live.Rewind`); identified
    by the first offset gone, so finding it again after a crash rewrites the same key."""
    return partition_incident(
        rewind.topic,
        rewind.partition,
        LOG_REWOUND,
        rewind.first_offset,
        severity_of(rewind.in_push),
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
        severity_of(deletion.in_push),
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
            own = fitted(replace(own, detail=own.detail + deleted_note(deleted)))
        return [] if own is None else [own]
    missing = gap_incident(result, detected_at_ms, "" if deleted is None else deleted_note(deleted))
    if result.verdict is Verdict.MISSING or own is None:
        return [missing]
    return [own, missing]


class RecentIncidents:
    """The latest incidents, newest last, one per identity: at most `capacity` of them, and at
    most `max_bytes` of their records (the incidents topic's keys and values; in memory they take about 1.3 times as much). The oldest go first."""

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._by_key: OrderedDict[bytes, tuple[Incident, int]] = OrderedDict()
        self._bytes = 0

    def add(self, key: bytes, incident: Incident, value_size: int) -> None:
        """Keep an incident read from the topic under its record's key (its value `value_size`
        bytes long), replacing an earlier one under the same key. The key's bytes count too:
        nothing else bounds a record's key."""
        size = len(key) + value_size
        earlier = self._by_key.get(key)
        if earlier is not None:
            self._bytes -= earlier[1]  # a replay: same fault, kept in its first place
        self._by_key[key] = (incident, size)
        self._bytes += size
        # The newest is always kept: no value is larger than the bound (KDIV_RECENT_INCIDENTS_BYTES'
        # minimum is above the largest incident read).
        while len(self._by_key) > 1 and (len(self._by_key) > self.capacity or self._bytes > self.max_bytes):
            _, (_, dropped) = self._by_key.popitem(last=False)
            self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._by_key)

    @property
    def held_bytes(self) -> int:
        """The bytes of the records held, as `max_bytes` counts them."""
        return self._bytes

    def newest_first(self) -> Iterator[Incident]:
        """The kept incidents, newest first."""
        return (incident for incident, _ in reversed(self._by_key.values()))
