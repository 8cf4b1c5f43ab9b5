"""The report's account of the workers' live incidents, from summary["incidents"]: unknown is
said as such (never zeros), malformed records are counted and named, and the previous run's
count's end opens the window."""

from __future__ import annotations

import json
from pathlib import Path

from kdiv.reconcile.incidents import previous_window_end_ms
from kdiv.reconcile.live_incidents_markup import live_incidents_cell, live_incidents_notes, live_incidents_total
from kdiv.reconcile.summary import INCIDENTS_MISSING, INCIDENTS_READ, INCIDENTS_UNREADABLE

WINDOW = {"from_ms": None, "to_ms": 1_714_560_000_000}


def test_an_unreadable_incidents_topic_is_unknown_not_zero() -> None:
    incidents = {
        "topic": "kdiv-incidents",
        "status": INCIDENTS_UNREADABLE,
        "window": WINDOW,
        "error": "KafkaError: <broker> refused",
    }
    assert live_incidents_cell(incidents, "orders") == '<span class="note">unknown</span>'
    assert live_incidents_total(incidents, ["orders"]) == '<span class="note">unknown</span>'
    (note,) = live_incidents_notes(incidents, {"orders": {}})
    assert "unknown, not zero" in note
    assert "could not be read: KafkaError: &lt;broker&gt; refused" in note


def test_a_missing_incidents_topic_is_named() -> None:
    (note,) = live_incidents_notes({"topic": "kdiv-incidents", "status": INCIDENTS_MISSING, "window": WINDOW}, {})
    assert "<code>kdiv-incidents</code> does not exist" in note


def test_malformed_records_and_other_topics_are_named() -> None:
    incidents = {
        "topic": "kdiv-incidents",
        "status": INCIDENTS_READ,
        "window": WINDOW,
        "by_topic": {"orders": {"MISSING": 2}, "elsewhere": {"CORRUPT": 1}},
        "held": 4,
        "outside_window": 1,
        "malformed": 3,
        "first_malformed": {"partition": 1, "offset": 17, "error": "incident lacks field(s) verdict"},
    }
    notes = "\n".join(live_incidents_notes(incidents, {"orders": {}}))
    assert "from the start of the topic" in notes
    assert "1 incident detected outside the window" in notes
    assert "<code>elsewhere</code> (1)" in notes
    assert "3 records of <code>kdiv-incidents</code> are not an incident" in notes
    assert "partition 1 offset 17: incident lacks field(s) verdict" in notes
    assert live_incidents_cell(incidents, "orders").startswith("<strong>2</strong><br>MISSING: 2<br>")
    assert live_incidents_cell(incidents, "payments") == "0"
    assert live_incidents_total(incidents, ["orders", "payments"]) == "2"  # the table's topics


def counted_run(reports: Path, name: str, summary: object) -> None:
    (reports / name).mkdir()
    (reports / name / "summary.json").write_text(json.dumps(summary))


def test_the_window_opens_where_the_newest_earlier_count_ended(tmp_path: Path) -> None:
    for name, ended in (("a", 1_000), ("b", 3_000), ("c", 5_000)):
        counted_run(tmp_path, name, {"incidents": {"status": INCIDENTS_READ, "window": {"to_ms": ended}}})
    # Runs that counted nothing opened no window: a failed one, one without the topic, a torn file.
    counted_run(tmp_path, "failed", {"status": "failed"})
    counted_run(tmp_path, "missing", {"incidents": {"status": INCIDENTS_MISSING, "window": {"to_ms": 4_000}}})
    counted_run(tmp_path, "odd", {"incidents": {"status": INCIDENTS_READ, "window": {"to_ms": True}}})
    counted_run(tmp_path, "list", [1, 2])
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "summary.json").write_text('{"incidents": {"sta')
    assert previous_window_end_ms(tmp_path, 5_000, "summary.json") == 3_000
    assert previous_window_end_ms(tmp_path, 1_000, "summary.json") is None
    assert previous_window_end_ms(tmp_path / "none", 9_000, "summary.json") is None
