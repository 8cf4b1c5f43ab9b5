"""The batch path validates a large fetch in slices, and the event loop is served between them."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import Kind
from kdiv.state.values import StateValues
from kdiv.worker import divtopics
from kdiv.worker import turns as worker_turns
from kdiv.worker.divtopics import DivTopics
from kdiv.worker.live import LiveValidation
from tests.harness.streams import NOW, Log


def new_producers_fetch(producers: int) -> list:
    """A START_OF_SEGMENT and a DATA record of each of `producers` new producers."""
    rng, log = random.Random(3), Log("orders")
    records = []
    for _ in range(producers):
        records += log.add_outgoing(DivStamper(rng.randbytes(16)).data("orders", 0, b"k", b"v", NOW))
    return records


def stand_in(**attributes: Any) -> Any:
    """What the batch path calls of a collaborator these tests do not exercise."""
    return SimpleNamespace(**attributes)


def new_div_topics(live: LiveValidation, touched: list, reported: list | None = None) -> DivTopics:
    none = stand_in
    return DivTopics(
        live=live,
        unit=none(
            touch=touched.append,
            add_incidents=lambda key, incidents: (reported if reported is not None else []).extend(incidents),
        ),
        runs=none(producers_in_runs=lambda topic, partition: set()),
        stats=none(),
        clock=lambda: NOW,
        tables={},
        partition_counts={},
        rewinds=none(checks_leader_epochs=False),
        note_framing=lambda topic, partition, records: None,
    )


def new_live() -> LiveValidation:
    live = LiveValidation(DataIntegrityValidator(), StateValues(7))
    live.load("orders", 0, [])
    return live


def test_a_large_fetch_lets_the_loop_run_between_slices_and_validates_as_in_one_go(monkeypatch):
    monkeypatch.setattr(worker_turns, "TURN_S", 0.0)  # a turn after every slice
    records = new_producers_fetch(3 * divtopics.SLICE_RECORDS)
    whole = new_live()
    whole.process_run("orders", 0, records, 0, NOW, set(), [])
    sliced, touched = new_live(), []
    path = new_div_topics(sliced, touched)
    turns = []

    async def run() -> None:
        async def tick() -> None:
            while True:
                turns.append(len(sliced.validator.partition("orders", 0).tracker.segments))
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        assert (await path.take(("orders", 0), records, 0, NOW)).stopped_at is None
        ticker.cancel()

    asyncio.run(run())
    # The loop ran while the fetch was half validated, not only before and after it.
    assert any(0 < producers < len(records) // 2 for producers in turns), turns
    want, got = whole.validator.partition("orders", 0), sliced.validator.partition("orders", 0)
    assert (got.records, got.last_offset, got.counts) == (want.records, want.last_offset, want.counts)
    assert dict(got.tracker.segments.items()) == dict(want.tracker.segments.items())
    assert touched == [("orders", 0)]


def test_the_loop_runs_between_partitions_each_shorter_than_a_slice(monkeypatch):
    # One budget across partitions: a fetch of many partitions, each under a slice, is no
    # single turn (100 such partitions made turns of 0.2-0.6 s).
    monkeypatch.setattr(worker_turns, "TURN_S", 0.0)
    live = LiveValidation(DataIntegrityValidator(), StateValues(7))
    for p in range(20):
        live.load("orders", p, [])
    fetch = new_producers_fetch(10)  # taken as each partition's (only its offsets count here)
    fetches = dict.fromkeys(range(20), fetch)
    path = new_div_topics(live, [])
    seen: list[int] = []

    async def run() -> None:
        async def tick() -> None:
            while True:
                seen.append(sum(live.validator.partition("orders", p).records for p in range(20)))
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        for p, records in fetches.items():
            assert (await path.take(("orders", p), records, 0, NOW)).stopped_at is None
        ticker.cancel()

    asyncio.run(run())
    between = {n for n in seen if 0 < n < 20 * 20}
    assert len(between) >= 10, seen


def test_a_partition_revoked_during_a_pause_is_left_alone(monkeypatch):
    monkeypatch.setattr(worker_turns, "TURN_S", 0.0)
    records = new_producers_fetch(divtopics.SLICE_RECORDS)
    live, touched = new_live(), []
    path = new_div_topics(live, touched)

    async def run() -> None:
        async def revoke() -> None:  # runs at the first pause
            live.unload("orders", 0)

        revoking = asyncio.create_task(revoke())
        taken = await path.take(("orders", 0), records, 0, NOW)
        assert (taken.stopped_at, taken.commit_first) == (0, False)  # not taken: read again
        await revoking

    asyncio.run(run())
    assert not live.is_loaded("orders", 0) and touched == []


def test_slices_quicker_than_the_bound_run_on_without_a_turn(monkeypatch):
    monkeypatch.setattr(worker_turns, "TURN_S", 3600.0)
    records = new_producers_fetch(3 * divtopics.SLICE_RECORDS)
    live, touched = new_live(), []
    path = new_div_topics(live, touched)
    turns = []

    async def run() -> None:
        async def tick() -> None:
            while True:
                turns.append(len(live.validator.partition("orders", 0).tracker.segments))
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        await path.take(("orders", 0), records, 0, NOW)
        ticker.cancel()

    asyncio.run(run())
    assert all(producers in (0, len(records) // 2) for producers in turns), turns


def test_a_push_marker_first_in_a_batch_waits_for_what_came_before_it_to_commit():
    """Records of a previous batch still pending, a fetch opening with a push marker: the
    marker is judged only after they are written, whatever its place in the batch."""
    live, touched = new_live(), []
    stamper = DivStamper(random.Random(5).randbytes(16))
    log = Log("orders")
    before = log.add_outgoing(stamper.data("orders", 0, b"k", b"v", NOW))
    path = new_div_topics(live, touched)
    assert asyncio.run(path.take(("orders", 0), before, 0, NOW)).stopped_at is None
    marker = log.add_outgoing(stamper.control("orders", 0, Kind.START_OF_PUSH, NOW))
    taken = asyncio.run(path.take(("orders", 0), marker, 0, NOW))
    assert (taken.stopped_at, taken.commit_first) == (0, True)


def test_a_fault_judged_one_by_one_last_in_a_fetch_is_reported():
    """A broken header whose kind byte reads as a push marker leaves the bulk path and is
    judged on its own; last in its fetch, its MALFORMED incident is still added to the unit
    (it was dropped with the fetch's end)."""
    live, touched, reported = new_live(), [], []
    stamper = DivStamper(random.Random(6).randbytes(16))
    log = Log("orders")
    records = log.add_outgoing(stamper.data("orders", 0, b"k", b"v", NOW))
    broken = bytes([0x71, int(Kind.END_OF_PUSH)]) + random.Random(7).randbytes(33)
    records.append(log.add(b"k2", b"v2", (("div", broken),)))
    path = new_div_topics(live, touched, reported)
    assert asyncio.run(path.take(("orders", 0), records, 0, NOW)).stopped_at is None
    assert [(i.verdict, i.offset) for i in reported] == [("MALFORMED", records[-1].offset)]
