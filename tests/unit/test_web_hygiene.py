"""What a worker's views echo, which Host ports they take, which report files they serve, how a
broken reconciliation summary is answered, and how the dashboard shows text from data."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kdiv.worker.web.guard import ECHO_LIMIT, clipped, echoed, split_host
from kdiv.worker.web.pages import dashboard_page
from kdiv.worker.web.params import BadRequest, parse_count, query_problem
from kdiv.worker.web.reports import read_report, report_identity, report_url
from kdiv.worker.web.status import last_reconciliation

RUN = "20261124T000000Z"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("kdiv.internal:1", ("kdiv.internal", 1)),
        ("kdiv.internal:65535", ("kdiv.internal", 65535)),
        ("[::1]:6066", ("::1", 6066)),
        ("Localhost.", ("localhost", None)),
        ("kdiv.internal:0", None),
        ("kdiv.internal:65536", None),
        ("kdiv.internal:99999", None),
        ("[::1]:99999", None),
        ("127.0.0.1:00000", None),
        ("kdiv.internal:８０", None),  # full-width digits
        ("kdiv.internal:+80", None),
        ("kdiv.internal:8 0", None),
        ("kdiv.internal:123456", None),
    ],
)
def test_a_host_port_is_ascii_digits_within_1_to_65535(header, expected):
    assert split_host(header) == expected


def test_an_echoed_value_is_cut_to_the_limit_and_says_how_long_it_was():
    assert clipped("a" * ECHO_LIMIT) == "a" * ECHO_LIMIT
    assert clipped("a" * 5000) == "a" * ECHO_LIMIT + "…(5000 chars)"
    assert echoed("x" * 5000) == repr("x" * ECHO_LIMIT) + "…(5000 chars)"
    assert echoed("evil\u202etxt") == "'evil\\u202etxt'"  # quoted: a control character shows as an escape
    with pytest.raises(BadRequest) as refused:
        parse_count("1" * 5000, "partition")
    assert len(str(refused.value)) < 200 and "(5000 chars)" in str(refused.value)
    request = SimpleNamespace(query=SimpleNamespace(items=lambda: [("n" * 5000, "1")], get=lambda *_: ""))
    problem = query_problem(request, frozenset({"topic"}))
    assert problem is not None and len(problem) < 200 and "(5000 chars)" in problem


def _reports(tmp_path: Path) -> Path:
    reports = tmp_path / "reports"
    (reports / RUN).mkdir(parents=True)
    (reports / RUN / "report.html").write_text("<p>the run</p>")
    return reports


def test_a_hard_link_inside_the_reports_directory_to_a_file_outside_is_not_served(tmp_path: Path):
    reports = _reports(tmp_path)
    secret = tmp_path / "secret.html"
    secret.write_text("a file outside the reports")
    (reports / "linked").mkdir()
    os.link(secret, reports / "linked" / "report.html")
    assert (reports / "linked" / "report.html").stat().st_nlink == 2
    assert report_identity(reports, "linked") is None
    assert read_report(reports, "linked") is None and report_url(reports, "linked") is None
    # The run's own file is served, and is the file found under the directory.
    own = (reports / RUN / "report.html").stat()
    assert report_identity(reports, RUN) == (own.st_dev, own.st_ino)
    assert (
        read_report(reports, RUN) == b"<p>the run</p>" and report_url(reports, RUN) == f"/reconcile/{RUN}/report.html"
    )
    # A hard link to the run's report (a second name for it) makes it refused too: which name is
    # the real one cannot be told.
    os.link(reports / RUN / "report.html", tmp_path / "elsewhere.html")
    assert read_report(reports, RUN) is None


def test_links_fifos_and_directories_are_not_served(tmp_path: Path):
    reports = _reports(tmp_path)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "report.html").write_text("outside")
    (reports / "dir-link").symlink_to(tmp_path / "outside")
    (reports / "file-link").mkdir()
    (reports / "file-link" / "report.html").symlink_to(tmp_path / "outside" / "report.html")
    (reports / "fifo").mkdir()
    os.mkfifo(reports / "fifo" / "report.html")
    (reports / "dir" / "report.html").mkdir(parents=True)
    for run in ("dir-link", "file-link", "fifo", "dir", "..", ".hidden", "a/b", "missing"):
        assert read_report(reports, run) is None, run
    assert read_report(None, RUN) is None


def _worker(reports: Path | None):
    return SimpleNamespace(reconcile_reports=reports, cluster_id=None, watched_topic_ids=dict)


def test_a_broken_summary_is_a_502_naming_the_run_not_a_path_and_is_logged_once(tmp_path: Path, caplog):
    reports = tmp_path / "secret-host-dir" / "reports"
    (reports / "20261123T000000Z").mkdir(parents=True)
    (reports / "20261123T000000Z" / "summary.json").write_text(json.dumps({"status": "clean"}))
    (reports / RUN).mkdir()
    (reports / RUN / "summary.json").write_text('{"status": "cle')
    caplog.set_level(logging.WARNING, logger="kdiv.worker.web.status")
    answers = [last_reconciliation(_worker(reports)) for _ in range(5)]
    status, body = answers[0]
    assert status == 502 and all(a == answers[0] for a in answers)
    assert body["run"] == RUN and body["available"] is False and RUN in body["message"]
    assert "not JSON" in body["message"] and str(tmp_path) not in json.dumps(body), body
    logged = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING and not logged[0].exc_info
    # Written again (another version of the file): logged again; repaired: served.
    (reports / RUN / "summary.json").write_bytes(b"\xff\xfe not utf-8 at all")
    assert last_reconciliation(_worker(reports))[0] == 502
    assert len([r for r in caplog.records if "cannot be read" in r.getMessage()]) == 2
    (reports / RUN / "summary.json").write_text(json.dumps({"status": "clean"}))
    assert last_reconciliation(_worker(reports)) == (
        200,
        {"available": True, "run": RUN, "summary": {"status": "clean"}, "elsewhere": None},
    )
    # No run yet: the answer names the setting, not the host's directory.
    empty = tmp_path / "empty"
    empty.mkdir()
    status, body = last_reconciliation(_worker(empty))
    assert status == 200 and str(tmp_path) not in body["message"]


def _visible(texts: list[str]) -> list[str]:
    """The dashboard's own `visible` (from the page served), run by node on `texts`."""
    page = dashboard_page()
    found = re.search(r"^const INVISIBLE = .*?^}\n", page, flags=re.MULTILINE | re.DOTALL)
    assert found is not None, "the dashboard has no INVISIBLE/visible block"
    script = found.group(0) + f"process.stdout.write(JSON.stringify({json.dumps(texts)}.map(visible)));"
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout)


def test_the_dashboard_shows_bidi_controls_and_invisible_characters_as_escapes():
    texts = [
        "orders",
        "evil\u202egnp.exe",  # RIGHT-TO-LEFT OVERRIDE: would show "evilexe.png"
        "a\u200bb\u200dc\u2066d\u2069e\u061cf\ufeffg\u00adh",
        "tag\U000e0041s",
        "line\nbreak\tand tab",
        "nul\x00 and esc\x1b",
        "ünïcödé 名前 ok",
        "sep\u2028ar\u2029ate",
    ]
    assert _visible(texts) == [
        "orders",
        "evil\\u202egnp.exe",
        "a\\u200bb\\u200dc\\u2066d\\u2069e\\u061cf\\ufeffg\\u00adh",
        "tag\\u{e0041}s",
        "line\nbreak\tand tab",
        "nul\\u0000 and esc\\u001b",
        "ünïcödé 名前 ok",
        "sep\\u2028ar\\u2029ate",
    ]


def test_the_dashboard_opens_the_report_without_a_handle_on_itself():
    page = dashboard_page()
    opens = re.findall(r"window\.open\(([^)]*)\)", page)
    assert opens and all(re.search(r'"noopener,noreferrer"\s*$', args) for args in opens), opens
    assert 'link.rel = "noopener noreferrer"' in page
