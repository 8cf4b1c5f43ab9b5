"""The registry client against each registry (the development one, or any Confluent-API
registry through KDIV_SCHEMA_REGISTRY_URL, and Apicurio Registry's Confluent API), the
development registry's `_schemas` log, and the client's behaviour when a registry answers badly."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from aiohttp import web

from kdiv.config.settings import RegistrySettings
from kdiv.dev.registry.process import DevRegistryProcess, free_port
from kdiv.kafka.consume import read_snapshot
from kdiv.registry.client import (
    RegistryRejected,
    RegistryUnavailable,
    SchemaNotFound,
    SchemaRegistry,
    expected_subject,
)
from kdiv.registry.subjects import (
    SCHEMA_UNKNOWN,
    SUBJECT_MISMATCH,
    UNCHECKED,
    SchemaLookups,
)


def record_schema(name: str, *fields: tuple[str, str | list, object]) -> str:
    fields_json: list[dict] = []
    body = {"type": "record", "name": name, "namespace": "kdiv.test", "fields": fields_json}
    for field_name, field_type, *default in fields:
        entry: dict[str, object] = {"name": field_name, "type": field_type}
        if default:
            entry["default"] = default[0]
        fields_json.append(entry)
    return json.dumps(body)


def unique(prefix: str) -> str:
    # "_" keeps it a valid Avro name as well as a subject.
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def registry(each_registry_url):
    client = SchemaRegistry(RegistrySettings(url=each_registry_url))
    yield client
    await client.close()


async def test_ids_are_global_and_reused_across_subjects(registry):
    schema = record_schema(unique("Order"), ("id", "long"))
    first, second = unique("orders-value"), unique("orders-copy-value")
    schema_id = await registry.register(first, schema)
    assert await registry.register(first, schema) == schema_id  # idempotent
    assert await registry.register(second, schema) == schema_id
    found = {(v.subject, v.version) for v in await registry.versions_of(schema_id)}
    assert found == {(first, 1), (second, 1)}
    assert json.loads(await registry.schema_text(schema_id)) == json.loads(schema)
    assert {first, second} <= set(await registry.subjects())


async def test_versions_grow_per_subject_and_incompatible_schemas_are_refused(registry):
    name = unique("Payment")
    subject = unique("payments-value")
    v1 = await registry.register(subject, record_schema(name, ("id", "long")))
    v2 = await registry.register(subject, record_schema(name, ("id", "long"), ("note", ["null", "string"], None)))
    assert v2 != v1
    assert [(v.subject, v.version) for v in await registry.versions_of(v2)] == [(subject, 2)]
    # BACKWARD (the default): a new required field cannot read old records.
    with pytest.raises(RegistryRejected, match="409"):
        await registry.register(subject, record_schema(name, ("id", "long"), ("amount", "long")))


async def test_a_schema_written_otherwise_is_the_same_schema_under_its_subject(registry, registry_kind):
    compact = record_schema(unique("Spaced"), ("id", "long"))
    spaced = json.dumps(json.loads(compact), indent=2)
    subject, other = unique("spaced-value"), unique("spaced-copy-value")
    schema_id = await registry.register(subject, compact)
    assert await registry.register(subject, spaced) == schema_id  # found, not a version 2
    assert [(v.subject, v.version) for v in await registry.versions_of(schema_id)] == [(subject, 1)]
    elsewhere = await registry.register(other, spaced)
    if registry_kind == "apicurio":
        # Apicurio numbers schemas by their text, Confluent (and kdiv's registry) by their
        # canonical form: under another subject the same schema written otherwise is another id.
        assert elsewhere != schema_id
        assert [(v.subject, v.version) for v in await registry.versions_of(elsewhere)] == [(other, 1)]
    else:
        assert elsewhere == schema_id


async def test_unknown_ids_and_subjects_are_not_found(registry):
    with pytest.raises(SchemaNotFound, match="schema id 987654"):
        await registry.schema_text(987654)
    with pytest.raises(SchemaNotFound):
        await registry.versions_of(987654)


async def test_compatibility_and_lookup_through_the_confluent_client(each_registry_url, registry_kind):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

    client = SchemaRegistryClient({"url": each_registry_url})
    name, subject = unique("Event"), unique("events-value")
    schema_id = client.register_schema(subject, Schema(record_schema(name, ("id", "long")), "AVRO"))
    assert client.lookup_schema(subject, Schema(record_schema(name, ("id", "long")), "AVRO")).schema_id == schema_id
    assert client.test_compatibility(subject, Schema(record_schema(name, ("id", "long"), ("x", "int", 0)), "AVRO"))
    assert not client.test_compatibility(subject, Schema(record_schema(name, ("id", "string")), "AVRO"))
    assert client.get_latest_version(subject).schema_id == schema_id
    assert [(v.subject, v.version) for v in client.get_schema_versions(schema_id)] == [(subject, 1)]
    if registry_kind == "apicurio":
        # Apicurio 2.6 has no GET /schemas/ids/{id}/subjects; kdiv reads an id's subjects
        # from /schemas/ids/{id}/versions, which it has.
        with pytest.raises(SchemaRegistryError, match="HTTP status code 404"):
            client.get_subjects_by_schema_id(schema_id)
    else:
        assert client.get_subjects_by_schema_id(schema_id) == [subject]


def test_subject_name_strategies():
    assert expected_subject("topic", "orders", is_key=False, record_name="a.B") == "orders-value"
    assert expected_subject("topic", "orders", is_key=True, record_name=None) == "orders-key"
    assert expected_subject("record", "orders", is_key=False, record_name="a.B") == "a.B"
    assert expected_subject("topic_record", "orders", is_key=False, record_name="a.B") == "orders-a.B"
    assert expected_subject("record", "orders", is_key=False, record_name=None) is None


def test_the_dev_registry_log_is_confluents_format_and_survives_a_restart(bootstrap, run):
    topic = unique("_schemas-test")
    name = unique("Kept")
    schema = record_schema(name, ("id", "long"))
    with DevRegistryProcess(bootstrap, topic=topic) as first:
        ids = run(_register_all(first.url, [("a-value", schema), ("b-value", schema)]))
    assert ids[0] == ids[1]
    records = run(_read_all(bootstrap, topic))
    assert [json.loads(key) for key, _ in records] == [
        {"keytype": "SCHEMA", "subject": "a-value", "version": 1, "magic": 1},
        {"keytype": "SCHEMA", "subject": "b-value", "version": 1, "magic": 1},
    ]
    # Compact JSON in Confluent's key order, as a real registry writes and reads it.
    assert records[0][0] == b'{"keytype":"SCHEMA","subject":"a-value","version":1,"magic":1}'
    assert json.loads(records[1][1]) == {
        "subject": "b-value",
        "version": 1,
        "id": ids[0],
        "schema": schema,
        "deleted": False,
    }

    with DevRegistryProcess(bootstrap, topic=topic) as second:
        later = record_schema(unique("Later"), ("id", "long"))
        kept_versions, new_id = run(_after_restart(second.url, ids[0], later))
    assert kept_versions == [("a-value", 1), ("b-value", 1)]
    assert new_id == ids[0] + 1  # allocated after what the log holds, never reused


async def _register_all(url: str, pairs) -> list[int]:
    client = SchemaRegistry(RegistrySettings(url=url))
    try:
        return [await client.register(subject, schema) for subject, schema in pairs]
    finally:
        await client.close()


async def _after_restart(url: str, schema_id: int, later: str):
    client = SchemaRegistry(RegistrySettings(url=url))
    try:
        versions = [(v.subject, v.version) for v in await client.versions_of(schema_id)]
        return versions, await client.register("c-value", later)
    finally:
        await client.close()


async def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) async for r in read_snapshot(bootstrap, topic)]


@pytest.fixture
def run():
    from tests.conftest import run_coroutine

    return run_coroutine


# -- a registry that answers badly ------------------------------------------------------------


@pytest.fixture
async def bad_registry():
    async def server_error(request):
        return web.json_response({"error_code": 50001, "message": "store is down"}, status=500)

    async def garbage(request):
        return web.Response(text="<html>proxy error</html>", content_type="application/json")

    async def wrong_shape(request):
        return web.json_response([{"nothing": "useful"}])

    async def slow(request):
        await asyncio.sleep(5)
        return web.json_response({"schema": '"string"'})

    async def string_schema(request):
        return web.json_response({"schema": '"string"'})

    app = web.Application()
    app.router.add_get("/schemas/ids/1", server_error)
    app.router.add_get("/schemas/ids/2", garbage)
    app.router.add_get("/schemas/ids/3", slow)
    app.router.add_get("/schemas/ids/4", string_schema)
    app.router.add_get("/schemas/ids/4/versions", wrong_shape)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize(
    "schema_id,message",
    [(1, "HTTP 500, error 50001: store is down"), (2, "Unknown Schema Registry Error|malformed"), (3, "Timeout")],
)
async def test_bad_answers_are_unavailable_not_verdicts(bad_registry, schema_id, message):
    client = SchemaRegistry(RegistrySettings(url=bad_registry, timeout_s=0.5))
    try:
        with pytest.raises(RegistryUnavailable, match=message) as raised:
            await client.schema_text(schema_id)
        assert bad_registry in str(raised.value) and f"schema id {schema_id}" in str(raised.value)
    finally:
        await client.close()


async def test_a_malformed_subject_list_is_unavailable(bad_registry):
    client = SchemaRegistry(RegistrySettings(url=bad_registry, timeout_s=0.5))
    try:
        with pytest.raises(RegistryUnavailable, match="malformed"):
            await client.versions_of(4)
    finally:
        await client.close()


async def test_an_unreachable_registry_is_unavailable():
    client = SchemaRegistry(RegistrySettings(url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5))
    try:
        with pytest.raises(RegistryUnavailable, match="ConnectError"):
            await client.schema_text(1)
    finally:
        await client.close()


async def test_lookups_degrade_to_unchecked_and_back_off(bad_registry):
    now = [1000.0]
    lookups = SchemaLookups(
        SchemaRegistry(RegistrySettings(url=bad_registry)), clock=lambda: now[0], timeout_s=0.3, backoff_s=5.0
    )
    try:
        started = time.monotonic()
        assert await lookups.verdict(3, "orders", "topic", is_key=False) == UNCHECKED
        assert time.monotonic() - started < 2.0  # one timeout, not the server's 5 s
        requests = lookups.stats.requests
        # Backed off: answered at once, no request made.
        assert await lookups.verdict(1, "orders", "topic", is_key=False) == UNCHECKED
        assert lookups.stats.requests == requests and lookups.stats.unchecked == 2
        now[0] += 6.0
        assert await lookups.verdict(1, "orders", "topic", is_key=False) == UNCHECKED
        assert lookups.stats.requests == requests + 1 and "store is down" in lookups.stats.last_error
    finally:
        await lookups.registry.close()


async def test_lookups_judge_ids_against_the_expected_subject(registry):
    lookups = SchemaLookups(registry, clock=time.monotonic)
    topic = unique("payments")
    name = unique("Payment")
    right = await registry.register(f"{topic}-value", record_schema(name, ("id", "long")))
    # A later version of the same record, registered only under another subject.
    later = record_schema(name, ("id", "long"), ("note", ["null", "string"], None))
    elsewhere = await registry.register(unique("other-value"), later)
    assert await lookups.verdict(right, topic, "topic", is_key=False) is None
    assert await lookups.verdict(elsewhere, topic, "topic", is_key=False) == SUBJECT_MISMATCH
    assert await lookups.verdict(right, topic, "topic", is_key=True) == SUBJECT_MISMATCH
    assert await lookups.verdict(987655, topic, "topic", is_key=False) == SCHEMA_UNKNOWN
    # A repair (registering under the expected subject) is seen once the cached subjects expire.
    await registry.register(f"{topic}-value", await registry.schema_text(elsewhere))
    lookups.forget_subjects(elsewhere)
    assert await lookups.verdict(elsewhere, topic, "topic", is_key=False) is None
