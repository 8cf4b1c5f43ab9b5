"""Times from outside (producer clocks, Kafka timestamps, incidents) are rendered as dates only
when a date can show them: 2^60, negative and microsecond times come out as null (or their
raw number) beside the raw field, never as an exception (a 500 in the views)."""

from __future__ import annotations

import json

import pytest

from kdiv.clock import LAST_RENDERABLE_MS
from kdiv.clock import iso_utc as iso_time
from kdiv.div.segment import Segment
from kdiv.div.wire import ChecksumType
from kdiv.incident.shape import Incident
from kdiv.reconcile import report
from kdiv.reconcile.markup import utc_time
from kdiv.worker.web.shapes import ProducerFaults, incident_json, producer_json

NOW_MS = 1_700_000_000_000
ODD_TIMES = {
    "2^60": 2**60,
    "negative": -5,
    "microseconds": NOW_MS * 1000,
    "one past year 9999": LAST_RENDERABLE_MS + 1,
    "int64 max": 2**63 - 1,
}


def test_renderable_times_are_exact_to_the_millisecond():
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"
    assert iso_time(NOW_MS + 7) == "2023-11-14T22:13:20.007Z"
    assert iso_time(LAST_RENDERABLE_MS) == "9999-12-31T23:59:59.999Z"


@pytest.mark.parametrize("name", sorted(ODD_TIMES))
def test_an_odd_time_is_null_in_a_view(name):
    assert iso_time(ODD_TIMES[name]) is None


@pytest.mark.parametrize("name", sorted(ODD_TIMES))
def test_a_producer_with_an_odd_clock_renders_with_its_raw_number(name):
    ms = ODD_TIMES[name]
    segment = Segment(0, 3, ChecksumType.NONE)
    segment.last_producer_ts = ms
    segment.first_seen_ts = ms
    faults = ProducerFaults()
    faults.add(Incident("t", 0, "ab" * 16, 0, 1, "MISSING", 1, "fatal", "d", ms, ms))
    shown = json.loads(json.dumps(producer_json("t", 0, bytes(16), segment, faults)))
    assert shown["last_producer_timestamp_ms"] == ms
    assert shown["last_producer_time"] is None
    assert shown["first_producer_time"] is None
    assert (shown["first_incident_ms"], shown["first_incident_time"]) == (ms, None)


@pytest.mark.parametrize("name", sorted(ODD_TIMES))
def test_an_incident_with_odd_times_renders_with_its_raw_numbers(name):
    ms = ODD_TIMES[name]
    shown = incident_json(Incident("t", 0, "-", -1, 4, "MALFORMED", 4, "warning", "d", ms, ms, resolved_at_ms=ms))
    assert (shown["record_timestamp_ms"], shown["record_time"]) == (ms, None)
    assert (shown["detected_at_ms"], shown["detected_at"]) == (ms, None)


@pytest.mark.parametrize("name", sorted(ODD_TIMES))
def test_a_report_shows_an_odd_time_as_its_number(name, tmp_path):
    ms = ODD_TIMES[name]
    shown = utc_time(ms)
    assert shown == ("—" if ms < 0 else f"{ms} ms (out of range)")
    written = report.write_failure_report(
        {"error": "broker gone", "finished_at_ms": ms, "duration_s": 1.0, "snapshot": {"taken_at_ms": ms}}, tmp_path
    )
    assert shown in written.report_html.read_text(encoding="utf-8")
