"""A worker without a Schema Registry, and one whose registry is not up yet."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp

from kdiv.dev.registry.process import DevRegistryProcess
from kdiv.state.codec import LOCAL_STATE_SCHEMA_ID
from kdiv.state.framing import unframe
from tests.harness.broker import produce_with_faults_for, read_incidents, read_table, wait_until_caught_up
from tests.harness.http import http_json
from tests.harness.oracle import incident_differences, oracle
from tests.harness.processes import WorkerProcess, free_port


async def produce(bootstrap: str, topic: str, seconds: float, seed: int = 0) -> None:
    await produce_with_faults_for(bootstrap, topic, seconds, rate=300, fault_every=20, seed=seed)


async def test_a_worker_without_a_registry_validates_and_keeps_its_state(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    app_id = f"noreg-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "noreg",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_SCHEMA_REGISTRY_URL": "none"},
    )
    try:
        worker.start()
        await worker.wait_ready()
        await produce(bootstrap, topic, 2)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            status, health = await http_json(session, "GET", f"{worker.url}/health")
        assert status == 200 and isinstance(health, dict), health
        assert health["status"] == "ready"
        assert health["schema_registry"]["configured"] is False
        assert health["schema_registry"]["state_schema_id"] == LOCAL_STATE_SCHEMA_ID
        table = await read_table(bootstrap, app_id, 2)
        assert table and {unframe(value)[0] for value in table.values()} == {LOCAL_STATE_SCHEMA_ID}

        # Restarted, it reads its own state back: more records, still exactly the oracle's faults.
        worker.terminate()
        await produce(bootstrap, topic, 1, seed=1)
        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        expected = await oracle(bootstrap, topic)
        assert expected.verdicts()["MISSING"] >= 1
        assert incident_differences(expected, await read_incidents(bootstrap, app_id)) == []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            _, health = await http_json(session, "GET", f"{worker.url}/health")
        assert isinstance(health, dict) and health["state_load_errors"] == 0
    finally:
        worker.terminate()


async def test_a_worker_whose_registry_is_down_answers_health_and_starts_when_it_comes(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1)
    app_id = f"latereg-{uuid.uuid4().hex[:8]}"
    registry = DevRegistryProcess(bootstrap, topic=f"_schemas-{app_id}")  # its port is free until it starts
    worker = WorkerProcess(
        "latereg",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_SCHEMA_REGISTRY_URL": registry.url},
    )
    try:
        worker.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                try:
                    status, health = await http_json(session, "GET", f"{worker.url}/health")
                    break
                except aiohttp.ClientError:
                    assert loop.time() < deadline, worker.log_tail()
                    await asyncio.sleep(0.5)
            assert status == 503 and isinstance(health, dict), health
            assert health["status"] == "waiting_for_registry"
            assert health["schema_registry"]["state_schema_id"] is None

            await produce(bootstrap, topic, 1)
            registry.start()
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
            status, health = await http_json(session, "GET", f"{worker.url}/health")
        assert status == 200 and isinstance(health, dict) and health["status"] == "ready", health
        expected = await oracle(bootstrap, topic)
        assert incident_differences(expected, await read_incidents(bootstrap, app_id)) == []
    finally:
        worker.terminate()
        registry.stop()
