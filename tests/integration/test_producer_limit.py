"""A worker fed 200,000 one-record producers stays within KDIV_PRODUCERS_LIMIT: its memory,
saved state and /producers/ pages are bounded, and /health answers meanwhile."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaProducer

from kdiv.div.wire import HEADER_NAME, Kind
from kdiv.state.tables import parse_key
from kdiv.worker.incidents import PRODUCERS_LIMIT
from tests.harness.broker import read_incidents, read_table, wait_until_caught_up
from tests.harness.http import http_json, wait_for_split
from tests.harness.processes import WorkerProcess, free_port
from tests.harness.streams import header

PRODUCERS = 200_000
LIMIT = 20_000
NOW_MS = int(time.time() * 1000)


def guid(n: int) -> bytes:
    return uuid.UUID(int=n + 1).bytes


async def produce_one_record_producers(bootstrap: str, topic: str, producers: range, partitions: int = 1) -> None:
    """One DATA record (segment 0, seq 1) per producer GUID: each is a producer never seen,
    first seen mid-segment (fine after a push), and never seen again."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for partition in range(partitions):
            batch = producer.create_batch()
            for n in producers:
                if n % partitions != partition:
                    continue
                key, value = b"k%d" % n, b"v"
                div = header(Kind.DATA, 0, 1, key, value, guid=guid(n), producer_ts=NOW_MS)
                if batch.append(key=key, value=value, timestamp=None, headers=[(HEADER_NAME, div)]) is None:
                    await producer.send_batch(batch, topic, partition=partition)
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None, headers=[(HEADER_NAME, div)])
            await producer.send_batch(batch, topic, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def probe_health(url: str, latencies: list[float], stop: threading.Event) -> None:
    """GET /health every 100 ms until `stop`, and /producers/ as the dashboard does every 3 s.
    In a thread of its own: the test's event loop is busy producing."""
    last_dashboard = 0.0
    while not stop.is_set():
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
            response.read()
        latencies.append(time.monotonic() - started)
        if started - last_dashboard > 3:
            last_dashboard = started
            with urllib.request.urlopen(f"{url}/producers/?limit=500", timeout=30) as response:
                assert response.status == 200
        stop.wait(0.1)


async def test_200000_one_record_producers_stay_within_the_limit(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(1)
    app_id = f"limit-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "w",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_PRODUCERS_LIMIT": str(LIMIT), "KDIV_BATCH_MAX": "5000"},
    )
    worker.start()
    try:
        await worker.wait_ready()
        baseline = rss_mb(worker.pid)
        latencies: list[float] = []
        stop = threading.Event()
        probing = threading.Thread(target=probe_health, args=(worker.url, latencies, stop), daemon=True)
        probing.start()
        peak = baseline
        await produce_one_record_producers(bootstrap, topic, range(PRODUCERS))
        catching_up = asyncio.create_task(wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=240))
        while not catching_up.done():
            peak = max(peak, rss_mb(worker.pid))
            await asyncio.sleep(0.2)
        await catching_up
        stop.set()
        probing.join(timeout=30)
        after = rss_mb(worker.pid)

        # /health answered all along, while the worker validated and evicted. The bound on the
        # slowest probe leaves room for a shared, loaded 2-core machine.
        assert len(latencies) > 20
        assert max(latencies) < 3.0, sorted(latencies)[-5:]
        assert statistics.median(latencies) < 0.1, statistics.median(latencies)
        print(
            f"\nRSS {baseline:.0f} MB at start, peak {peak:.0f} MB, {after:.0f} MB after; /health over "
            f"{len(latencies)} probes: median {statistics.median(latencies) * 1000:.1f} ms, "
            f"max {max(latencies) * 1000:.1f} ms"
        )
        # The bound proper is the producers tracked and saved (below): 20,000 are about 6 MB.
        # The rest of the growth is the store's and the allocator's (write buffers, batches).
        assert peak - baseline < 200, (baseline, peak)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            status, partitions = await http_json(session, "GET", f"{worker.url}/partitions/")
            assert status == 200 and partitions["items"][0]["producers"] == LIMIT
            # The most recently seen are kept: the last LIMIT GUIDs written.
            status, page = await http_json(session, "GET", f"{worker.url}/producers/?limit=500")
            assert status == 200
            assert (page["total"], len(page["items"])) == (LIMIT, 500)
            kept = {guid(n).hex() for n in range(PRODUCERS - LIMIT, PRODUCERS)}
            assert {item["producer"] for item in page["items"]} <= kept
            assert [item["producer"] for item in page["items"]] == sorted(item["producer"] for item in page["items"])
            status, second = await http_json(
                session, "GET", f"{worker.url}/producers/?limit=500&cursor={page['next_cursor']}"
            )
            assert status == 200 and second["items"][0]["producer"] > page["items"][-1]["producer"]
            status, bad = await http_json(session, "GET", f"{worker.url}/producers/?cursor={topic}/0/nothex")
            assert status == 400 and "cursor" in bad["message"]

        # Saved state: exactly the producers kept, so a restore does not bring the evicted back.
        saved = await read_table(bootstrap, app_id, 1)
        producers_saved = {parse_key(key).guid for key in saved if parse_key(key).guid is not None}
        assert producers_saved == {guid(n) for n in range(PRODUCERS - LIMIT, PRODUCERS)}

        # One incident for the episode, its latest version counting every producer evicted.
        incidents = await read_incidents(bootstrap, app_id)
        limit_incidents = {k: v for k, v in incidents.items() if v[-1].verdict == PRODUCERS_LIMIT}
        assert len(limit_incidents) == 1, list(limit_incidents)
        latest = next(iter(limit_incidents.values()))[-1]
        assert latest.detail.startswith(f"{PRODUCERS - LIMIT} producers evicted since offset "), latest.detail
        assert latest.severity == "warning"
    finally:
        worker.terminate()
    assert worker.problems() == []


async def test_producer_pages_of_two_workers_walk_every_producer_once(bootstrap, topic_factory, tmp_path):
    """Each worker pages through the whole group's producers, in order, each once."""
    partitions = 4
    topic = topic_factory(partitions)
    app_id = f"pages-{uuid.uuid4().hex[:8]}"
    workers = [
        WorkerProcess(name, bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path, web_port=free_port())
        for name in ("w1", "w2")
    ]
    try:
        for w in workers:
            w.start()
        await asyncio.gather(*(w.wait_ready() for w in workers))
        await produce_one_record_producers(bootstrap, topic, range(200), partitions)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=workers, timeout=90)
        expected = sorted((topic, n % partitions, guid(n).hex()) for n in range(200))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await wait_for_split(session, workers, partitions)
            for w in workers:
                walked, cursor, pages = [], None, 0
                while True:
                    query = "limit=7" + (f"&cursor={cursor}" if cursor else "")
                    status, page = await http_json(session, "GET", f"{w.url}/producers/?{query}")
                    assert status == 200, page
                    assert page["total"] == 200 and page["unavailable_workers"] == []
                    walked += [(i["topic"], i["partition"], i["producer"]) for i in page["items"]]
                    pages += 1
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                assert walked == expected
                assert pages == 29  # 28 full pages and 4 items
    finally:
        for w in workers:
            w.terminate()
