"""The dashboard overview's aggregation: states, counts, grid, groups, chart, and its size."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kdiv.incident.bounds import MAX_CHARS
from kdiv.worker.overview import (
    HOUR_MS,
    MAX_FAILED_PUSHES,
    MAX_FINDING_CLASSES,
    MAX_GRID_CELLS,
    MAX_GROUPS_PAGE,
    MAX_OVERVIEW_BYTES,
    MAX_TOPICS,
    TIMELINE_BUCKETS,
    GroupsQuery,
    overview,
    timeline,
)
from kdiv.worker.web.reports import report_identity

NOW = 1_795_478_400_000  # 2026-11-24T00:00:00Z


@dataclass(frozen=True)
class Seen:
    topic: str
    partition: int
    verdict: str
    severity: str
    detected_at_ms: int


def part(topic: str, partition: int, **fields) -> dict:
    return {"topic": topic, "partition": partition, "recovering": False, "push_failed": False, "lag": 0, **fields}


def answer(incidents, partitions, **given):
    arguments = {
        "process": "ready",
        "unavailable_workers": [],
        "reconciliation": {"available": False, "message": "not set"},
        "report_url": None,
        "groups": GroupsQuery(),
    } | given
    return overview(incidents, partitions, NOW, **arguments)


def test_a_quiet_group_is_green_with_every_topic_listed():
    shown = answer([], [part("orders", 0), part("orders", 1), part("audit", 0)])
    assert shown["state"] == "green" and shown["reasons"] == []
    assert [t["topic"] for t in shown["topics"]] == ["audit", "orders"]
    assert [c["state"] for t in shown["grid"]["topics"] for c in t["partitions"]] == ["green"] * 3


def test_a_fatal_incident_in_the_last_hour_is_red_where_it_happened_and_since_when():
    first, last = NOW - 20 * 60_000, NOW - 60_000
    incidents = [
        Seen("orders", 1, "MISSING", "fatal", first),
        Seen("orders", 1, "MISSING", "fatal", last),
        Seen("orders", 0, "DUPLICATE", "warning", NOW - 5 * 60_000),
    ]
    shown = answer(incidents, [part("orders", 0), part("orders", 1), part("audit", 0)])
    assert shown["state"] == "red"
    assert shown["faults"]["last_hour"] == {"fatal": 2, "warning": 1}
    assert shown["faults"]["first"] == "2026-11-23T23:40:00.000Z"
    assert shown["reasons"] == [
        {
            "what": "orders: 2 fatal, 1 warning in the last hour on partitions 0, 1",
            "topic": "orders",
            "partition": None,
            "since_ms": first,
            "since": "2026-11-23T23:40:00.000Z",
        }
    ]
    cells = {c["partition"]: c for c in shown["grid"]["topics"][1]["partitions"]}
    assert shown["grid"]["topics"][1]["topic"] == "orders"
    assert (cells[0]["state"], cells[1]["state"]) == ("amber", "red")
    assert (cells[1]["first_fault_ms"], cells[1]["last_fault_ms"], cells[1]["fatal"]) == (first, last, 2)
    assert shown["grid"]["topics"][0]["partitions"][0]["state"] == "green"
    # Fatal groups first.
    assert [(g["partition"], g["class"], g["count"]) for g in shown["groups"]["items"]] == [
        (1, "MISSING", 2),
        (0, "DUPLICATE", 1),
    ]


def test_faults_older_than_an_hour_count_as_held_and_leave_the_state_amber():
    shown = answer([Seen("orders", 0, "MISSING", "fatal", NOW - 2 * HOUR_MS)], [part("orders", 0)])
    assert shown["faults"]["last_hour"] == {"fatal": 0, "warning": 0}
    assert shown["faults"]["held"] == {"fatal": 1, "warning": 0}
    assert shown["state"] == "amber"
    assert [r["what"] for r in shown["reasons"]] == ["orders: 1 fatal held from before the last hour on partition 0"]


def test_a_failed_push_is_red_without_any_incident_and_a_restoring_partition_is_recovering():
    shown = answer([], [part("orders", 0, push_failed=True), part("orders", 1, recovering=True, push_failed=None)])
    assert shown["state"] == "red"
    assert shown["reasons"] == [
        {"what": "push failed on orders[0]", "topic": "orders", "partition": 0, "since_ms": None, "since": None}
    ]
    assert [c["state"] for c in shown["grid"]["topics"][0]["partitions"]] == ["red", "recovering"]
    assert shown["topics"][0]["state"] == "red"


def test_the_process_and_the_last_reconciliation_make_a_quiet_group_amber():
    run = {"available": True, "run": "20261124T000000Z", "summary": {"status": "discrepancies", "counts": {"LOST": 21}}}
    shown = answer([], [part("orders", 0)], process="recovering", reconciliation=run, report_url="/r")
    assert shown["state"] == "amber"
    assert [r["what"] for r in shown["reasons"]] == [
        "worker recovering",
        "last reconciliation discrepancies: 21 findings",
    ]
    assert shown["reconciliation"] | {"counts": None} == {
        "available": True,
        "run": "20261124T000000Z",
        "status": "discrepancies",
        "state": "amber",
        "findings": 21,
        "counts": None,
        "finished_at_ms": None,
        "finished_at": None,
        "error": None,
        "report": "/r",
        "elsewhere": None,
    }


def test_groups_are_paged_and_narrowed_to_a_partition():
    incidents = [Seen("orders", p, f"CLASS{c}", "warning", NOW - p - c) for p in range(4) for c in range(3)]
    first = answer(incidents, [], groups=GroupsQuery(limit=5))["groups"]
    second = answer(incidents, [], groups=GroupsQuery(offset=5, limit=10))["groups"]
    assert (first["total"], len(first["items"]), first["next_offset"]) == (12, 5, 5)
    assert (len(second["items"]), second["next_offset"]) == (7, None)
    keys = [(g["partition"], g["class"]) for g in first["items"] + second["items"]]
    assert len(set(keys)) == 12
    narrowed = answer(incidents, [], groups=GroupsQuery(topic="orders", partition=2))["groups"]
    assert {g["partition"] for g in narrowed["items"]} == {2} and narrowed["total"] == 3


def test_the_chart_covers_the_last_hour_in_minutes_and_widens_for_older_incidents():
    incidents = [Seen("t", 0, "MISSING", "fatal", NOW - 30_000), Seen("t", 0, "GAP", "warning", NOW - 61_000)]
    chart = timeline(incidents, NOW, NOW - 61_000)
    assert chart["bucket_ms"] == 60_000 and len(chart["fatal"]) == TIMELINE_BUCKETS
    assert chart["end_ms"] > NOW >= chart["end_ms"] - 60_000
    assert (sum(chart["fatal"]), sum(chart["warning"])) == (1, 1)
    assert chart["fatal"][-2] == 1 and chart["warning"][-3] == 1
    wide = timeline([Seen("t", 0, "MISSING", "fatal", NOW - 3 * HOUR_MS)], NOW, NOW - 3 * HOUR_MS)
    assert wide["bucket_ms"] == 300_000 and sum(wide["fatal"]) == 1


def test_ten_thousand_incidents_on_a_thousand_partitions_give_a_bounded_answer():
    partitions = [part(f"topic-{t}", p) for t in range(4) for p in range(250)]
    classes = ["MISSING", "DUPLICATE", "CORRUPT", "GAP", "REWIND"]
    incidents = [
        Seen(f"topic-{i % 4}", i % 250, classes[(i // 1000) % 5], "fatal" if i % 3 == 0 else "warning", NOW - i * 300)
        for i in range(10_000)
    ]
    shown = answer(incidents, partitions, groups=GroupsQuery(limit=MAX_GROUPS_PAGE))
    assert shown["faults"]["held"]["fatal"] + shown["faults"]["held"]["warning"] == 10_000
    assert shown["grid"]["shown"] == 1000 and len(shown["groups"]["items"]) == MAX_GROUPS_PAGE
    assert shown["groups"]["total"] > MAX_GROUPS_PAGE
    assert len(json.dumps(shown)) < 600_000
    many = answer([], [part("t", p) for p in range(MAX_GRID_CELLS + 10)])
    assert many["grid"] == many["grid"] | {"total": MAX_GRID_CELLS + 10, "shown": MAX_GRID_CELLS}


def test_a_report_is_found_only_inside_the_reports_directory(tmp_path: Path):
    reports = tmp_path / "reports"
    (reports / "20261124T000000Z").mkdir(parents=True)
    (reports / "20261124T000000Z" / "report.html").write_text("<p>run</p>")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "report.html").write_text("secret")
    (reports / "linked").symlink_to(outside)
    found = (reports / "20261124T000000Z" / "report.html").stat()
    assert report_identity(reports, "20261124T000000Z") == (found.st_dev, found.st_ino)
    for run in ("..", "../secret", "linked", ".hidden", "missing", "a/b", "", "%2e%2e"):
        assert report_identity(reports, run) is None, run
    assert report_identity(None, "20261124T000000Z") is None


def test_reasons_stop_at_a_few_and_say_how_many_more():
    partitions = [part(f"topic-{n:02}", 0, push_failed=True) for n in range(12)]
    reasons = [r["what"] for r in answer([], partitions)["reasons"]]
    assert reasons[:2] == ["push failed on topic-00[0]", "push failed on topic-01[0]"]
    assert len(reasons) == 9 and reasons[-1] == "and 4 more"


def test_a_summary_read_from_disk_in_another_shape_is_shown_without_its_odd_parts():
    for summary in ([1, 2], "clean", None, {"status": "failed", "counts": {"LOST": "3", "DIVERGED": True, "GAP": 2}}):
        run = {"available": True, "run": "r", "summary": summary}
        shown = answer([], [part("t", 0)], reconciliation=run)["reconciliation"]
        assert shown["state"] == "amber" and shown["findings"] == (2 if isinstance(summary, dict) else 0)
    assert answer([], [], reconciliation=run)["reconciliation"]["counts"] == {"GAP": 2}


def test_a_partition_item_without_its_keys_is_left_out_of_the_grid():
    shown = answer([], [part("t", 0), {"topic": "t"}, {"partition": 1}, ["t", 2], {"topic": "t", "partition": "3"}])
    assert shown["grid"]["total"] == 1 and shown["grid"]["topics"] == [
        {"topic": "t", "partitions": [shown["grid"]["topics"][0]["partitions"][0]]}
    ]


def test_the_largest_answer_stays_within_its_documented_size():
    # Every list at its longest, every string at its bound in the characters JSON writes longest.
    smile = "\U0001f600"
    wide = MAX_CHARS["topic"] - 6
    incidents = [
        Seen(f"{i:06}" + smile * wide, 0, f"{i % 7}".rjust(MAX_CHARS["verdict"], "V"), "fatal", NOW - i)
        for i in range(10_000)
    ]
    partitions = [
        part(f"{n:06}".ljust(MAX_CHARS["topic"], "t"), 0, push_failed=True) for n in range(MAX_GRID_CELLS + 5)
    ]
    partitions.append(part("t" * (MAX_CHARS["topic"] + 1), 0))  # no topic is named so: not listed
    run = {
        "available": True,
        "run": "r",
        "summary": {
            "status": "failed",
            "error": "e" * 1_000_000,
            "counts": {f"{n:03}" + "x" * 10_000: n for n in range(500)},
        },
    }
    shown = answer(incidents, partitions, reconciliation=run, groups=GroupsQuery(limit=MAX_GROUPS_PAGE))
    assert len(shown["topics"]) == MAX_TOPICS and shown["topics_total"] == 10_000 + MAX_GRID_CELLS + 5
    assert len(shown["failed_pushes"]) == MAX_FAILED_PUSHES and shown["failed_pushes_total"] == MAX_GRID_CELLS + 5
    assert shown["grid"]["total"] == MAX_GRID_CELLS + 5
    assert len(shown["reconciliation"]["counts"]) == MAX_FINDING_CLASSES
    size = len(json.dumps(shown))  # ASCII: every non-ASCII character escaped, the longest written
    assert MAX_OVERVIEW_BYTES / 2 < size <= MAX_OVERVIEW_BYTES


class CountingPartitions(dict):
    """A tally's partitions that count the entries read by walking them."""

    read = 0

    def items(self):
        entries = list(super().items())
        CountingPartitions.read += len(entries)
        return entries


def partitions_read_for(topics: int, monkeypatch) -> int:
    from kdiv.worker import overview as overview_module

    real = overview_module._tally

    def counted(incidents, hour_ago_ms):
        tally = real(incidents, hour_ago_ms)
        tally.by_partition = CountingPartitions(tally.by_partition)
        return tally

    monkeypatch.setattr(overview_module, "_tally", counted)
    CountingPartitions.read = 0
    incidents = [Seen(f"topic-{n:04}", 0, "MISSING", "fatal", NOW - 60_000) for n in range(topics)]
    answer(incidents, [part(f"topic-{n:04}", 0) for n in range(topics)])
    return CountingPartitions.read


def test_the_reasons_read_each_faulty_partition_a_bounded_number_of_times(monkeypatch):
    # A pass over every partition per topic read topics x partitions: 2,500 and 250,000 here.
    assert partitions_read_for(50, monkeypatch) <= 4 * 50
    assert partitions_read_for(500, monkeypatch) <= 4 * 500
