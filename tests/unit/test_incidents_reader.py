"""What the views' incidents reader (`kdiv.worker.web.incidents_reader`) keeps of the records
it reads from the incidents topic, which anyone can write to."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from kdiv.worker.incidents import Incident, RecentIncidents
from kdiv.worker.web.incidents_reader import add_incident

MISSING = Incident(
    "orders", 3, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)


@dataclass
class _Stats:
    bad_incident_records: int = 0


@dataclass
class _Worker:
    recent: RecentIncidents = field(default_factory=lambda: RecentIncidents(10))
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
