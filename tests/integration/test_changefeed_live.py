"""TiCDC changefeed topics in the live worker: exactly the planted corrupt rows are incidents,
counts per table in /changefeeds/ and the metrics, and a worker killed mid-way reports the
same set again (same keys), nothing more."""

from __future__ import annotations

import re
import uuid

import aiohttp

from kdiv.config.settings import RegistrySettings
from kdiv.dev.changefeed import write_changefeed
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.browser import dashboard
from tests.harness.processes import WorkerProcess, free_port

FAULTS_AT = {3: "mismatch", 40: "flag", 41: "mismatch", 150: "mismatch", 260: "flag", 299: "mismatch"}
VERDICTS = {"mismatch": "CHECKSUM_MISMATCH", "flag": "CORRUPTED_FLAG"}


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_live_worker_reports_exactly_the_planted_corrupt_rows(bootstrap, registry_url, topic_factory, tmp_path):
    topic = topic_factory(2)
    registry = RegistrySettings(url=registry_url)
    first = await write_changefeed(
        bootstrap, topic, registry, rows=200, partitions=2, delete_rate=0.1, faults_at=FAULTS_AT, seed=5
    )
    app_id = f"cdc{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "cdc",
        bootstrap=bootstrap,
        topics=[],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_TICDC_TOPICS": topic, "KDIV_TICDC_PROTOCOL": "avro"},
    )
    try:
        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        # Killed at once after catching up: the rows after it are verified by the next run.
        worker.sigkill()
        faults_later = {row - 200: fault for row, fault in FAULTS_AT.items() if row >= 200}
        second = await write_changefeed(
            bootstrap, topic, registry, rows=100, partitions=2, delete_rate=0.1, faults_at=faults_later, seed=6
        )
        worker.restart()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)

        planted = {
            (partition, offset, VERDICTS[fault])
            for run in (first, second)
            for fault, where in run.faults.items()
            for partition, offset in where
        }
        assert len(planted) == len(FAULTS_AT)
        incidents = await read_incidents(bootstrap, app_id)
        reported = {(v[-1].partition, v[-1].offset, v[-1].verdict) for v in incidents.values()}
        assert reported == planted
        for versions in incidents.values():
            incident = versions[-1]
            assert incident.topic == topic and incident.table == "shop.orders"
            assert incident.row_image == "current" and incident.severity == "fatal"
            assert incident.commit_ts is not None and incident.commit_ts > 0
            assert len(incident.row_key or ()) == 1 and incident.row_key[0][0] == "id"
            if incident.verdict == "CHECKSUM_MISMATCH":
                assert incident.expected_checksum != incident.computed_checksum
                assert incident.computed_checksum is not None
                assert f"row checksum {incident.expected_checksum} does not match" in incident.detail

        # Counts of this run (the restarted worker verified what it had not committed).
        view = await get_json(f"{worker.url}/changefeeds/")
        assert view["unavailable_workers"] == []
        rows = [item for item in view["items"] if item["topic"] == topic]
        assert {item["table"] for item in rows} == {"shop.orders"}
        verdicts = {}
        for item in rows:
            for verdict, count in item["verdicts"].items():
                verdicts[verdict] = verdicts.get(verdict, 0) + count
        assert verdicts["CHECKSUM_MISMATCH"] + verdicts["CORRUPTED_FLAG"] >= len(faults_later)
        assert verdicts["SKIPPED"] >= second.deletes
        assert verdicts["MALFORMED"] == 0
        async with aiohttp.ClientSession() as session, session.get(f"{worker.url}/metrics") as response:
            metrics = await response.text()
        assert f'kdiv_changefeed_rows_total{{table="shop.orders",topic="{topic}",verdict="OK"}}' in metrics
        async with dashboard(worker.url) as page:
            shown = await page.table("#changefeeds")
            assert [r[:4] for r in shown] == [
                [item["topic"], str(item["partition"]), item["table"], str(item["rows"])] for item in view["items"]
            ]
            assert await page.page.locator("#routes-section").is_hidden()
            assert page.errors == []
        assert worker.problems() == []
        # Each corrupt row is logged, at ERROR (fatal), naming where it is.
        lines = worker.incident_lines()
        logged = {
            (int(m[2]), int(m[3]), m[1])
            for m in (re.search(rf"(\w+) \(fatal\) at {re.escape(topic)}\[(\d+)\]@(\d+) ", line) for line in lines)
            if m
        }
        assert planted <= logged and all("[ERROR]" in line for line in lines), lines
    finally:
        worker.terminate()
