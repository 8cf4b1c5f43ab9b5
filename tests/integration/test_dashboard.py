"""The dashboard page in a real headless browser (Debian's chromium), over a real worker."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import cast
from urllib.parse import parse_qs, urlsplit

import aiohttp
from playwright.async_api import async_playwright

from kdiv.worker.overview import GroupsQuery, overview
from kdiv.worker.web.reports import report_url
from tests.harness.broker import exact_end_offsets, produce_with_faults_for, wait_until_caught_up
from tests.harness.browser import chromium, wait_until
from tests.harness.http import http_json, wait_for_incidents_read
from tests.harness.processes import WorkerProcess, free_port


async def report_answer(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    """(status, CSP, body) of a report's path, sent as written (no normalising of "..")."""
    async with session.get(aiohttp.client.URL(url, encoded=True)) as response:
        return response.status, response.headers.get("Content-Security-Policy", ""), await response.text()


async def http_json_in(page, path: str) -> dict:
    """A view's answer, asked from the page (the same origin, as the page's own requests)."""
    return await page.evaluate(f"fetch({json.dumps(path)}).then(r => r.json())")


def expected_groups(incidents) -> list[list[str]]:
    """The incident groups' rows as the dashboard shows them, from the incidents view's items."""
    found: dict[tuple, list] = {}
    for i in incidents["items"]:
        group = found.setdefault((i["topic"], i["partition"], i["verdict"]), [0, False, [], i["severity"]])
        group[0] += 1
        group[1] = group[1] or i["severity"] == "fatal"
        group[2].append(i["detected_at"])
    return [
        [f"▸ {t}", str(p), v, "fatal" if fatal else "warning", str(n), utc_shown(min(times)), utc_shown(max(times))]
        for (t, p, v), (n, fatal, times, _) in found.items()
    ]


def utc_shown(iso: str) -> str:
    """An ISO 8601 UTC time as the dashboard's tables show it in UTC (their headings say "(UTC)")."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S")


async def test_the_dashboard_shows_the_faults_filters_them_and_logs_no_error(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    app_id = f"ui-{uuid.uuid4().hex[:8]}"
    # Two runs of the nightly job as `kdiv reconcile --out` leaves them: the later one is shown.
    reports = tmp_path / "reconcile-reports"
    for run, status, counts in (
        ("20261123T000000Z", "clean", {}),
        ("20261124T000000Z", "discrepancies", {"LOST": 2, "DIVERGED": 1}),
    ):
        (reports / run).mkdir(parents=True)
        summary = {"status": status, "finished_at_ms": 1795478400000, "duration_s": 12.5, "topics": [topic]}
        (reports / run / "summary.json").write_text(json.dumps({**summary, "counts": counts}))
    (reports / "20261124T000000Z" / "report.html").write_text("<!doctype html><style>p{}</style><p>the run</p>")
    (tmp_path / "report.html").write_text("outside the reports")
    worker = WorkerProcess(
        "ui",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_RECONCILE_REPORTS": str(reports)},
    )
    try:
        worker.start()
        await worker.wait_ready()
        await produce_with_faults_for(bootstrap, topic, 2, rate=300, fault_every=15)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await wait_for_incidents_read(session, worker, await exact_end_offsets(bootstrap, f"{app_id}-incidents"))
            _, incidents = await http_json(session, "GET", f"{worker.url}/incidents/?limit=50")
            _, everything = await http_json(session, "GET", f"{worker.url}/incidents/?limit=1000")
            _, partitions = await http_json(session, "GET", f"{worker.url}/partitions/")
            _, producers = await http_json(session, "GET", f"{worker.url}/producers/")
            # What the health line and the grid must agree with: the incidents view's counts.
            severity_totals = {
                severity: (await http_json(session, "GET", f"{worker.url}/incidents/?limit=1&severity={severity}"))[1]
                for severity in ("fatal", "warning")
            }
            by_partition = {
                (p["partition"], severity): (
                    await http_json(
                        session,
                        "GET",
                        f"{worker.url}/incidents/?limit=1&partition={p['partition']}&severity={severity}",
                    )
                )[1]
                for p in partitions["items"]
                for severity in ("fatal", "warning")
            }
            report_answers = {
                path: await report_answer(session, f"{worker.url}{path}")
                for path in (
                    "/reconcile/20261124T000000Z/report.html",
                    "/reconcile/20261123T000000Z/report.html",
                    "/reconcile/..%2F../report.html",
                    "/reconcile/../report.html",
                    "/reconcile/%2E%2E/report.html",
                )
            }
            refused = {
                query: (await http_json(session, "GET", f"{worker.url}/overview/?{query}"))[0]
                for query in ("groups_limit=0", "groups_limit=501", "groups_partition=x", "groups_offset=-1", "topic=a")
            }
            _, own_partitions = await http_json(session, "GET", f"{worker.url}/overview/?scope=local")
        assert isinstance(incidents, dict) and isinstance(partitions, dict) and isinstance(producers, dict)
        verdicts = sorted(i["verdict"] for i in incidents["items"])
        assert "MISSING" in verdicts and len(set(verdicts)) >= 2
        fatal, warning = (cast(dict, severity_totals[s])["total"] for s in ("fatal", "warning"))
        # The report of the run shown, and nothing else under or beside the reports directory.
        status, policy, text = report_answers.pop("/reconcile/20261124T000000Z/report.html")
        assert (status, text) == (200, "<!doctype html><style>p{}</style><p>the run</p>")
        assert "script-src" not in policy and policy.startswith("default-src 'none'"), policy
        assert {path: answer[0] for path, answer in report_answers.items()} == dict.fromkeys(report_answers, 404)
        assert not any("outside" in answer[2] for answer in report_answers.values())
        assert refused == dict.fromkeys(refused, 400)
        # What workers ask each other for: their partitions, as /partitions/?scope=local.
        assert isinstance(own_partitions, dict) and list(own_partitions) == ["items"]
        assert [(p["topic"], p["partition"], p["records"]) for p in own_partitions["items"]] == [
            (p["topic"], p["partition"], p["records"]) for p in partitions["items"]
        ]

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            try:
                # The width the issue saw a horizontal scrollbar at; a zone an hour and a half off UTC.
                page = await browser.new_page(viewport={"width": 1400, "height": 900}, timezone_id="Asia/Kolkata")
                errors: list[str] = []
                page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(str(error)))
                shown_page = await page.goto(f"{worker.url}/ui/")
                # The page works under its CSP: inline code only by hash, requests to the worker.
                assert shown_page is not None
                policy = shown_page.headers["content-security-policy"]
                assert "script-src 'sha256-" in policy and "unsafe" not in policy, policy
                await wait_until(page, "document.body.dataset.loaded")
                await page.screenshot(path=str(tmp_path / "overview-1400.png"))

                # The health line says what the incidents view counts (all of them within the hour).
                line = page.locator("#health-line")
                assert await line.get_attribute("data-fatal") == str(fatal)
                assert await line.get_attribute("data-warning") == str(warning)
                assert await line.inner_text() == f"{fatal} fatal · {warning} warning in the last hour"
                expected_state = "red" if fatal or any(p["push_failed"] for p in partitions["items"]) else "amber"
                assert await page.locator("#summary").get_attribute("data-state") == expected_state
                assert await page.locator("#data-state").inner_text() == expected_state.upper()
                # Each partition's cell is in the state its incidents and push make it.
                cells = await page.locator("#grid .cell").evaluate_all(
                    "cells => cells.map(c => [c.dataset.topic, Number(c.dataset.partition), c.dataset.state])"
                )
                assert cells == [
                    [
                        p["topic"],
                        p["partition"],
                        "red"
                        if p["push_failed"] or cast(dict, by_partition[(p["partition"], "fatal")])["total"]
                        else "amber"
                        if cast(dict, by_partition[(p["partition"], "warning")])["total"]
                        else "green",
                    ]
                    for p in partitions["items"]
                ]
                # The partitions not green listed with their first fault, as the incidents view dates it.
                attention = await page.locator("#attention tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.dataset.topic, Number(r.dataset.partition), r.cells[5].textContent])"
                )
                first_faults = {}
                for i in everything["items"]:
                    first_faults[i["partition"]] = min(
                        first_faults.get(i["partition"], i["detected_at"]), i["detected_at"]
                    )
                assert sorted(row[:2] for row in attention) == sorted(c[:2] for c in cells if c[2] != "green")
                assert all(shown_first == utc_shown(first_faults[p]) for _, p, shown_first in attention)
                reasons = await page.locator("#reasons li").all_inner_texts()
                assert any(r.startswith(f"{topic}: {fatal} fatal, {warning} warning in the last hour") for r in reasons)
                assert all(" — since 20" in r for r in reasons if r.startswith(topic)), reasons
                # What is wrong, where and since when, in the first screen, with no sideways scrolling.
                for part in (
                    "#summary",
                    "#grid",
                    "#topics",
                    "#attention",
                    "#chart svg",
                    "#reconcile",
                    "#groups tbody tr",
                ):
                    box = await page.locator(part).first.bounding_box()
                    assert box is not None and box["y"] + min(box["height"], 40) <= 900, (part, box)
                assert await page.evaluate(
                    "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
                )
                since = await page.locator("#since-line").inner_text()
                assert since.startswith(f"held: {fatal} fatal · {warning} warning, first 20") and "UTC" in since
                # The groups: every (topic, partition, class) of the incidents, with its count and times.
                groups = await page.locator("#groups tbody tr.group").evaluate_all(
                    "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
                )
                assert everything["total"] == len(everything["items"])
                wanted = expected_groups(everything)
                assert len(groups) == min(50, len(wanted)) and all(row in wanted for row in groups)
                assert await page.locator("#groups th").first.inner_text() == "topic"
                assert "(UTC)" in await page.locator("#groups th").nth(5).inner_text()

                # The faults, as the incidents view lists them (its first page); the partitions.
                rows = page.locator("#incidents tbody tr")
                shown = await rows.evaluate_all("rows => rows.map(r => r.dataset.verdict)")
                assert sorted(shown) == verdicts
                assert await page.locator("#health").inner_text() == "worker ready"
                listed = await page.locator("#partitions tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[1].textContent, r.cells[4].textContent])"
                )
                assert listed == [[str(p["partition"]), str(p["records"])] for p in partitions["items"]]
                # The Partitions table's state of each partition is the grid's, never "ok" beside red.
                grid_states = {(topic, number): state for topic, number, state in cells}
                table_states = await page.locator("#partitions tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[0].title || r.cells[0].textContent, Number(r.cells[1].textContent),"
                    " r.cells[8].dataset.state])"
                )
                assert [(p, state) for _, p, state in table_states] == [
                    (p["partition"], grid_states[(p["topic"], p["partition"])]) for p in partitions["items"]
                ], (table_states, grid_states)
                # Each producer with its incidents by class; times in UTC, said so.
                faults = await page.locator("#producers tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[0].textContent, r.cells[2].textContent, r.cells[7].textContent, r.cells[9].textContent])"
                )
                assert faults == [
                    [
                        p["producer"],
                        str(p["partition"]),
                        utc_shown(p["first_producer_time"]),
                        ", ".join(f"{k} {n}" for k, n in p["incidents"].items()),
                    ]
                    for p in producers["items"]
                ]
                assert any(text for *_, text in faults)
                reconcile = (await page.locator("#reconcile").inner_text()).strip()
                assert reconcile.startswith(
                    "run 20261124T000000Z: discrepancies, 3 findings, finished 2026-11-24 00:00:00 UTC"
                ), reconcile
                assert await page.locator("#reconcile-report").get_attribute("href") == (
                    "/reconcile/20261124T000000Z/report.html"
                )
                counts = await page.locator("#reconcile-counts tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[0].textContent, r.cells[1].textContent])"
                )
                assert sorted(counts) == [["DIVERGED", "1"], ["LOST", "2"]]

                # Local time when asked: the zone is named, the times moved by its offset.
                await page.select_option("#zone", "local")
                await wait_until(page, "document.querySelector('#reconcile').textContent.includes('UTC+05:30')")
                assert "finished 2026-11-24 05:30:00 UTC+05:30" in await page.locator("#reconcile").inner_text()
                assert "(UTC+05:30)" in await page.locator("#incidents th").first.inner_text()
                await page.screenshot(path=str(tmp_path / "overview-local-1400.png"), full_page=True)
                # The since filter is read in the zone shown: 05:30 in Kolkata is midnight UTC.
                assert await page.locator("#filters label:has(input[name=since]) span").first.inner_text() == (
                    "since (UTC+05:30)"
                )
                async with page.expect_request(lambda r: "since=" in r.url and "/incidents/" in r.url) as asked:
                    await page.fill("#filters input[name=since]", "2026-11-24T05:30:00")
                assert parse_qs(urlsplit((await asked.value).url).query)["since"] == ["2026-11-24T00:00:00.000Z"]
                await page.fill("#filters input[name=since]", "")
                await page.select_option("#zone", "utc")
                await wait_until(page, "document.querySelector('#reconcile').textContent.includes(' UTC ')")

                # A click on a partition lists its groups and its incidents only.
                target = next(
                    p
                    for p in partitions["items"]
                    if any(cast(dict, by_partition[(p["partition"], s)])["total"] for s in ("fatal", "warning"))
                )
                await page.locator(f"#grid .cell[data-partition='{target['partition']}']").click()
                await wait_until(
                    page,
                    f"[...document.querySelectorAll('#groups tbody tr')].every(r => r.dataset.partition === '{target['partition']}')"
                    f" && [...document.querySelectorAll('#incidents tbody tr')].every(r => r.cells[4].textContent === '{target['partition']}')",
                )
                assert await page.locator("#filtered-to").inner_text() == f"{target['topic']}[{target['partition']}]"
                # A group opens on its latest incidents.
                await page.locator("#groups tbody tr.group").first.click()
                await wait_until(page, "document.querySelector('#groups tr.detail pre')")
                assert "offset" in await page.locator("#groups tr.detail pre").inner_text()
                await page.locator("#unfilter").click()
                await wait_until(page, "document.querySelector('#filtered').hidden")

                # A filter narrows the list to what the view gives for it.
                await page.select_option("#filters select[name=class]", "MISSING")
                missing = (await http_json_in(page, "/incidents/?class=MISSING&limit=50"))["items"]
                await wait_until(
                    page,
                    "[...document.querySelectorAll('#incidents tbody tr')].every(r => r.dataset.verdict === 'MISSING')",
                )
                assert await rows.count() == len(missing)
                await page.fill("#filters input[name=partition]", "1")
                await wait_until(
                    page,
                    "[...document.querySelectorAll('#incidents tbody tr')].every(r => r.cells[4].textContent === '1')",
                )
                expected = (await http_json_in(page, "/incidents/?class=MISSING&partition=1&limit=50"))["items"]
                assert await rows.count() == len(expected)
                assert await page.locator("#problem").is_hidden()
                assert errors == []

                # A script injected into the page (as a markup injection would) does not run.
                await page.evaluate(
                    "() => { const s = document.createElement('script');"
                    " s.textContent = 'document.body.dataset.injected = 1'; document.body.append(s); }"
                )
                assert await page.evaluate("document.body.dataset.injected") is None
                assert any("Content Security Policy" in error for error in errors), errors
            finally:
                await browser.close()
    finally:
        worker.terminate()


TOKEN = "kdiv-dashboard-token-" + uuid.uuid4().hex


@dataclass(frozen=True)
class Seen:
    """An incident as the overview counts it."""

    topic: str
    partition: int
    verdict: str
    severity: str
    detected_at_ms: int


def large_group(now_ms: int) -> tuple[list[Seen], list[dict]]:
    """10,000 incidents of 12 classes over 1,000 partitions of 4 topics, in the last 2 hours."""
    classes = [f"CLASS_{n}" for n in range(12)]
    partitions = [
        {"topic": f"topic-{t}", "partition": p, "recovering": False, "push_failed": p == 7, "lag": p, "phase": "stream"}
        for t in range(4)
        for p in range(250)
    ]
    incidents = [
        Seen(
            f"topic-{i % 4}",
            (i * 7) % 250,
            classes[(i // 5) % 12],
            "fatal" if i % 7 == 0 else "warning",
            now_ms - i * 700,
        )
        for i in range(10_000)
    ]
    return incidents, partitions


async def test_the_overview_of_ten_thousand_incidents_on_a_thousand_partitions_stays_one_screen_wide_and_short(
    bootstrap, topic_factory, tmp_path
):
    """The page over the overview of a large group: the worker serves the page and its own views;
    the overview and partition list it reads are those of 10,000 incidents on 1,000 partitions,
    made by the same aggregation the worker runs (a test broker cannot hold such a group here)."""
    topic = topic_factory(1)
    reports = tmp_path / "reports"
    (reports / "20261124T000000Z").mkdir(parents=True)
    (reports / "20261124T000000Z" / "report.html").write_text("<!doctype html><p id=run>the run</p>")
    run = {"available": True, "run": "20261124T000000Z", "summary": {"status": "discrepancies", "counts": {"LOST": 21}}}
    worker = WorkerProcess(
        "ui-large",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=f"ui-{uuid.uuid4().hex[:8]}",
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_RECONCILE_REPORTS": str(reports), "KDIV_WEB_TOKEN": TOKEN},
    )
    now_ms = int(datetime.now().timestamp() * 1000)
    incidents, partitions = large_group(now_ms)

    async def answer_overview(route) -> None:
        query = parse_qs(urlsplit(route.request.url).query)
        groups = GroupsQuery(
            offset=int(query.get("groups_offset", ["0"])[0]), limit=int(query.get("groups_limit", ["50"])[0])
        )
        body = overview(
            incidents,
            partitions,
            now_ms,
            process="ready",
            unavailable_workers=[],
            reconciliation=run,
            report_url=report_url(reports, "20261124T000000Z"),
            groups=groups,
        )
        await route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    async def answer_partitions(route) -> None:
        await route.fulfill(status=200, content_type="application/json", body=json.dumps({"items": partitions}))

    try:
        worker.start()
        await worker.wait_ready()
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            try:
                page = await browser.new_page(viewport={"width": 1400, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                await page.route("**/overview/?*", answer_overview)
                await page.route("**/partitions/", answer_partitions)
                await page.goto(f"{worker.url}/ui/")
                await page.fill("#token", TOKEN)
                await page.dispatch_event("#token", "change")
                await wait_until(page, "document.body.dataset.loaded")
                await page.screenshot(path=str(tmp_path / "overview-large-1400.png"))

                assert await page.locator("#grid .cell").count() == 1000
                assert await page.locator("#health-line").get_attribute("data-fatal") == str(
                    sum(i.severity == "fatal" and i.detected_at_ms >= now_ms - 3_600_000 for i in incidents)
                )
                assert await page.locator("#summary").get_attribute("data-state") == "red"
                # The grid and the lists scroll in their boxes: the page is a few screens, not 100s.
                grid = await page.locator("#grid").bounding_box()
                assert grid is not None and grid["height"] < 300, grid
                assert await page.locator("#groups tbody tr").count() == 50
                assert await page.locator("#attention tbody tr").count() == 8
                pushes_first = await page.locator("#attention tbody tr").evaluate_all(
                    "rows => rows.slice(0, 4).map(r => r.cells[2].textContent)"
                )
                assert pushes_first == [" push failed"] * 4
                assert "more partitions not green" in await page.locator("#attention-more").inner_text()
                assert await page.evaluate("document.documentElement.scrollHeight") < 4 * 900
                assert await page.evaluate(
                    "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
                )
                # The next page of groups is the next 50.
                first = await page.locator("#groups tbody tr").first.get_attribute("data-key")
                await page.locator("#groups-next").click()
                await wait_until(
                    page, f"document.querySelector('#groups tbody tr').dataset.key !== {json.dumps(first)}"
                )
                assert (
                    await page.locator("#groups-page").inner_text()
                    == f"51–100 of {len({(i.topic, i.partition, i.verdict) for i in incidents})}"
                )
                # The report opens with the token (a plain link would be answered 401).
                async with page.expect_popup() as opening:
                    await page.locator("#reconcile-report").click()
                report = await opening.value
                await report.wait_for_url(lambda url: url.startswith("blob:"))
                await report.wait_for_load_state()
                assert await report.locator("#run").inner_text() == "the run"
                # Opened with noopener: the report's tab has no handle on the dashboard (and its token).
                assert await report.evaluate("window.opener") is None
                # A name holding a right-to-left override (or another invisible character) is
                # shown with it as an escape, not as text reversed or hidden.
                partitions.append(
                    {
                        "topic": "evil\u202egnp.exe\u200b",
                        "partition": 0,
                        "recovering": False,
                        "push_failed": False,
                        "lag": 0,
                        "phase": "stream",
                    }
                )
                await page.evaluate("refresh()")
                names = "[...document.querySelectorAll('#partitions tbody tr')].map(r => r.cells[0].textContent)"
                await wait_until(page, f"{names}.some(n => n.startsWith('evil'))")
                shown = [n for n in await page.evaluate(names) if n.startswith("evil")]
                assert shown == ["evil\\u202egnp.exe\\u200b"], shown
                grid_names = await page.locator("#grid .name").all_inner_texts()
                assert "evil\\u202egnp.exe\\u200b" in grid_names, grid_names[-3:]
                text = await page.evaluate("document.body.innerText")
                assert "\u202e" not in text and "\u200b" not in text
                assert errors == []
            finally:
                await browser.close()
    finally:
        worker.terminate()
