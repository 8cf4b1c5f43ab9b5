"""The dev stack's shapes under a running worker for minutes: the test that would have caught a
worker that validated its first batch and then nothing while every signal said "ready".

A 4-partition demo topic with every fault class injected and producers restarted, its compacted
topic beside it, and a 2-partition topic (its own state table, as the dev stack's changefeed
has) written steadily; one worker watches all three. Throughout, every partition keeps pace
(its committed offset never falls behind the log end of `PACE_S` earlier) and /health says
ready with no stall; afterwards the worker's incidents per class on the demo topic equal
`kdiv check` on a dump of the same records.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter

import aiohttp
import pytest

from kdiv.dev.demo import COMPACTED_TOPIC_CONFIG, ensure_topic, run_demo
from kdiv.writer import DivWriter
from tests.harness.broker import (
    committed_offsets,
    dump_topics,
    exact_end_offsets,
    read_incidents,
    wait_until_caught_up,
)
from tests.harness.processes import WorkerProcess, free_port

# alone: it measures pace against a fixed bound, so it runs beside the cluster's tests (about
# half a core), not in the parallel phase (tests/conftest.py BESIDE_THE_CLUSTER).
pytestmark = [pytest.mark.broker, pytest.mark.alone]

# How long the shapes run: in the suite two minutes, four of the demo's producer restarts and
# four pace windows; KDIV_TEST_SOAK_S runs it longer.
SOAK_S = float(os.environ.get("KDIV_TEST_SOAK_S", "120"))
# A partition's committed offset must reach, at each sample, the log end of this long before.
PACE_S = 30.0
SAMPLE_S = 5.0


async def _health(url: str) -> dict:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"{url}/health") as response,
    ):
        return await response.json()


async def _write_steadily(bootstrap: str, topic: str, stop: asyncio.Event) -> None:
    async with await DivWriter.start(bootstrap) as writer:
        i = 0
        while not stop.is_set():
            await writer.send(topic, b"v%d" % i, key=b"k%d" % (i % 50))
            i += 1
            await asyncio.sleep(0.02)
        await writer.end_segments(topic)


def offline_incidents(lines: list[dict]) -> Counter:
    """`kdiv check`'s faults per class as the worker writes them: its MISSING lines once per gap
    (a gap inside a push is a MISSING line per later record, one incident in the worker:
    docs/incidents.md)."""
    counted: Counter = Counter()
    gaps = set()
    for line in lines:
        if line["verdict"] in ("OK", "UNTRACKED"):
            continue
        gap = line.get("gap")
        if line["verdict"] == "MISSING" and gap:
            identity = (line["partition"], line["producer"], gap["segment"], gap["first"], gap["found_offset"])
            if identity in gaps:
                continue
            gaps.add(identity)
        counted[line["verdict"]] += 1
    return counted


async def test_the_dev_stack_shapes_keep_pace_for_minutes_and_match_kdiv_check(bootstrap, topic_factory, tmp_path):
    demo = topic_factory(4)
    small = topic_factory(2)
    compacted = f"{demo}-compacted"
    await ensure_topic(bootstrap, compacted, 4, config=COMPACTED_TOPIC_CONFIG)
    topics = {demo: 4, small: 2, compacted: 4}
    worker = WorkerProcess(
        "soak",
        bootstrap=bootstrap,
        topics=list(topics),
        app_id="soak-" + demo[-8:],
        workdir=tmp_path,
        web_port=free_port(),
    )
    stop = asyncio.Event()
    try:
        worker.start()
        await worker.wait_ready()
        writing = asyncio.gather(
            run_demo(
                bootstrap,
                demo,
                4,
                rate=200,
                fault_every_s=2,
                duration_s=SOAK_S,
                writers=3,
                restart_every_s=30,
                compacted_topic=compacted,
            ),
            _write_steadily(bootstrap, small, stop),
        )
        loop = asyncio.get_running_loop()
        ends_seen: list[tuple[float, dict[tuple[str, int], int]]] = []
        behind, unready = [], []
        started = loop.time()
        while loop.time() - started < SOAK_S:
            await asyncio.sleep(SAMPLE_S)
            now = loop.time()
            ends, committed = {}, {}
            for topic, partitions in topics.items():
                for p, end in (await exact_end_offsets(bootstrap, topic)).items():
                    ends[(topic, p)] = end
                for p, offset in (await committed_offsets(bootstrap, worker.app_id, topic, range(partitions))).items():
                    committed[(topic, p)] = offset
            ends_seen.append((now, ends))
            earlier = [e for at, e in ends_seen if now - at >= PACE_S]
            if earlier:
                for key, end in earlier[-1].items():
                    if committed.get(key, -1) < end:
                        behind.append((round(now - started), key, committed.get(key), end))
            health = await _health(worker.url)
            if health["status"] != "ready" or health["stalled"]:
                unready.append((round(now - started), health["status"], health["reasons"]))
        stop.set()
        await writing
        assert behind == [], behind[:10]
        assert unready == [], unready[:10]

        for topic in topics:
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=90)
        # The views tell the truth once caught up: no lag, no stall, ready.
        await asyncio.sleep(2 * SAMPLE_S)
        health = await _health(worker.url)
        assert (health["status"], health["stalled"], health["progress"]["lag"]) == ("ready", [], 0), health

        # The worker's incidents per class on the demo topic, against kdiv check on a dump.
        (dump,) = await dump_topics(bootstrap, [demo], tmp_path / "dump")
        checked = subprocess.run(
            [sys.executable, "-m", "kdiv.cli", "check", str(dump)], capture_output=True, text=True, timeout=300
        )
        assert checked.returncode in (0, 1), checked.stderr
        offline = offline_incidents([json.loads(line) for line in checked.stdout.splitlines()])
        incidents = await read_incidents(bootstrap, worker.app_id)
        live = Counter(versions[-1].verdict for versions in incidents.values() if versions[-1].topic == demo)
        assert offline and live == offline, (live, offline)
        assert worker.alive, worker.log_tail()
    finally:
        stop.set()
        worker.terminate()
