"""A real worker reading incidents over their bounds from its incidents topic (anyone can write
there): they are counted and named, never held, so they do not swell the worker; incidents
within the bounds are held, and no view's answer grows past its documented size."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaProducer

from kdiv.incident.bounds import MAX_CHARS
from kdiv.incident.shape import Incident
from kdiv.worker.overview import MAX_OVERVIEW_BYTES
from kdiv.worker.web.incidents import MAX_PAGE_BYTES
from tests.harness.broker import exact_end_offsets
from tests.harness.http import http_json, wait_for_incidents_read
from tests.harness.processes import WorkerProcess, free_port

OVERSIZED = 150  # as measured before the bounds: 150 of 900 KB took a worker from 96 to 363 MB
NOT_A_GUID = 5
LARGEST_HELD = 100  # incidents at the bounds, in the costliest characters: 49 KB each as JSON
SMILE = "\U0001f600"
BASE = Incident(
    "orders", 0, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)
# The views whose answers grow with what the worker holds, and their documented bounds (the
# items' bound plus room for a page's own fields).
ANSWER_BOUNDS = {
    "/incidents/?limit=1000": MAX_PAGE_BYTES + 64 * 1024,
    "/overview/?groups_limit=500": MAX_OVERVIEW_BYTES,
    "/producers/?limit=1000": 2 << 20,
    "/partitions/": 1 << 20,
    "/changefeeds/": 1 << 20,
    "/routes/": 1 << 20,
}


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.M)
    assert match is not None, status
    return int(match.group(1)) * 1024


def bad_incident_records(metrics: str) -> float:
    found = re.search(r"^kdiv_bad_incident_records(?:_total)? (\S+)$", metrics, re.M)
    assert found is not None, metrics[:2000]
    return float(found.group(1))


def oversized(n: int) -> bytes:
    """A well-formed incident but for its detail of 900 KB: over the detail's bound and the record's."""
    return json.dumps({**BASE.to_json(), "seq": 1000 + n, "detail": "x" * 900_000}).encode()


def not_a_guid(n: int) -> bytes:
    return json.dumps({**BASE.to_json(), "seq": 2000 + n, "producer": f"producer-{n}"}).encode()


def largest(n: int) -> Incident:
    return Incident(
        "orders", 0, "cd" * 16, 1, 3000 + n, "CORRUPT", n, "fatal",
        f"{n:05}" + SMILE * (MAX_CHARS["detail"] - 5), 1_700_000_000_000, 1_700_000_000_500 + n,
    )  # fmt: skip


async def test_incidents_over_the_bounds_are_never_held_and_answers_stay_bounded(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(1)
    app_id = f"incbounds{uuid.uuid4().hex[:8]}"
    incidents = f"{app_id}-incidents"
    worker = WorkerProcess(
        "incbounds", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path, web_port=free_port()
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=2 << 20)
    try:
        worker.start()
        await worker.wait_ready()
        await producer.start()
        assert worker.pid is not None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await wait_for_incidents_read(session, worker, await exact_end_offsets(bootstrap, incidents))
            before = rss_bytes(worker.pid)

            await producer.send_and_wait(incidents, BASE.value, BASE.key, partition=0)
            for n in range(OVERSIZED):
                await producer.send_and_wait(incidents, oversized(n), b"big-%d" % n, partition=0)
            for n in range(NOT_A_GUID):
                await producer.send_and_wait(incidents, not_a_guid(n), b"guid-%d" % n, partition=0)
            ends = await exact_end_offsets(bootstrap, incidents)
            await wait_for_incidents_read(session, worker, ends, timeout=60)
            after = rss_bytes(worker.pid)

            status, metrics = await http_json(session, "GET", f"{worker.url}/metrics")
            assert status == 200 and isinstance(metrics, str)
            assert bad_incident_records(metrics) == OVERSIZED + NOT_A_GUID
            status, page = await http_json(session, "GET", f"{worker.url}/incidents/?limit=1000")
            assert status == 200 and isinstance(page, dict)
            assert [(i["seq"], i["detail"]) for i in page["items"]] == [(BASE.seq, BASE.detail)]
            log = worker.log_text()
            first = min(ends.values()) - OVERSIZED - NOT_A_GUID  # the offset of the first oversized one
            assert f"unreadable incident at {incidents}[0]@{first}: incident of 900," in log
            assert f"unreadable incident at {incidents}[0]@{first + OVERSIZED}: incident field producer" in log
            # Not held, so the worker's memory hardly moved (before the bounds it grew 3.8 times).
            print(f"worker RSS after {OVERSIZED} oversized incidents / before: {after / before:.2f}")
            assert after / before < 1.5, (before, after)

            # The largest incidents the bounds let through are held; the answers stay bounded.
            for n in range(LARGEST_HELD):
                incident = largest(n)
                await producer.send_and_wait(incidents, incident.value, incident.key, partition=0)
            await wait_for_incidents_read(session, worker, await exact_end_offsets(bootstrap, incidents), timeout=60)
            sizes = {}
            for path, bound in ANSWER_BOUNDS.items():
                async with session.get(f"{worker.url}{path}") as response:
                    body = await response.read()
                assert response.status == 200, (path, body[:300])
                sizes[path] = len(body)
                assert len(body) <= bound, (path, len(body), bound)
            print("answer sizes:", sizes)
            status, page = await http_json(session, "GET", f"{worker.url}/incidents/?limit=1000")
            assert isinstance(page, dict)
            assert page["total"] == LARGEST_HELD + 1 and page["bytes_cut"] is True
            assert 0 < len(page["items"]) < LARGEST_HELD and page["next_offset"] == len(page["items"])
            status, metrics = await http_json(session, "GET", f"{worker.url}/metrics")
            assert isinstance(metrics, str) and bad_incident_records(metrics) == OVERSIZED + NOT_A_GUID
    finally:
        await producer.stop()
        worker.terminate()
