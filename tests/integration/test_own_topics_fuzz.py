"""kdiv's own topics are untrusted too: random and mutated values on the incidents topic, the
observations, the state and traces changelogs and the key ledger leave a live worker running,
serving every view, before and after it restores its state from those changelogs; odd times
(2^60, negative, microseconds) show as null beside their numbers; and a password planted in
the registry URL appears in no view and no log line."""

from __future__ import annotations

import json
import random
import re
import uuid

import aiohttp
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from kdiv.div.stamper import DivStamper
from kdiv.div.wire import HEADER_NAME
from kdiv.kafka.consume import read_snapshot
from kdiv.state.tables import changelog_topic_name, ledger_changelog_topic_name
from kdiv.trace.header import TRACE_HEADER, TraceStamp, encode_trace
from tests.harness.broker import wait_until_caught_up
from tests.harness.http import http_json
from tests.harness.processes import WorkerProcess, free_port

SEED = 20_260_601
PASSWORD = "pl4nted-Own-Topics"
NOW = 1_700_000_000_000
ODD_TIMES = (2**60, NOW * 1000)  # a clock gone wrong, a producer writing microseconds
VIEWS = ("/incidents/?limit=1000", "/producers/", "/partitions/", "/routes/", "/changefeeds/", "/health", "/metrics")
NOT_OBJECTS = (b"[1,2,3]", b"null", b'"x"', b"17", b"[" * 100_000 + b"]" * 100_000)


def with_user_info(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://kdiv:{PASSWORD}@{rest}"


def random_json(rng: random.Random, depth: int = 0) -> object:
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        return rng.choice([0, -1, 2**60, -(2**63), 2**64, NOW * 1000, rng.randrange(-(10**6), 10**6)])
    if choice == 3:
        return rng.random() * 1e6
    if choice in (4, 5):
        return rng.choice(["", "soon", "MISSING", "fatal", "-", "\u0000", "x" * rng.randrange(100)])
    if choice in (6, 7):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["a", "detail", "topic"]): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def mutated_bytes(rng: random.Random, real: bytes) -> bytes:
    """A real value, truncated, flipped, extended or cut and joined: mostly almost right."""
    how = rng.randrange(4)
    if how == 0 or not real:
        return rng.randbytes(rng.randrange(64))
    if how == 1:
        return real[: rng.randrange(len(real))]
    if how == 2:
        flipped = bytearray(real)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    return real + rng.randbytes(rng.randrange(1, 32))


def mutated_incident(rng: random.Random, real: dict) -> bytes:
    fields = dict(real)
    for _ in range(rng.randrange(1, 3)):
        name = rng.choice([*sorted(fields), "row_key", "registered_subjects", "hop", "surprise"])
        if rng.random() < 0.2:
            fields.pop(name, None)
        else:
            fields[name] = random_json(rng)
    return json.dumps(fields).encode()


async def accept_any_timestamp(bootstrap: str, topic: str) -> None:
    """Kafka refuses timestamps more than an hour ahead unless the topic says otherwise."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"message.timestamp.after.max.ms": str(2**63 - 1)}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
    finally:
        await admin.close()


async def real_values(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes]]:
    return [(r.key, r.value) async for r in read_snapshot(bootstrap, topic) if r.value is not None]


async def views_answer(session: aiohttp.ClientSession, worker: WorkerProcess) -> dict[str, object]:
    bodies: dict[str, object] = {}
    for path in VIEWS:
        status, body = await http_json(session, "GET", f"{worker.url}{path}")
        # /health may say 503 while a restore runs; never 500.
        assert status in (200, 503) if path == "/health" else status == 200, (path, status, body)
        bodies[path] = body
    return bodies


async def test_a_worker_outlives_anything_written_to_its_own_topics(bootstrap, topic_factory, registry_url, tmp_path):
    rng = random.Random(SEED)
    source, sink = topic_factory(2), topic_factory(2)
    await accept_any_timestamp(bootstrap, source)
    app_id = f"ownfuzz{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "ownfuzz",
        bootstrap=bootstrap,
        topics=[source],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={
            "KDIV_ROUTES": f"r={source}>{app_id}-processor>{sink}",
            "KDIV_TRACE_PARTITIONS": "2",
            "KDIV_COMPACTION_LAG_MS": f"{source}=0",
            "KDIV_SCHEMA_REGISTRY_URL": with_user_info(registry_url),
        },
    )
    incidents = f"{app_id}-incidents"
    own_topics = {
        "incidents": incidents,
        "observations": f"{app_id}-trace-observations",
        "state": changelog_topic_name(app_id, 2),
        "traces": f"{app_id}-traces-changelog",
        "ledger": ledger_changelog_topic_name(app_id, 2),
    }
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=4 << 20)
    stamper = DivStamper(uuid.UUID(int=rng.getrandbits(128)).bytes)
    try:
        worker.start()
        await worker.wait_ready()
        await producer.start()

        async def write_good(count: int) -> None:
            """Stamped records, traced (some with odd origins), half of them passed on to the sink."""
            for i in range(count):
                origin = rng.choice([NOW + i, NOW + i, 2**62, -(2**63), 2**63 - 1])
                trace = (TRACE_HEADER, encode_trace(TraceStamp(rng.randbytes(16), origin)))
                for record in stamper.data(source, i % 2, b"k%d" % i, b"v%d" % i, NOW + i):
                    headers = [*record.headers, trace]
                    await producer.send_and_wait(source, record.value, record.key, i % 2, headers=headers)
                if i % 2:
                    await producer.send_and_wait(sink, b"out", b"k%d" % i, i % 2, headers=[trace])
            await wait_until_caught_up(bootstrap, app_id, source, workers=[worker], timeout=90)

        # Odd times on a watched topic: correctly stamped records with producer times of 2^60
        # and in microseconds, and a MALFORMED record whose Kafka timestamp is 2^60.
        for producer_ms in ODD_TIMES:
            odd = DivStamper(uuid.UUID(int=rng.getrandbits(128)).bytes)
            for record in odd.data(source, 0, b"odd", b"v", producer_ms):
                await producer.send_and_wait(source, record.value, record.key, 0, headers=list(record.headers))
        malformed = await producer.send_and_wait(
            source, b"v", b"broken", 1, timestamp_ms=2**60, headers=[(HEADER_NAME, b"\x07\x07")]
        )
        await write_good(40)
        async with aiohttp.ClientSession() as session:
            bodies = await views_answer(session, worker)
        for ms in ODD_TIMES:  # the odd times: null beside their raw number
            (shown,) = [p for p in bodies["/producers/"]["items"] if p["last_producer_timestamp_ms"] == ms]
            assert shown["last_producer_time"] is None
        items = bodies["/incidents/?limit=1000"]["items"]
        (broken,) = [i for i in items if (i["topic"], i["partition"], i["offset"]) == (source, 1, malformed.offset)]
        assert (broken["verdict"], broken["record_timestamp_ms"], broken["record_time"]) == ("MALFORMED", 2**60, None)

        # Random and mutated values on every topic of the worker's own.
        real = {name: await real_values(bootstrap, topic) for name, topic in own_topics.items()}
        real_incident = json.loads(real["incidents"][0][1])
        for name, topic in own_topics.items():
            partitions = sorted(await producer.partitions_for(topic))
            values: list[bytes | None] = [None, b"", *(rng.randbytes(rng.randrange(200)) for _ in range(20))]
            mutated = [rng.choice(real[name]) for _ in range(60 if real[name] else 0)]
            if name == "incidents":
                values += [*NOT_OBJECTS, *(mutated_incident(rng, real_incident) for _ in range(150))]
                values += [json.dumps({**real_incident, "detected_at_ms": "soon"}).encode()]
            # Compacted topics refuse records without a key: an empty one is the least. A
            # mutated value keeps its real key half the time, so it replaces a real one.
            records = [(rng.choice([b"", rng.randbytes(rng.randrange(1, 40))]), value) for value in values]
            records += [
                (key if rng.random() < 0.5 and key else rng.randbytes(8), mutated_bytes(rng, value))
                for key, value in mutated
            ]
            rng.shuffle(records)
            for key, value in records:
                await producer.send_and_wait(topic, value, key, partition=rng.choice(partitions))

        for ms in (*ODD_TIMES, -7):  # well-formed incidents detected at odd times
            odd_incident = json.dumps({**real_incident, "detected_at_ms": ms}).encode()
            await producer.send_and_wait(incidents, odd_incident, b"odd-%d" % ms, partition=0)
        await write_good(40)
        assert worker.alive
        async with aiohttp.ClientSession() as session:
            bodies = await views_answer(session, worker)
            items = bodies["/incidents/?limit=1000"]["items"]
            assert {i["detected_at_ms"] for i in items if i["detected_at"] is None} >= {*ODD_TIMES, -7}
            assert not any(i["detected_at_ms"] == "soon" for i in items)
            metrics = bodies["/metrics"]
            assert isinstance(metrics, str)
            bad = re.search(r"^kdiv_bad_incident_records(?:_total)? (\S+)$", metrics, re.M)
            assert bad is not None and float(bad.group(1)) >= len(NOT_OBJECTS) + 1

        # Every value that is not an incident is one log line naming where it is.
        log = worker.log_text()
        named = {int(m) for m in re.findall(rf"unreadable incident at {re.escape(incidents)}\[\d\]@(\d+)", log)}
        assert len(named) >= len(NOT_OBJECTS) + 1

        # A worker without its local store restores from the fuzzed changelogs, and serves.
        assert worker.terminate() == 0
        worker.restart(keep_data=False)
        await worker.wait_ready(timeout=90)
        await write_good(20)
        async with aiohttp.ClientSession() as session:
            bodies = await views_answer(session, worker)
            health = bodies["/health"]
            assert isinstance(health, dict)
            assert health["schema_registry"]["url"] == registry_url
        assert worker.alive
        log = worker.log_text()
        assert "Traceback" not in log, worker.log_tail(80)
        assert PASSWORD not in log
        assert PASSWORD not in json.dumps(bodies)
    finally:
        await producer.stop()
        worker.terminate()
