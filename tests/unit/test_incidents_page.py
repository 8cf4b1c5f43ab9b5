"""`GET /incidents/`'s pages (kdiv.worker.web.incidents): at most `limit` items and at most
MAX_PAGE_BYTES of them, `next_offset` going on where a page stopped."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from kdiv.incident.bounds import MAX_CHARS
from kdiv.incident.shape import Incident
from kdiv.worker.incidents import RecentIncidents
from kdiv.worker.web.incidents import MAX_PAGE_BYTES, incidents_page
from kdiv.worker.web.params import MAX_PAGE, BadRequest

MISSING = Incident(
    "orders", 3, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)
SMILE = "\U0001f600"


def _worker(incidents: list[Incident]):
    recent = RecentIncidents(capacity=10_000, max_bytes=1 << 30)
    for incident in incidents:
        recent.add(incident.key, incident, len(incident.value))
    return SimpleNamespace(recent_incidents=recent.newest_first, incidents_read_to=lambda: {0: len(incidents)})


def _page(worker, **query):
    return incidents_page(worker, SimpleNamespace(query={k: str(v) for k, v in query.items()}))


def test_a_page_of_the_largest_incidents_stops_at_the_byte_bound_and_the_next_goes_on():
    largest = [replace(MISSING, seq=n, detail=f"{n:05}" + SMILE * (MAX_CHARS["detail"] - 5)) for n in range(300)]
    worker = _worker(largest)
    first = _page(worker, limit=MAX_PAGE)
    assert len(json.dumps(first)) <= MAX_PAGE_BYTES + 10_000  # the items' bound, and the page's own fields
    assert 0 < len(first["items"]) < 300 and first["bytes_cut"] is True
    assert first["next_offset"] == len(first["items"]) and first["total"] == 300
    seen = [i["seq"] for i in first["items"]]
    while first["next_offset"] is not None:
        first = _page(worker, limit=MAX_PAGE, offset=first["next_offset"])
        seen += [i["seq"] for i in first["items"]]
    assert seen == list(range(299, -1, -1))  # newest first, every one once


def test_a_page_of_small_incidents_holds_its_limit():
    worker = _worker([replace(MISSING, seq=n) for n in range(30)])
    page = _page(worker, limit=10, offset=25)
    assert [i["seq"] for i in page["items"]] == [4, 3, 2, 1, 0]
    assert page["bytes_cut"] is False and page["next_offset"] is None
    page = _page(worker, limit=10)
    assert len(page["items"]) == 10 and page["bytes_cut"] is False and page["next_offset"] == 10


def test_a_limit_over_the_cap_is_refused():
    with pytest.raises(BadRequest, match="limit"):
        _page(_worker([]), limit=MAX_PAGE + 1)
