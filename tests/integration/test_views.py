"""The web views of two real workers sharing a topic: any worker answers for all."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from types import SimpleNamespace

import aiohttp
import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kdiv.incident.schema import incident_schema
from kdiv.worker.web.peers import Peers
from tests.harness.broker import exact_end_offsets, produce_with_faults_for, read_incidents, wait_until_caught_up
from tests.harness.http import http_json, wait_for_incidents_read, wait_for_split
from tests.harness.oracle import incident_differences, oracle
from tests.harness.processes import WorkerProcess, free_port

PARTITIONS = 4


@pytest.fixture
async def two_workers(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(PARTITIONS)
    app_id = f"views-{uuid.uuid4().hex[:8]}"
    workers = [
        WorkerProcess(name, bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path, web_port=free_port())
        for name in ("w1", "w2")
    ]
    try:
        for w in workers:
            w.start()
        await asyncio.gather(*(w.wait_ready() for w in workers))
        injected = await produce_with_faults_for(bootstrap, topic, 3, rate=300, fault_every=15)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=workers, timeout=90)
        yield topic, app_id, workers, injected
    finally:
        for w in workers:
            w.terminate()


async def test_any_worker_answers_for_all_partitions_producers_and_incidents(bootstrap, two_workers):
    topic, app_id, workers, injected = two_workers
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        owners = await wait_for_split(session, workers, PARTITIONS)
        expected = await oracle(bootstrap, topic)

        # Each worker lists every partition, whoever owns it, with the same counts.
        listings = [await http_json(session, "GET", f"{w.url}/partitions/") for w in workers]
        assert [status for status, _ in listings] == [200, 200]
        assert listings[0][1]["items"] == listings[1][1]["items"]
        assert listings[0][1]["unavailable_workers"] == []
        records = sum(item["records"] for item in listings[0][1]["items"])
        assert records == expected.records

        # A partition owned by the other worker is answered by its owner.
        for asked in workers:
            foreign = next(p for p, url in owners.items() if url != asked.url)
            status, body = await http_json(session, "GET", f"{asked.url}/partitions/{topic}/{foreign}/")
            assert status == 200
            assert body["worker"] == owners[foreign]
            assert body["partition"] == foreign

        # Producers: the same from both workers; one producer's state in every partition.
        producers = [await http_json(session, "GET", f"{w.url}/producers/?topic={topic}") for w in workers]
        assert producers[0][1]["items"] == producers[1][1]["items"]
        first = producers[0][1]["items"][0]
        assert first["checksum_type"] in ("ADHASH", "NONE") and first["last_producer_time"].endswith("Z")
        assert first["first_producer_time"] <= first["last_producer_time"]
        assert first["first_producer_timestamp_ms"] <= first["last_producer_timestamp_ms"]
        guid = first["producer"]
        status, one = await http_json(session, "GET", f"{workers[1].url}/producers/{guid}/")
        assert status == 200
        assert {item["producer"] for item in one["items"]} == {guid}
        assert {item["partition"] for item in one["items"]} == set(range(PARTITIONS))

        # Incidents: every worker serves every incident; they are exactly the oracle's.
        live = await read_incidents(bootstrap, app_id)
        assert incident_differences(expected, live) == []
        written = await exact_end_offsets(bootstrap, f"{app_id}-incidents")
        for w in workers:
            await wait_for_incidents_read(session, w, written)
            status, page = await http_json(session, "GET", f"{w.url}/incidents/?limit=1000")
            assert status == 200
            assert page["total"] == len(live)
            assert {(i["topic"], i["partition"], i["offset"], i["verdict"]) for i in page["items"]} == {
                (i[-1].topic, i[-1].partition, i[-1].offset, i[-1].verdict) for i in live.values()
            }
        # The overview, from either worker: the group's partitions in its grid (each worker's
        # asked), every incident counted.
        for w in workers:
            status, shown = await http_json(session, "GET", f"{w.url}/overview/")
            assert status == 200 and shown["unavailable_workers"] == []
            cells = [(t["topic"], c["partition"]) for t in shown["grid"]["topics"] for c in t["partitions"]]
            assert [cell for cell in cells if cell[0] == topic] == [(topic, p) for p in range(PARTITIONS)]
            assert shown["faults"]["held"]["fatal"] + shown["faults"]["held"]["warning"] == len(live)
        status, first = await http_json(session, "GET", f"{workers[0].url}/incidents/?limit=2")
        assert len(first["items"]) == 2 and first["next_offset"] == 2
        status, second = await http_json(session, "GET", f"{workers[0].url}/incidents/?limit=2&offset=2")
        page_of = lambda page: {(i["partition"], i["offset"], i["verdict"]) for i in page["items"]}  # noqa: E731
        assert len(second["items"]) == 2 and page_of(second).isdisjoint(page_of(first))

        # Filters: by partition, class, producer, severity and time (ms or ISO 8601).
        status, everything = await http_json(session, "GET", f"{workers[0].url}/incidents/?limit=1000")
        all_items = everything["items"]
        # Every item in the one incident shape (kdiv/incident/schema.json).
        shape = jsonschema.Draft202012Validator(incident_schema())
        assert [list(shape.iter_errors(i)) for i in all_items] == [[] for _ in all_items]

        # Each producer's incident counts and times are those of its incidents, from any worker.
        status, listed = await http_json(session, "GET", f"{workers[1].url}/producers/?topic={topic}")
        assert status == 200
        with_faults = 0
        for item in listed["items"]:
            mine = [
                i
                for i in all_items
                if (i["topic"], i["partition"], i["producer"]) == (item["topic"], item["partition"], item["producer"])
            ]
            assert item["incidents"] == dict(sorted(Counter(i["verdict"] for i in mine).items())), item
            times = [i["detected_at_ms"] for i in mine]
            assert (item["first_incident_ms"], item["last_incident_ms"]) == (
                (min(times), max(times)) if times else (None, None)
            )
            with_faults += bool(mine)
        assert with_faults >= 1
        some = next(i for i in all_items if i["producer"] is not None)
        for query, keep in (
            (f"partition={some['partition']}", lambda i: i["partition"] == some["partition"]),
            ("class=MISSING", lambda i: i["verdict"] == "MISSING"),
            (f"producer={some['producer']}", lambda i: i["producer"] == some["producer"]),
            ("severity=warning", lambda i: i["severity"] == "warning"),
            (f"since={some['detected_at_ms']}", lambda i: i["detected_at_ms"] >= some["detected_at_ms"]),
            (f"until={some['detected_at']}", lambda i: i["detected_at_ms"] < some["detected_at_ms"]),
        ):
            status, page = await http_json(session, "GET", f"{workers[0].url}/incidents/?limit=1000&{query}")
            assert status == 200, (query, page)
            assert page["items"] == [i for i in all_items if keep(i)], query
        assert some["detected_at"].endswith("Z") and some["detected_at"][:2] == "20"
        # Without a producer (MALFORMED): null producer, segment and seq, as kdiv check says.
        malformed = [i for i in all_items if i["verdict"] == "MALFORMED"]
        assert malformed and all((i["producer"], i["segment"], i["seq"]) == (None, None, None) for i in malformed)

        # The list views answer without their slash too, and the others with one, by redirect.
        for asked, target in (("/incidents?limit=2", "/incidents/?limit=2"), ("/metrics/", "/metrics")):
            async with session.get(workers[0].url + asked, allow_redirects=False) as response:
                assert (response.status, response.headers["Location"]) == (308, target)

        # Health and metrics are per worker; together the metrics count every record.
        counted = 0
        for w in workers:
            status, health = await http_json(session, "GET", f"{w.url}/health")
            assert status == 200 and health["status"] == "ready"
            async with session.get(f"{w.url}/metrics") as response:
                assert response.status == 200
                text = await response.text()
            counted += sum(float(v) for v in re.findall(r"^kdiv_records_validated_total\{[^}]*\} (\S+)$", text, re.M))
            assert "kdiv_recovery_in_progress 0.0" in text
        assert counted == records
        assert injected["loss"] >= 1 and expected.verdicts()["MISSING"] >= 1

        # Errors are JSON with a message.
        for path, code in (
            ("/no-such-view", 404),
            ("/producers/?partition=x", 400),
            ("/producers/?status=BOGUS", 400),
            ("/producers/not-hex/", 400),
            ("/incidents/?limit=0", 400),
            ("/partitions/unwatched/0/", 404),
            ("/partitions/x/y/", 400),
            ("/incidents/?class=BOGUS", 400),
            ("/incidents/?class=OK", 400),
            ("/incidents/?severity=loud", 400),
            ("/incidents/?producer=zz", 400),
            ("/incidents/?since=yesterday", 400),
            ("/incidents/?partition=-1", 400),
            ("/partitions/?scope=bogus", 400),
            ("/producers/?scope=bogus", 400),
        ):
            got, body = await http_json(session, "GET", workers[0].url + path)
            assert got == code, (path, body)
            assert isinstance(body, dict) and body["message"], (path, body)


def state_of(item: dict) -> tuple:
    """What a partition's listing must keep across rebalances (not its owner or lag)."""
    return (item["phase"], item["push_failed"], item["last_offset"], item["records"], item["counts"], item["producers"])


async def settled_listing(session, asked: WorkerProcess, owners: list[WorkerProcess], timeout: float = 60.0) -> dict:
    """partition -> item of `asked`'s /partitions/, once every partition is listed once, with
    its state loaded and its lag known, and exactly `owners` own them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    expected = {w.url for w in owners}
    body: dict | str = {}
    while loop.time() < deadline:
        status, body = await http_json(session, "GET", f"{asked.url}/partitions/")
        if status == 200 and isinstance(body, dict) and not body["unavailable_workers"]:
            items = body["items"]
            by_partition = {item["partition"]: item for item in items}
            if (
                len(items) == PARTITIONS == len(by_partition)
                and {item["worker"] for item in items} == expected
                and not any(item["recovering"] or item["lag"] is None for item in items)
            ):
                return by_partition
        await asyncio.sleep(0.3)
    raise AssertionError(f"{asked.url} never listed every partition settled on {sorted(map(str, expected))}: {body}")


def series(metrics_text: str, name: str) -> dict[int, float]:
    """partition -> value of a per-partition metric."""
    return {
        int(partition): float(value)
        for partition, value in re.findall(rf'^{name}\{{[^}}]*partition="(\d+)"[^}}]*\}} (\S+)$', metrics_text, re.M)
    }


async def assert_visible_as_before(session, topic: str, alive: list[WorkerProcess], before: dict[int, tuple]) -> None:
    """Every worker lists every partition with its state as before, each partition's view
    answers from its owner, and each owner's metrics carry the partition's series."""
    listings = [await settled_listing(session, w, alive) for w in alive]
    for listing in listings:
        assert {p: state_of(item) for p, item in listing.items()} == before
    owner_of = {p: item["worker"] for p, item in listings[0].items()}
    for asked in alive:
        for partition, owner in owner_of.items():
            status, body = await http_json(session, "GET", f"{asked.url}/partitions/{topic}/{partition}/")
            assert status == 200 and isinstance(body, dict), (partition, body)
            assert body["worker"] == owner and state_of(body) == before[partition]
    for w in alive:
        async with session.get(f"{w.url}/metrics") as response:
            text = await response.text()
        mine = {p for p, url in owner_of.items() if url == w.url}
        assert series(text, "kdiv_records_validated_total") == {p: float(before[p][3]) for p in mine}
        assert set(series(text, "kdiv_consumer_lag")) == mine
        assert series(text, "kdiv_partition_recovering") == dict.fromkeys(mine, 0.0)


async def test_every_partition_stays_visible_after_a_takeover_and_a_join(two_workers):
    """No record is written after the first listing: the state must come from the tables."""
    topic, _app_id, workers, _injected = two_workers
    survivor, victim = workers
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        first = await settled_listing(session, survivor, workers)
        before = {p: state_of(item) for p, item in first.items()}
        assert sum(state[3] for state in before.values()) > 0

        victim.sigkill()
        await assert_visible_as_before(session, topic, [survivor], before)

        victim.start()  # joins again with its data dir
        await victim.wait_ready()
        await assert_visible_as_before(session, topic, workers, before)


async def test_a_forwarded_request_passes_the_owners_answer_through():
    """An owner's 404 reaches the client as a 404 with the owner's message; only an owner
    that does not answer at all is a 503."""

    async def not_here(request):
        return web.json_response({"error": "Not Found", "message": "t[1] is not here"}, status=404)

    server_app = web.Application()
    server_app.router.add_get("/partitions/t/1/", not_here)
    async with TestServer(server_app) as server, aiohttp.ClientSession() as client:
        views = Peers.__new__(Peers)
        views.app = type("App", (), {"http_client": client})()
        views._token, views._peer_patterns = "", ()

        asked = SimpleNamespace(path="/partitions/t/1/", query={}, url="/partitions/t/1/")
        owner = server.make_url("/")
        answer = await views.ask(owner, asked)
        assert (answer.status, answer.body) == (404, {"error": "Not Found", "message": "t[1] is not here"})
        await server.close()
        gone = await views.ask(owner, asked)
        assert (gone.status, gone.body) == (None, None)
