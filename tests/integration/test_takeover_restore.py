"""A takeover restores the whole state before it says ready, and judges nothing before: a
worker's state of 9,000 producer-partitions on 30 partitions, taken over after a SIGKILL by a
worker without its data directory, while every producer writes its next record.

A worker that judged those records against half a state would report their producers'
records as MISSING or UNREGISTERED_PRODUCER (their earlier records unknown to it); one that
said ready before its state was whole would list fewer producers than were saved.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aiohttp
from aiokafka import AIOKafkaProducer

from kdiv.div.wire import HEADER_NAME, Kind
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.http import http_json
from tests.harness.processes import WorkerProcess, free_port
from tests.harness.streams import header

PARTITIONS = 30
PRODUCERS = 300  # per partition


def guid(partition: int, n: int) -> bytes:
    return uuid.UUID(int=partition * 100_000 + n + 1).bytes


async def write_pass(bootstrap: str, topic: str, seq: int) -> None:
    """Each producer's record `seq` of segment 0 (0: START_OF_SEGMENT), a batch a partition."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=1 << 20)
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            batch = producer.create_batch()
            for n in range(PRODUCERS):
                key, value = b"k%d" % n, b"v%d" % seq
                kind = Kind.START_OF_SEGMENT if seq == 0 else Kind.DATA
                stamp = header(kind, 0, seq, key, value, guid=guid(partition, n))
                batch.append(key=key, value=value, timestamp=None, headers=[(HEADER_NAME, stamp)])
            await (await producer.send_batch(batch, topic, partition=partition))
    finally:
        await producer.stop()


async def watch_health(url: str, seen: list[tuple[float, str, int | None]], stop: asyncio.Event) -> None:
    """/health every 0.2 s; at each `ready`, the producers /partitions/ lists."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while not stop.is_set():
            try:
                _, health = await http_json(session, "GET", f"{url}/health")
                status = health["status"] if isinstance(health, dict) else "?"
                producers = None
                if status == "ready":
                    _, listed = await http_json(session, "GET", f"{url}/partitions/")
                    assert isinstance(listed, dict), listed
                    producers = sum(int(item.get("producers") or 0) for item in listed["items"])
                seen.append((time.monotonic(), status, producers))
            except (aiohttp.ClientError, TimeoutError):
                seen.append((time.monotonic(), "unreachable", None))
            await asyncio.sleep(0.2)


async def test_a_takeover_restores_every_producer_before_it_is_ready_and_judges_nothing_before(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(PARTITIONS)
    app_id = f"takeover-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path, web_port=free_port()
    )
    worker.start()
    stop = asyncio.Event()
    try:
        await worker.wait_ready(timeout=120)
        await write_pass(bootstrap, topic, 0)
        await write_pass(bootstrap, topic, 1)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=180)

        worker.sigkill()
        worker.restart(keep_data=False)
        seen: list[tuple[float, str, int | None]] = []
        assert worker.url is not None
        watching = asyncio.create_task(watch_health(worker.url, seen, stop))
        # Every producer's next record, written while the new worker restores.
        await write_pass(bootstrap, topic, 2)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=240)
        stop.set()
        await watching

        ready = [producers for _, status, producers in seen if status == "ready"]
        assert ready, f"never ready: {sorted({status for _, status, _ in seen})}"
        assert set(ready) == {PARTITIONS * PRODUCERS}, sorted(set(ready))  # ready only when whole
        assert await read_incidents(bootstrap, app_id) == {}
        log = worker.log_text(current_run_only=True)
        assert "restore in bulk:" in log, worker.log_tail()
        assert not worker.problems(), worker.problems()
    finally:
        stop.set()
        worker.terminate()
