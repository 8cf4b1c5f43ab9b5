"""What the views' incidents reader (`kdiv.worker.web.incidents_reader`) keeps of the records
it reads from the incidents topic, which anyone can write to."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from kdiv.config.settings import MIN_RECENT_INCIDENTS_BYTES
from kdiv.incident.bounds import MAX_INCIDENT_BYTES
from kdiv.incident.shape import Incident
from kdiv.worker.incidents import RecentIncidents
from kdiv.worker.web.incidents_reader import add_incident

MISSING = Incident(
    "orders", 3, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)


@dataclass
class _Stats:
    bad_incident_records: int = 0


@dataclass
class _Worker:
    recent: RecentIncidents = field(default_factory=lambda: RecentIncidents(10, 1 << 20))
    stats: _Stats = field(default_factory=_Stats)


def _record(key: bytes, value: bytes | None, offset: int = 4):
    return SimpleNamespace(topic="kdiv-incidents", partition=1, offset=offset, key=key, value=value)


def test_an_incident_is_kept_and_its_replay_replaces_it_in_place():
    worker = _Worker()
    later = replace(MISSING, seq=9)
    add_incident(worker, _record(MISSING.key, MISSING.value))
    add_incident(worker, _record(later.key, later.value))
    resolved = replace(MISSING, resolved_at_ms=1_700_000_001_000)
    add_incident(worker, _record(MISSING.key, resolved.value))
    assert list(worker.recent.newest_first()) == [later, resolved]
    assert worker.stats.bad_incident_records == 0


def test_a_tombstone_is_no_incident_and_no_error():
    worker = _Worker()
    add_incident(worker, _record(MISSING.key, None))
    assert len(worker.recent) == 0 and worker.stats.bad_incident_records == 0


def test_a_record_that_is_no_incident_is_counted_and_logged_with_its_place(caplog):
    worker = _Worker()
    with caplog.at_level(logging.ERROR, logger="kdiv.worker"):
        add_incident(worker, _record(b"k", b'{"topic": 1}', offset=17))
        add_incident(worker, _record(b"k", b"\xff not json"))
    assert len(worker.recent) == 0 and worker.stats.bad_incident_records == 2
    assert "unreadable incident at kdiv-incidents[1]@17" in caplog.text


def test_a_records_key_counts_in_the_bytes_held():
    worker = _Worker()
    add_incident(worker, _record(b"k" * 900_000, MISSING.value))
    assert list(worker.recent.newest_first()) == [MISSING]
    assert worker.recent.held_bytes == 900_000 + len(MISSING.value)
    # The next pushes it out: together they are over the worker's 1 MiB.
    later = replace(MISSING, seq=9)
    add_incident(worker, _record(b"k" * 200_000, later.value))
    assert list(worker.recent.newest_first()) == [later]


def test_a_record_over_the_bounds_is_counted_named_and_never_held(caplog):
    worker = _Worker()
    big = json.dumps({**MISSING.to_json(), "detail": "x" * 900_000}).encode()
    not_a_guid = json.dumps({**MISSING.to_json(), "producer": "me"}).encode()
    with caplog.at_level(logging.ERROR, logger="kdiv.worker"):
        add_incident(worker, _record(b"k", big, offset=30))
        add_incident(worker, _record(b"k", not_a_guid, offset=31))
    assert len(worker.recent) == 0 and worker.recent.held_bytes == 0
    assert worker.stats.bad_incident_records == 2
    assert "unreadable incident at kdiv-incidents[1]@30: incident of 900," in caplog.text
    assert "unreadable incident at kdiv-incidents[1]@31: incident field producer is 'me'" in caplog.text


def _numbered(n: int, detail: str = "d") -> Incident:
    return replace(MISSING, seq=n, detail=detail)


def test_held_incidents_are_bounded_by_bytes_as_well_as_count_the_oldest_going_first():
    small = [_numbered(n) for n in range(5)]
    each = len(small[0].key) + len(small[0].value)
    recent = RecentIncidents(capacity=100, max_bytes=3 * each)
    for incident in small:
        recent.add(incident.key, incident, len(incident.value))
    assert list(recent.newest_first()) == small[:1:-1]  # the three newest
    assert recent.held_bytes == 3 * each
    # One large incident pushes out as many of the oldest as its bytes need.
    large = _numbered(99, "x" * (each // 2))
    recent.add(large.key, large, len(large.value))
    assert list(recent.newest_first()) == [large, small[4]]
    assert recent.held_bytes == len(large.key) + len(large.value) + each <= 3 * each


def test_a_replay_is_held_in_its_place_with_its_new_size():
    first, second = _numbered(1), _numbered(2)
    recent = RecentIncidents(capacity=10, max_bytes=1 << 20)
    for incident in (first, second):
        recent.add(incident.key, incident, len(incident.value))
    grown = replace(first, detail="longer detail " * 10)
    recent.add(grown.key, grown, len(grown.value))
    assert list(recent.newest_first()) == [second, grown]
    assert recent.held_bytes == sum(len(i.key) + len(i.value) for i in (second, grown))


def test_held_incidents_are_bounded_by_count():
    recent = RecentIncidents(capacity=2, max_bytes=1 << 20)
    for n in range(4):
        recent.add(_numbered(n).key, _numbered(n), len(_numbered(n).value))
    assert [i.seq for i in recent.newest_first()] == [3, 2]


def test_the_least_bytes_setting_holds_the_largest_incident():
    assert MIN_RECENT_INCIDENTS_BYTES >= MAX_INCIDENT_BYTES
