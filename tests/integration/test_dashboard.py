"""The dashboard page in a real headless browser (Debian's chromium), over a real worker."""

from __future__ import annotations

import json
import uuid

import aiohttp
from playwright.async_api import async_playwright

from tests.harness.broker import exact_end_offsets, produce_with_faults_for, wait_until_caught_up
from tests.harness.browser import chromium, wait_until
from tests.harness.http import http_json, wait_for_incidents_read
from tests.harness.processes import WorkerProcess, free_port


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
            _, incidents = await http_json(session, "GET", f"{worker.url}/incidents/?limit=200")
            _, partitions = await http_json(session, "GET", f"{worker.url}/partitions/")
            _, producers = await http_json(session, "GET", f"{worker.url}/producers/")
        assert isinstance(incidents, dict) and isinstance(partitions, dict) and isinstance(producers, dict)
        verdicts = sorted(i["verdict"] for i in incidents["items"])
        assert "MISSING" in verdicts and len(set(verdicts)) >= 2

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(str(error)))
                shown_page = await page.goto(f"{worker.url}/ui/")
                # The page works under its CSP: inline code only by hash, requests to the worker.
                assert shown_page is not None
                policy = shown_page.headers["content-security-policy"]
                assert "script-src 'sha256-" in policy and "unsafe" not in policy, policy
                await wait_until(page, "document.body.dataset.loaded")

                # The faults, as the incidents view lists them; the partitions with their counts.
                rows = page.locator("#incidents tbody tr")
                shown = await rows.evaluate_all("rows => rows.map(r => r.dataset.verdict)")
                assert sorted(shown) == verdicts
                assert await page.locator("#health").inner_text() == "ready"
                listed = await page.locator("#partitions tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[1].textContent, r.cells[4].textContent])"
                )
                assert listed == [[str(p["partition"]), str(p["records"])] for p in partitions["items"]]
                # Each producer with its incidents by class.
                faults = await page.locator("#producers tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[0].textContent, r.cells[2].textContent, r.cells[7].textContent, r.cells[9].textContent])"
                )
                assert faults == [
                    [
                        p["producer"],
                        str(p["partition"]),
                        p["first_producer_time"],
                        ", ".join(f"{k} {n}" for k, n in p["incidents"].items()),
                    ]
                    for p in producers["items"]
                ]
                assert any(text for *_, text in faults)
                reconcile = await page.locator("#reconcile").inner_text()
                assert reconcile.startswith("run 20261124T000000Z: discrepancies"), reconcile
                counts = await page.locator("#reconcile-counts tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.cells[0].textContent, r.cells[1].textContent])"
                )
                assert sorted(counts) == [["DIVERGED", "1"], ["LOST", "2"]]

                # A filter narrows the list to what the view gives for it.
                await page.select_option("#filters select[name=class]", "MISSING")
                await wait_until(
                    page,
                    "[...document.querySelectorAll('#incidents tbody tr')].every(r => r.dataset.verdict === 'MISSING')",
                )
                assert await rows.count() == verdicts.count("MISSING")
                await page.fill("#filters input[name=partition]", "1")
                await wait_until(
                    page,
                    "[...document.querySelectorAll('#incidents tbody tr')].every(r => r.cells[4].textContent === '1')",
                )
                expected = [i for i in incidents["items"] if i["verdict"] == "MISSING" and i["partition"] == 1]
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
