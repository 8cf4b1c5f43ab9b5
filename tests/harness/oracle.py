"""The oracle: the pure validator over a whole topic, and how live incidents and saved state differ from it."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from kdiv.div.segment import Segment, as_segment
from kdiv.div.validator import DataIntegrityValidator, PartitionValidation
from kdiv.incident.shape import Incident
from kdiv.kafka.consume import read_snapshot
from kdiv.state.codec import decode_partition, decode_segment
from kdiv.state.framing import unframe
from kdiv.state.tables import parse_key
from kdiv.worker.incidents import incidents_for


def comparable(incident: Incident) -> tuple[str, str, int]:
    return (incident.verdict, incident.severity, incident.offset)


@dataclass
class Oracle:
    """What the pure validator reports over the topic's final content."""

    # key -> (verdict, severity, offset) of the last incident with that key: what a
    # compacted incidents topic keeps.
    incidents: dict[bytes, tuple[str, str, int]]
    # key -> every (verdict, severity, offset) reported under it; more than one when a
    # record comes twice (e.g. one record duplicated twice).
    versions: dict[bytes, set[tuple[str, str, int]]]
    partitions: dict[tuple[str, int], PartitionValidation]
    records: int

    def verdicts(self) -> Counter:
        return Counter(verdict for verdict, _severity, _offset in self.incidents.values())

    def severities(self) -> Counter:
        return Counter(severity for _verdict, severity, _offset in self.incidents.values())


async def oracle(bootstrap: str, topic: str) -> Oracle:
    """Validate the whole topic in offset order per partition, as a worker that never
    crashed would: stream phase, no compaction, no max age (the worker's defaults here)."""
    validator = DataIntegrityValidator()
    incidents: dict[bytes, tuple[str, str, int]] = {}
    versions: dict[bytes, set[tuple[str, str, int]]] = defaultdict(set)
    records = 0
    async for record in read_snapshot(bootstrap, topic):
        records += 1
        for incident in incidents_for(validator.validate(record, time.time_ns() // 1_000_000), 0):
            incidents[incident.key] = comparable(incident)
            versions[incident.key].add(comparable(incident))
    return Oracle(incidents, dict(versions), dict(validator.partitions), records)


def saved_state(
    table: dict[bytes, bytes],
) -> tuple[dict[tuple[str, int], PartitionValidation], dict[tuple[str, int, bytes], Segment]]:
    parts: dict[tuple[str, int], PartitionValidation] = {}
    producers: dict[tuple[str, int, bytes], Segment] = {}
    for key, value in table.items():
        state_key = parse_key(key)
        if state_key.guid is None:
            parts[(state_key.topic, state_key.partition)] = decode_partition(unframe(value)[1])
        else:
            producers[(state_key.topic, state_key.partition, state_key.guid)] = decode_segment(unframe(value)[1])
    return parts, producers


def state_differences(expected: Oracle, table: dict[bytes, bytes]) -> list[str]:
    """How the worker's saved state differs from the oracle's (an empty list when it agrees)."""
    parts, producers = saved_state(table)
    problems = []
    for tp, want in sorted(expected.partitions.items()):
        got = parts.get(tp)
        if got is None:
            problems.append(f"{tp}: no partition state saved")
            continue
        for name in ("in_push", "push_failed", "last_offset", "records", "verdict_counts"):
            if getattr(got, name) != getattr(want, name):
                problems.append(f"{tp}: {name} saved {getattr(got, name)!r}, oracle {getattr(want, name)!r}")
        for guid, state in want.tracker.segments.items():
            segment = as_segment(state)
            saved = producers.pop((tp[0], tp[1], guid), None)
            if saved is None:
                problems.append(f"{tp}: producer {guid.hex()} not saved")
            elif saved != segment:
                problems.append(f"{tp}: producer {guid.hex()} saved {saved!r}, oracle {segment!r}")
    problems += [f"{key[:2]}: producer {key[2].hex()} saved but unknown to the oracle" for key in producers]
    return problems


def latest(live: dict[bytes, list[Incident]]) -> dict[bytes, tuple[str, str, int]]:
    """What a compacted incidents topic keeps: the last version of each key."""
    return {key: comparable(versions[-1]) for key, versions in live.items()}


def incident_differences(expected: Oracle, live: dict[bytes, list[Incident]], limit: int = 25) -> list[str]:
    """Missed, false and inconsistent incidents (an empty list when they agree).

    Per key, the live topic must hold exactly the versions the oracle reports (replays
    repeat a version, never add one), and its last version must be the oracle's last.
    """
    problems = []
    for key in sorted(expected.incidents.keys() - live.keys()):
        problems.append(f"missed: {key.decode()} -> {expected.incidents[key]}")
    for key in sorted(live.keys() - expected.incidents.keys()):
        problems.append(f"false alarm: {key.decode()} -> {[comparable(i) for i in live[key]]}")
    for key in sorted(expected.incidents.keys() & live.keys()):
        seen = {comparable(i) for i in live[key]}
        last = comparable(live[key][-1])
        if seen != expected.versions[key] or last != expected.incidents[key]:
            problems.append(
                f"differs: {key.decode()} -> live {sorted(seen)} (last {last}), "
                f"oracle {sorted(expected.versions[key])} (last {expected.incidents[key]})"
            )
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more"]
    return problems
