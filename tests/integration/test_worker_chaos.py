"""The live validator under crashes and rebalances, end to end on the real broker.

Real worker processes (`faust -A kdiv.worker.main worker`) validate a topic written at a steady
rate with faults injected, while the test SIGKILLs, restarts (with or without the data
dir, so state comes from RocksDB or from the changelog) and adds workers. The oracle is
the pure validator over the topic's final content: the incidents topic must hold exactly
its incidents (no missed fault, no false alarm: a replayed record must not become a
DUPLICATE, a lost state effect must not become a MISSING), and the saved state must be
the oracle's state.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid

import pytest

from tests.harness.broker import (
    committed_offsets,
    dump_topics,
    exact_end_offsets,
    produce_with_faults,
    read_incidents,
    read_table,
    record_offsets,
    wait_until_caught_up,
)
from tests.harness.http import owners, router_view
from tests.harness.oracle import incident_differences, latest, oracle, state_differences
from tests.harness.processes import WorkerProcess, free_port

pytestmark = pytest.mark.broker

PARTITIONS = 4
# The seed of the kill schedule; set KDIV_CHAOS_SEED to replay a run.
SEED = int(os.environ.get("KDIV_CHAOS_SEED") or random.randrange(1 << 30))


@pytest.fixture
def workers(bootstrap, tmp_path):
    """`workers(name, topic, app_id, **options) -> WorkerProcess` (not started); every
    worker is stopped after the test, and its log is kept under tmp_path."""
    made: list[WorkerProcess] = []

    def make(name: str, topic: str, app_id: str, **options) -> WorkerProcess:
        worker = WorkerProcess(name, bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path, **options)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.terminate(timeout=10)


def unique_app_id(test: str) -> str:
    return f"kdiv-chaos-{test}-{uuid.uuid4().hex[:8]}"


async def dump_evidence(bootstrap: str, topic: str, app_id: str, directory) -> None:
    """Keep the topics and committed offsets for a post mortem: the test's topics are
    deleted after it."""
    directory = directory / "topics"
    await dump_topics(bootstrap, [topic, f"{app_id}-incidents", f"{app_id}-state-p{PARTITIONS}-changelog"], directory)
    offsets = await committed_offsets(bootstrap, app_id, topic, range(PARTITIONS))
    (directory / "committed.json").write_text(json.dumps(offsets))


async def assert_matches_oracle(bootstrap: str, topic: str, app_id: str, workers: list[WorkerProcess]):
    try:
        return await _assert_matches_oracle(bootstrap, topic, app_id, workers)
    except AssertionError:
        await dump_evidence(bootstrap, topic, app_id, workers[0].log_path.parent)
        raise


async def _assert_matches_oracle(bootstrap: str, topic: str, app_id: str, workers: list[WorkerProcess]):
    expected = await oracle(bootstrap, topic)
    live = await read_incidents(bootstrap, app_id)
    # The faults are really there: the test cannot pass on a clean topic.
    verdicts = expected.verdicts()
    assert {"MISSING", "DUPLICATE", "CORRUPT"} <= set(verdicts), verdicts
    assert expected.severities()["fatal"] > 0, expected.severities()

    problems = incident_differences(expected, live)
    tails = "\n".join(w.log_tail(15) for w in workers)
    assert not problems, "live incidents differ from the oracle's:\n" + "\n".join(problems) + "\n" + tails
    assert latest(live) == expected.incidents

    table = await read_table(bootstrap, app_id, PARTITIONS)
    state_problems = state_differences(expected, table)
    assert not state_problems, "saved state differs from the oracle's:\n" + "\n".join(state_problems[:25])
    return expected, live


@pytest.mark.parametrize(
    ("guarantee", "kill_count"),
    [
        ("at_least_once", 12),
        # Transactional commits (offsets, state, incidents in one transaction) under the same
        # kills: a transaction open at a SIGKILL is aborted and its unit done again.
        ("exactly_once", 6),
    ],
)
async def test_sigkill_under_load_reports_exactly_the_injected_faults(
    bootstrap, topic_factory, workers, guarantee, kill_count
):
    print(f"KDIV_CHAOS_SEED={SEED}")
    rng = random.Random(SEED)
    topic = topic_factory(PARTITIONS)
    app_id = unique_app_id("sigkill")
    worker = workers("w1", topic, app_id, env={"KDIV_PROCESSING_GUARANTEE": guarantee})
    worker.start()
    await worker.wait_ready()

    timeline = asyncio.create_task(
        record_offsets(bootstrap, app_id, topic, PARTITIONS, worker.log_path.parent / "offsets.log")
    )
    try:
        stop = asyncio.Event()
        producer = asyncio.create_task(produce_with_faults(bootstrap, topic, stop, rate=100, seed=SEED))
        started = time.monotonic()
        kills = []  # (ready when killed, kept data dir)
        restarts = []  # seconds from a restart until the worker was ready, when it got there
        try:
            for i in range(kill_count):
                if i % 2 == 0:
                    # Mid-processing: after recovery, somewhere in the stream of batches.
                    restarts.append(await worker.wait_ready())
                    await asyncio.sleep(rng.uniform(0.0, 2.5))
                else:
                    # Anywhere: often during start-up, group join or changelog recovery.
                    await asyncio.sleep(rng.uniform(0.2, 4.0))
                ready = worker.ready
                worker.sigkill()
                # Some runs restore from the changelog.
                keep = rng.random() < 0.6 if i not in (3, kill_count - 4) else False
                kills.append((ready, keep))
                worker.restart(keep_data=keep)
            await worker.wait_ready()
            await asyncio.sleep(2)  # load on the last incarnation too
        finally:
            stop.set()
            done = await producer
        chaos_s = time.monotonic() - started
        try:
            caught_up_s = await wait_until_caught_up(bootstrap, app_id, topic, timeout=60, workers=[worker])
        except AssertionError:
            await dump_evidence(bootstrap, topic, app_id, worker.log_path.parent)
            raise
        expected, live = await assert_matches_oracle(bootstrap, topic, app_id, [worker])
    finally:
        timeline.cancel()
    assert worker.alive, worker.log_tail()
    replays = sum(len(v) - 1 for v in live.values())
    report = (
        f"seed {SEED}: {expected.records} records ({dict(done)}) in {chaos_s:.1f} s, "
        f"{len(kills)} SIGKILLs ({sum(r for r, _ in kills)} after ready, "
        f"{sum(not k for _, k in kills)} with the data dir deleted), restarts ready in "
        f"{', '.join(f'{s:.1f}' for s in restarts)} s, caught up {caught_up_s:.1f} s after the load; "
        f"{len(expected.incidents)} incidents {dict(expected.verdicts())}, {replays} re-emitted by replays"
    )
    print(report)
    assert sum(r for r, _ in kills) >= kill_count // 2, f"too few kills hit a running worker: {kills}"


async def wait_for_assignment(group: list[WorkerProcess], topic: str, changelog: str, timeout: float = 60.0):
    """Wait until every live worker reports the same assignment, made for exactly the live
    workers (the group has settled after a join or a death), with each source and table
    partition owned by exactly one of them; returns (source, table) owners.

    Faust's assignor is sticky: with 4 partitions, a third worker may own none (2/2/0)."""
    deadline = time.monotonic() + timeout
    urls = {w.url for w in group}
    last: object = None
    while True:
        try:
            views = [await router_view(w) for w in group]
        except Exception as exc:  # a worker's web server is not up yet
            last = repr(exc)
        else:
            tables, topics = views[0]
            source, table = owners(topics, topic), owners(tables, changelog)
            agreed = all(v == views[0] for v in views)
            single = all(len(source.get(p, ())) == 1 and len(table.get(p, ())) == 1 for p in range(PARTITIONS))
            members = set(tables) | set(topics)
            if agreed and single and members == urls:
                return source, table
            last = views
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no single-owner assignment over {sorted(map(str, urls))} after {timeout:.0f} s: {last}"
            )
        await asyncio.sleep(0.25)


async def test_rebalance_with_workers_joining_and_dying(bootstrap, topic_factory, workers):
    print(f"KDIV_CHAOS_SEED={SEED}")
    topic = topic_factory(PARTITIONS)
    app_id = unique_app_id("rebalance")
    changelog = f"{app_id}-state-p{PARTITIONS}-changelog"

    def new_worker(name: str) -> WorkerProcess:
        return workers(name, topic, app_id, web_port=free_port(), env={"KDIV_STANDBY_REPLICAS": "1"})

    a, b = new_worker("a"), new_worker("b")
    a.start()
    b.start()
    await asyncio.gather(a.wait_ready(), b.wait_ready())
    await wait_for_assignment([a, b], topic, changelog)
    timeline = asyncio.create_task(
        record_offsets(bootstrap, app_id, topic, PARTITIONS, a.log_path.parent / "offsets.log")
    )
    try:
        stop = asyncio.Event()
        producer = asyncio.create_task(produce_with_faults(bootstrap, topic, stop, rate=100, seed=SEED))
        try:
            await asyncio.sleep(5)
            c = new_worker("c")
            c.start()
            await c.wait_ready()
            await wait_for_assignment([a, b, c], topic, changelog)
            await asyncio.sleep(4)

            # Kill a worker that owns partitions, mid-load; time until its partitions move on.
            source, _table = await wait_for_assignment([a, b, c], topic, changelog)
            victim = next(w for w in (a, b, c) if any(us == [w.url] for us in source.values()))
            orphaned = sorted(p for p, us in source.items() if us == [victim.url])
            before = await committed_offsets(bootstrap, app_id, topic, orphaned)
            killed_at = victim.sigkill()
            survivors = [w for w in (a, b, c) if w is not victim]
            while True:
                now = await committed_offsets(bootstrap, app_id, topic, orphaned)
                if all(now[p] > before[p] for p in orphaned):
                    takeover_s = time.monotonic() - killed_at
                    break
                assert time.monotonic() - killed_at < 60, f"no takeover of {orphaned} in 60 s: {before} -> {now}"
                await asyncio.sleep(0.1)
            await asyncio.sleep(3)  # load after the takeover
        finally:
            stop.set()
            done = await producer

        try:
            caught_up_s = await wait_until_caught_up(bootstrap, app_id, topic, timeout=60, workers=survivors)
        except AssertionError:
            await dump_evidence(bootstrap, topic, app_id, a.log_path.parent)
            raise
        # Every source and table partition is owned by exactly one live worker.
        source, table = await wait_for_assignment(survivors, topic, changelog)
        expected, _live = await assert_matches_oracle(bootstrap, topic, app_id, [a, b, c])
    finally:
        timeline.cancel()
    for worker in (a, b, c):
        assert not worker.problems(), f"{worker.name}: " + "\n".join(worker.problems()[:20])
    ends = await exact_end_offsets(bootstrap, topic)
    report = (
        f"seed {SEED}: {expected.records} records ({dict(done)}), end offsets {ends}; "
        f"killed {victim.name} owning {orphaned}: takeover {takeover_s:.1f} s (session 3 s / heartbeat 0.3 s, "
        f"1 standby); caught up {caught_up_s:.1f} s after the load; final owners {source} / {table}; "
        f"{len(expected.incidents)} incidents {dict(expected.verdicts())}"
    )
    print(report)
