"""A development Schema Registry: the REST subset kdiv uses, over a `_schemas` topic.

For the embedded dev stack and the tests, where no real registry can be installed; in
production point KDIV_SCHEMA_REGISTRY_URL at Confluent Schema Registry (or Karapace,
Apicurio's ccompat API). It keeps Confluent's record format (see `devstore`), so a real
registry started on the same topic finds these schemas, and the reverse.

One instance writes a topic: ids are allocated from the state it read at start and its
own writes, so two dev registries on one topic would hand out the same id.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.dev.outage import Backoff, BrokerOutage, is_outage, retry
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.failures import failure_text
from kdiv.kafka.produce import started_producer
from kdiv.kafka.topics import create_topic
from kdiv.registry.schemaslog import (
    LEVELS,
    RegistryRequestError,
    SchemaLogState,
    encode_record,
)

log = logging.getLogger("kdiv.registry")
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMAS_TOPIC = "_schemas"


class BrokerAway(Exception):
    """A write the broker did not acknowledge: it may or may not be in the log."""


class DevRegistry:
    def __init__(self, bootstrap: str, topic: str = SCHEMAS_TOPIC, security: KafkaSecurity = PLAINTEXT) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security
        self.state = SchemaLogState()
        self._producer: AIOKafkaProducer | None = None
        # Writes are planned from the state and applied after they are acknowledged; one at
        # a time, so two registrations never get the same id or version.
        self._write_lock = asyncio.Lock()
        self.outage = BrokerOutage("kdiv registry", log)
        # Set when a write timed out: it may or may not be in the log, so the state is read
        # from the log again before the next write plans from it.
        self._state_uncertain = False

    async def start(self) -> None:
        backoff = Backoff()
        # The first contact is not retried: a broker that cannot be reached when the registry
        # starts is an error in one line (the dev stack starts it after `kdiv wait-for-broker`);
        # outages after it are ridden out.
        await self._ensure_topic()
        replayed = await retry(self._replay, self.outage, backoff)

        self._producer = await retry(
            lambda: started_producer(
                self.bootstrap, security=self.security, linger_ms=0, client_id="kdiv-dev-registry"
            ),
            self.outage,
            backoff,
        )
        log.info(
            "dev registry: %d records replayed from %s: %d schemas, %d subjects (%d records not used)",
            replayed,
            self.topic,
            len(self.state.schemas),
            len(self.state.subjects),
            self.state.ignored_records,
        )

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def _replay(self) -> int:
        """The state read from the whole log; the number of records read."""
        state, replayed = SchemaLogState(), 0
        async for record in read_snapshot(self.bootstrap, self.topic, security=self.security):
            state.apply(record.key, record.value)
            replayed += 1
        self.state = state
        return replayed

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """The one writer's turn, with the state caught up with the log after an uncertain write.

        While the broker is away a write fails with `BrokerAway` (HTTP 500, Confluent's
        50002 "operation timed out"): the outage is logged once, not per request."""
        async with self._write_lock:
            try:
                if self._state_uncertain:
                    await self._replay()
                    self._state_uncertain = False
                yield
            except Exception as failed:
                if not is_outage(failed):
                    raise
                self._state_uncertain = True
                self.outage.failed(failed)
                raise BrokerAway(failure_text(failed)) from None
            self.outage.ended()

    async def _ensure_topic(self) -> None:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, client_id="kdiv-dev-registry", **self.security.aiokafka_kwargs()
        )
        await admin.start()
        try:
            if self.topic in await admin.list_topics():
                return
            # As Confluent creates it: one partition (one order), compacted (latest per key).
            topic = NewTopic(
                self.topic, num_partitions=1, replication_factor=1, topic_configs={"cleanup.policy": "compact"}
            )
            await create_topic(admin, topic)
        finally:
            await admin.close()

    async def append(self, records: list[tuple[dict, dict | None]]) -> None:
        """Write records to the log, then apply them: the log is the registry's truth."""
        assert self._producer is not None, "start() first"
        for key, value in records:
            raw_key, raw_value = encode_record(key, value)
            await self._producer.send_and_wait(self.topic, raw_value, key=raw_key, partition=0)
            self.state.apply(raw_key, raw_value)

    # -- REST ------------------------------------------------------------------------------

    def web_app(self) -> web.Application:
        app = web.Application(middlewares=[_confluent_errors])
        get, post, put, delete = web.get, web.post, web.put, web.delete
        app.add_routes(
            [
                get("/", self.root),
                get("/schemas/types", self.schema_types),
                get("/subjects", self.subjects),
                get("/subjects/{subject}/versions", self.subject_versions),
                get("/subjects/{subject}/versions/{version}", self.subject_version),
                get("/subjects/{subject}/versions/{version}/schema", self.subject_version_schema),
                post("/subjects/{subject}/versions", self.register),
                post("/subjects/{subject}", self.lookup),
                delete("/subjects/{subject}", self.delete_subject),
                get("/schemas/ids/{id}", self.schema_by_id),
                get("/schemas/ids/{id}/versions", self.versions_of_id),
                get("/schemas/ids/{id}/subjects", self.subjects_of_id),
                post("/compatibility/subjects/{subject}/versions/{version}", self.compatibility),
                post("/compatibility/subjects/{subject}/versions", self.compatibility_all),
                get("/config", self.get_level),
                put("/config", self.put_level),
                get("/config/{subject}", self.get_level),
                put("/config/{subject}", self.put_level),
                delete("/config/{subject}", self.delete_level),
                get("/mode", self.mode),
            ]
        )
        return app

    async def root(self, request: web.Request) -> web.Response:
        return _json({})

    async def schema_types(self, request: web.Request) -> web.Response:
        return _json(["AVRO"])

    async def subjects(self, request: web.Request) -> web.Response:
        return _json(self.state.subject_names(deleted=_flag(request, "deleted")))

    async def subject_versions(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        return _json(list(self.state.live_versions(subject, deleted=_flag(request, "deleted"))))

    async def subject_version(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        number, entry = self.state.version(subject, request.match_info["version"])
        return _json(
            {
                "subject": subject,
                "version": number,
                "id": entry.schema_id,
                "schema": self.state.schemas[entry.schema_id],
            }
        )

    async def subject_version_schema(self, request: web.Request) -> web.Response:
        _number, entry = self.state.version(request.match_info["subject"], request.match_info["version"])
        return web.Response(text=self.state.schemas[entry.schema_id], content_type=CONTENT_TYPE)

    async def register(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        schema = _schema_text(await _body(request))
        async with self.writing():
            schema_id, records = self.state.plan_register(subject, schema)
            await self.append(records)
        version, _ = self.state.lookup(subject, schema)
        return _json({"id": schema_id, "subject": subject, "version": version, "schema": schema})

    async def lookup(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        schema = _schema_text(await _body(request))
        version, schema_id = self.state.lookup(subject, schema)
        return _json({"subject": subject, "version": version, "id": schema_id, "schema": self.state.schemas[schema_id]})

    async def delete_subject(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        async with self.writing():
            versions, records = self.state.plan_delete_subject(subject, permanent=_flag(request, "permanent"))
            await self.append(records)
        return _json(versions)

    async def schema_by_id(self, request: web.Request) -> web.Response:
        return _json({"schema": self.state.schema(_schema_id(request))})

    async def versions_of_id(self, request: web.Request) -> web.Response:
        found = self.state.versions_of_id(_schema_id(request), deleted=_flag(request, "deleted"))
        return _json([{"subject": subject, "version": version} for subject, version in found])

    async def subjects_of_id(self, request: web.Request) -> web.Response:
        found = self.state.versions_of_id(_schema_id(request), deleted=_flag(request, "deleted"))
        return _json(sorted({subject for subject, _version in found}))

    async def compatibility(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        schema = _schema_text(await _body(request))
        self.state.live_versions(subject)
        problems = self.state.compatible(subject, schema, request.match_info["version"])
        answer: dict[str, object] = {"is_compatible": not problems}
        if _flag(request, "verbose"):
            answer["messages"] = problems
        return _json(answer)

    async def compatibility_all(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        problems = self.state.compatible(subject, _schema_text(await _body(request)))
        return _json({"is_compatible": not problems})

    async def get_level(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        if subject is not None and subject not in self.state.levels:
            if not _flag(request, "defaultToGlobal"):
                raise RegistryRequestError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                )
        return _json({"compatibilityLevel": self.state.level(subject)})

    async def put_level(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        body = await _body(request)
        level = body.get("compatibility") or body.get("compatibilityLevel")
        if level not in LEVELS:
            raise RegistryRequestError(422, 42203, f"Invalid compatibility level {level!r}; valid: {', '.join(LEVELS)}")
        async with self.writing():
            await self.append(self.state.plan_level(subject, level))
        return _json({"compatibility": level})

    async def delete_level(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        previous = self.state.level(subject)
        async with self.writing():
            await self.append(self.state.plan_level(subject, None))
        return _json({"compatibilityLevel": previous})

    async def mode(self, request: web.Request) -> web.Response:
        return _json({"mode": "READWRITE"})


@web.middleware
async def _confluent_errors(request: web.Request, handler):
    try:
        return await handler(request)
    except RegistryRequestError as error:
        return _json({"error_code": error.error_code, "message": error.message}, status=error.status)
    except BrokerAway as away:
        message = f"Operation timed out: the registry's broker did not answer ({away})"
        return _json({"error_code": 50002, "message": message}, status=500)
    except web.HTTPException as error:
        code = error.status * 100 + 1 if error.status == 404 else error.status
        return _json({"error_code": code, "message": error.reason}, status=error.status)
    except Exception as error:  # the client gets Confluent's store error, the log gets the cause
        log.exception("dev registry: %s %s failed", request.method, request.path)
        return _json({"error_code": 50001, "message": f"Error in the backend data store: {error!r}"}, status=500)


def _json(body, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type=CONTENT_TYPE)


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


def _schema_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise RegistryRequestError(404, 40403, f"Schema {request.match_info['id']} not found") from None


async def _body(request: web.Request) -> dict:
    try:
        body = json.loads(await request.text())
    except ValueError as bad:
        raise RegistryRequestError(422, 42201, f"Request body is not JSON: {bad}") from None
    if not isinstance(body, dict):
        raise RegistryRequestError(422, 42201, "Request body must be a JSON object")
    return body


def _schema_text(body: dict) -> str:
    schema_type = body.get("schemaType", "AVRO")
    if schema_type != "AVRO":
        raise RegistryRequestError(
            422, 42201, f"Invalid schema: the development registry stores Avro only, not {schema_type}"
        )
    if body.get("references"):
        raise RegistryRequestError(422, 42201, "Invalid schema: the development registry does not resolve references")
    schema = body.get("schema")
    if not isinstance(schema, str):
        raise RegistryRequestError(422, 42201, "Invalid schema: 'schema' must be a string")
    return schema


async def serve(
    bootstrap: str, host: str, port: int, topic: str = SCHEMAS_TOPIC, security: KafkaSecurity = PLAINTEXT
) -> None:
    """Run until cancelled."""
    registry = DevRegistry(bootstrap, topic, security)
    await registry.start()
    runner = web.AppRunner(registry.web_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("dev registry listening on http://%s:%d (schemas topic %s)", host, port, topic)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await registry.stop()
