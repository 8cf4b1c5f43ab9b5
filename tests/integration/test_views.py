"""The web views of two real workers sharing a topic: any worker answers for all."""

from __future__ import annotations

import asyncio
import re
import uuid

import aiohttp
import pytest

from tests.harness.broker import exact_end_offsets, produce_with_faults, read_incidents, wait_until_caught_up
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
        stop = asyncio.Event()
        producing = asyncio.create_task(produce_with_faults(bootstrap, topic, stop, rate=300, fault_every=15))
        await asyncio.sleep(3)
        stop.set()
        injected = await producing
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
        guid = producers[0][1]["items"][0]["producer"]
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
        status, first = await http_json(session, "GET", f"{workers[0].url}/incidents/?limit=2")
        assert len(first["items"]) == 2 and first["next_offset"] == 2
        status, second = await http_json(session, "GET", f"{workers[0].url}/incidents/?limit=2&offset=2")
        page_of = lambda page: {(i["partition"], i["offset"], i["verdict"]) for i in page["items"]}  # noqa: E731
        assert len(second["items"]) == 2 and page_of(second).isdisjoint(page_of(first))

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
        ):
            got, body = await http_json(session, "GET", workers[0].url + path)
            assert got == code, (path, body)
            assert isinstance(body, dict) and body["message"], (path, body)
