"""KAFKA-10179, reproduced on kdiv's own state, and the subject check of watched topics.

The incident: a store restored from a topic whose records carry schema ids registered
under another subject than the one the store's deserializer uses. Here: a worker's state
is written under application id A's changelog subject by an earlier release (its state
schema differed in documentation only, so it has its own id); the application id is
renamed to B and the changelog copied. Worker B restores it: the ids are not under B's
changelog subject. The check must say so, with the subjects; a repair must clear it.

Each test runs on kdiv's development registry and on Apicurio Registry (`each_registry_url`);
the workers and the check use the registry the test runs on.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import aiohttp
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kdiv.config.settings import RegistrySettings
from kdiv.registry.client import SchemaRegistry
from kdiv.state.codec import STATE_SCHEMA_JSON
from kdiv.state.framing import frame, unframe
from kdiv.writer import DivWriter
from tests.harness.broker import (
    produce_with_faults,
    produce_with_faults_for,
    read_incidents,
    read_table,
    wait_until_caught_up,
)
from tests.harness.oracle import incident_differences, oracle, state_differences
from tests.harness.processes import WorkerProcess, free_port


def earlier_release_schema(app_id: str) -> str:
    """The state schema as an earlier release registered it for `app_id`: same fields,
    other docs (so another id)."""
    schema = json.loads(STATE_SCHEMA_JSON)
    for record in schema:
        record["doc"] = f"kdiv state ({record['name']}) of {app_id}, release 0.0.9"
    return json.dumps(schema)


async def renamed_application(bootstrap: str, registry_url: str, old_app: str, new_app: str) -> int:
    """Copy A's state changelog to B's, framed with the earlier release's schema id (under
    A's subject only), as the state of that release would be. Returns that id."""
    registry = SchemaRegistry(RegistrySettings(url=registry_url))
    try:
        old_id = await registry.register(f"{old_app}-state-p1-changelog-value", earlier_release_schema(old_app))
    finally:
        await registry.close()
    table = await read_table(bootstrap, old_app, 1)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(f"{new_app}-state-p1-changelog", 1, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in table.items():
            await producer.send_and_wait(
                f"{new_app}-state-p1-changelog", frame(old_id, unframe(value)[1]), key=key, partition=0
            )
    finally:
        await producer.stop()
    return old_id


async def health(worker: WorkerProcess) -> dict:
    async with aiohttp.ClientSession() as session, session.get(f"{worker.url}/health") as response:
        return await response.json()


async def wait_for(predicate, timeout: float = 30.0, every: float = 0.5):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout} s: {predicate.__name__}")
        await asyncio.sleep(every)


def schema_incidents(live: dict, verdict: str = "SUBJECT_MISMATCH") -> list:
    return [versions for versions in live.values() if versions[-1].verdict == verdict]


def registry_env(registry_url: str, **settings: str) -> dict[str, str]:
    return {"KDIV_SCHEMA_REGISTRY_URL": registry_url, **settings}


async def run_old_worker(bootstrap, registry_url, topic, tmp_path, old_app):
    await produce_with_faults_for(bootstrap, topic, 1.5, rate=300, fault_every=30)
    old = WorkerProcess(
        "old", bootstrap=bootstrap, topics=[topic], app_id=old_app, workdir=tmp_path, env=registry_env(registry_url)
    )
    try:
        old.start()
        await wait_until_caught_up(bootstrap, old_app, topic, workers=[old], timeout=90)
    finally:
        old.terminate()


async def renamed_after_a_run(bootstrap, registry_url, topic, tmp_path) -> tuple[str, str, str, int]:
    """(topic, A, B, the earlier release's id): A validated `topic`, then was renamed to B."""
    old_app, new_app = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    await run_old_worker(bootstrap, registry_url, topic, tmp_path, old_app)
    return topic, old_app, new_app, await renamed_application(bootstrap, registry_url, old_app, new_app)


async def test_a_restore_under_another_subject_is_reported_and_a_repair_clears_it(
    bootstrap, each_registry_url, topic_factory, tmp_path
):
    topic, old_app, new_app, old_id = await renamed_after_a_run(
        bootstrap, each_registry_url, topic_factory(1), tmp_path
    )

    new = WorkerProcess(
        "new",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=new_app,
        workdir=tmp_path,
        web_port=free_port(),
        env=registry_env(each_registry_url, KDIV_SCHEMA_RECHECK_S="1"),
    )
    changelog = f"{new_app}-state-p1-changelog"
    try:
        new.start()
        await new.wait_ready()

        async def mismatch_reported():
            return schema_incidents(await read_incidents(bootstrap, new_app))

        (versions,) = await wait_for(mismatch_reported)
        incident = versions[0]
        assert (incident.topic, incident.partition, incident.schema_id, incident.offset) == (changelog, 0, old_id, 0)
        assert incident.expected_subject == f"{changelog}-value"
        assert incident.registered_subjects == (f"{old_app}-state-p1-changelog-value",)
        assert incident.resolved_at_ms is None
        body = await health(new)
        assert body["status"] == "degraded"
        assert [(f["changelog"], f["schema_id"], f["class"]) for f in body["state_schema_findings"]] == [
            (changelog, old_id, "SUBJECT_MISMATCH")
        ]

        # kdiv reads its state by id: it goes on without a false alarm.
        stop = asyncio.Event()
        more = asyncio.create_task(produce_with_faults(bootstrap, topic, stop, rate=300, fault_every=30, seed=1))
        await asyncio.sleep(1)
        stop.set()
        await more
        await wait_until_caught_up(bootstrap, new_app, topic, workers=[new], timeout=90)
        expected = await oracle(bootstrap, topic)
        # The records A validated are replays to B (its restored state holds them).
        live = {**await read_incidents(bootstrap, old_app), **await read_incidents(bootstrap, new_app)}
        div_incidents = {k: v for k, v in live.items() if v[-1].schema_id is None}
        assert incident_differences(expected, div_incidents) == []
        assert state_differences(expected, await read_table(bootstrap, new_app, 1)) == []
        assert (await health(new))["state_load_errors"] == 0

        # The check, by hand: names the same finding; --repair registers and clears it.
        command = [sys.executable, "-m", "kdiv.cli", "schemas", "check", changelog, "--bootstrap", bootstrap]
        env = {"KDIV_SCHEMA_REGISTRY_URL": each_registry_url, "PATH": ""}
        found = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert found.returncode == 1, found.stderr
        assert f"SUBJECT_MISMATCH schema id {old_id} (first at {changelog}[0]@0" in found.stdout
        repaired = subprocess.run([*command, "--repair"], capture_output=True, text=True, env=env, timeout=60)
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        assert f"registering schema id {old_id} under {changelog}-value" in repaired.stdout

        async def resolved():
            versions = schema_incidents(await read_incidents(bootstrap, new_app))
            return versions and versions[0][-1].resolved_at_ms is not None and versions[0][-1]

        cleared = await wait_for(resolved)
        assert f"{changelog}-value" in cleared.registered_subjects
        body = await health(new)
        assert body["status"] == "ready" and body["state_schema_findings"] == []
        # The finding itself is logged as an error; nothing else went wrong.
        assert [p for p in new.problems() if "SUBJECT_MISMATCH: state in" not in p] == []
    finally:
        new.terminate()


async def test_auto_repair_registers_the_state_schema_under_the_restoring_subject(
    bootstrap, each_registry_url, topic_factory, tmp_path
):
    topic, old_app, new_app, old_id = await renamed_after_a_run(
        bootstrap, each_registry_url, topic_factory(1), tmp_path
    )
    new = WorkerProcess(
        "new",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=new_app,
        workdir=tmp_path,
        web_port=free_port(),
        env=registry_env(each_registry_url, KDIV_SCHEMA_AUTO_REPAIR="true", KDIV_SCHEMA_RECHECK_S="1"),
    )
    try:
        new.start()
        await new.wait_ready()

        async def resolved():
            versions = schema_incidents(await read_incidents(bootstrap, new_app))
            return versions and versions[0][-1].resolved_at_ms is not None and versions[0]

        versions = await wait_for(resolved)
        assert versions[0].resolved_at_ms is None and versions[0].schema_id == old_id  # reported, then resolved
        registry = SchemaRegistry(RegistrySettings(url=each_registry_url))
        try:
            subjects = {v.subject for v in await registry.versions_of(old_id)}
        finally:
            await registry.close()
        assert subjects == {f"{old_app}-state-p1-changelog-value", f"{new_app}-state-p1-changelog-value"}
        assert "repaired: schema id" in new.log_text()
    finally:
        new.terminate()


async def test_watched_records_with_unknown_or_misplaced_schema_ids(
    bootstrap, each_registry_url, topic_factory, tmp_path
):
    topic = topic_factory(2)
    registry = SchemaRegistry(RegistrySettings(url=each_registry_url))
    name = f"Order_{uuid.uuid4().hex[:8]}"
    schema = json.dumps({"type": "record", "name": name, "fields": [{"name": "id", "type": "long"}]})
    try:
        right = await registry.register(f"{topic}-value", schema)
        misplaced = await registry.register(f"other-{topic}-value", schema.replace('"long"', '"string"'))
    finally:
        await registry.close()
    unknown = 2_000_000_000
    app_id = f"w{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "watch",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        env=registry_env(each_registry_url, KDIV_SCHEMA_TOPICS=topic),
    )
    writer = await DivWriter.start(bootstrap)
    try:
        worker.start()
        await worker.wait_ready()
        sent = {}
        for n, schema_id in enumerate([right, right, misplaced, right, unknown, misplaced, unknown, right]):
            partition = n % 2
            metadata = await writer.send_and_wait(topic, frame(schema_id, b"\x02"), key=b"k%d" % n, partition=partition)
            sent.setdefault((schema_id, metadata.partition), metadata.offset)
        await writer.send_and_wait(topic, b"not framed", partition=0)
        await writer.flush()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        live = await read_incidents(bootstrap, app_id)
        found = {(i[-1].verdict, i[-1].schema_id, i[-1].partition, i[-1].offset) for i in live.values()}
        assert found == {
            ("SUBJECT_MISMATCH", misplaced, p, sent[(misplaced, p)]) for p in (0, 1) if (misplaced, p) in sent
        } | {("SCHEMA_UNKNOWN", unknown, p, sent[(unknown, p)]) for p in (0, 1) if (unknown, p) in sent}
        mismatch = next(i[-1] for i in live.values() if i[-1].verdict == "SUBJECT_MISMATCH")
        assert mismatch.expected_subject == f"{topic}-value"
        assert mismatch.registered_subjects == (f"other-{topic}-value",)
        assert worker.problems() == []
    finally:
        await writer.close()
        worker.terminate()
