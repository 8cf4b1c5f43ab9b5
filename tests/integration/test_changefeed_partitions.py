"""Changefeed partitions in a worker's views and metrics: ready once assigned (they have no
state to restore), counted, and with a lag, also after a restart with nothing new to read."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import aiohttp

from kdiv.config.settings import RegistrySettings
from kdiv.dev.changefeed import write_changefeed
from tests.harness.broker import exact_end_offsets, wait_until_caught_up
from tests.harness.processes import WorkerProcess, free_port


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def series(metrics: str, name: str, topic: str) -> dict[int, float]:
    """partition -> value of a per-partition metric of `topic`."""
    found = {}
    for match in re.finditer(rf'^{name}{{partition="(\d+)",topic="{re.escape(topic)}"}} (\S+)$', metrics, re.M):
        found[int(match.group(1))] = float(match.group(2))
    return found


async def wait_for_lag_series(url: str, topic: str, partitions: int, timeout: float = 30.0) -> str:
    """The worker's metrics once every partition of `topic` has a lag (it knows the high
    watermark after its first fetch)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status, metrics = await get(f"{url}/metrics")
        if status == 200 and len(series(metrics, "kdiv_consumer_lag", topic)) == partitions:
            return metrics
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no lag for every partition of {topic}:\n{metrics}")
        await asyncio.sleep(0.5)


async def test_changefeed_partitions_are_ready_counted_and_have_a_lag(bootstrap, registry_url, topic_factory, tmp_path):
    topic = topic_factory(2)
    await write_changefeed(bootstrap, topic, RegistrySettings(url=registry_url), rows=60, partitions=2, seed=3)
    ends = await exact_end_offsets(bootstrap, topic)
    app_id = f"cdcp{uuid.uuid4().hex[:8]}"
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
        metrics = await wait_for_lag_series(worker.url, topic, 2)
        assert series(metrics, "kdiv_partition_recovering", topic) == {0: 0.0, 1: 0.0}
        assert series(metrics, "kdiv_records_validated_total", topic) == {p: float(n) for p, n in ends.items()}
        assert series(metrics, "kdiv_consumer_lag", topic) == {0: 0.0, 1: 0.0}

        status, body = await get(f"{worker.url}/partitions/?topic={topic}")
        assert status == 200
        items = json.loads(body)["items"]
        assert [(i["partition"], i["recovering"], i["records"], i["lag"]) for i in items] == [
            (p, False, ends[p], 0) for p in (0, 1)
        ]
        assert all(sum(i["counts"].values()) == i["records"] for i in items)
        status, body = await get(f"{worker.url}/health")
        health = json.loads(body)
        assert {(r["topic"], r["partition"]) for r in health["ready"]} == {(topic, 0), (topic, 1)}
        assert health["recovering"] == []

        # Restarted with nothing new: ready at once, and a lag from its committed position.
        worker.terminate()
        worker.restart()
        await worker.wait_ready()
        metrics = await wait_for_lag_series(worker.url, topic, 2)
        assert series(metrics, "kdiv_partition_recovering", topic) == {0: 0.0, 1: 0.0}
        assert series(metrics, "kdiv_consumer_lag", topic) == {0: 0.0, 1: 0.0}
        assert series(metrics, "kdiv_records_validated_total", topic) == {0: 0.0, 1: 0.0}
        assert worker.problems() == []
    finally:
        worker.terminate()
