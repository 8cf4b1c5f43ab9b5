"""A real worker tells a reconciliation report of its own cluster and topics from one of
another cluster or of topics since recreated: /reconcile/ and the overview say so, and only
a current report makes the overview amber."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from kdiv.config.settings import Settings
from kdiv.kafka.tansu import fetch_cluster_id
from kdiv.kafka.topicids import TopicIds
from kdiv.writer import DivWriter
from tests.harness.broker import wait_until_caught_up
from tests.harness.http import http_json
from tests.harness.processes import WorkerProcess, free_port

pytestmark = pytest.mark.broker


def write_run(reports: Path, run: str, cluster_id: str, topic_ids: dict[str, str]) -> None:
    (reports / run).mkdir(parents=True)
    summary = {
        "status": "discrepancies",
        "counts": {"LOST": 2},
        "finished_at_ms": 1795478400000,
        "cluster_id": cluster_id,
        "topic_ids": topic_ids,
    }
    (reports / run / "summary.json").write_text(json.dumps(summary))


async def scope_until(session, url: str, expected: str | None, timeout: float = 30.0) -> dict:
    """The overview once /reconcile/ says `expected` (the worker learns topic ids as it runs)."""
    deadline = time.monotonic() + timeout
    while True:
        _, last = await http_json(session, "GET", f"{url}/reconcile/")
        if isinstance(last, dict) and last.get("elsewhere") == expected:
            _, shown = await http_json(session, "GET", f"{url}/overview/")
            assert isinstance(shown, dict)
            return shown
        assert time.monotonic() < deadline, last
        await asyncio.sleep(0.5)


async def test_reports_of_another_cluster_or_recreated_topics_are_no_current_reason(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(1)
    app_id = f"scope-{uuid.uuid4().hex[:8]}"
    cluster_id = await fetch_cluster_id(bootstrap)
    topic_id = TopicIds(Settings(bootstrap=bootstrap, topics=(topic,))).describe([topic])[topic]
    assert cluster_id and topic_id
    reports = tmp_path / "reports"
    write_run(reports, "20261123T000000Z", "another-cluster", {topic: topic_id})
    worker = WorkerProcess(
        "w",
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
        async with await DivWriter.start(bootstrap) as writer:
            for i in range(5):
                await writer.send(topic, b"v%d" % i, key=b"k%d" % i)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker])
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            why = f"from another cluster: the report read cluster another-cluster, this worker's is {cluster_id}"
            shown = await scope_until(session, worker.url, why)
            assert (shown["state"], shown["reconciliation"]["elsewhere"], shown["reconciliation"]["state"]) == (
                "green",
                why,
                "green",
            ), shown
            assert not [r for r in shown["reasons"] if "reconciliation" in r["what"]]

            # This cluster, but the topic as it was before it was deleted and created again.
            write_run(reports, "20261124T000000Z", cluster_id, {topic: "AAAAAAAAAAAAAAAAAAAAAQ"})
            why = f"from a previous run: {topic} was deleted and created again since"
            shown = await scope_until(session, worker.url, why)
            assert (shown["state"], shown["reconciliation"]["elsewhere"]) == ("green", why), shown

            # This cluster and this topic: a current reason.
            write_run(reports, "20261125T000000Z", cluster_id, {topic: topic_id})
            shown = await scope_until(session, worker.url, None)
            assert shown["state"] == "amber", shown
            assert [r["what"] for r in shown["reasons"]] == ["last reconciliation discrepancies: 2 findings"]
    finally:
        worker.terminate()
