"""The pipeline audit live, on a real broker: faulty processors between two topics, rebalancing
under load. The worker must name exactly the records they dropped (LOST) and wrote twice
(DUPLICATED), and declare no loss for a processor that is merely slow."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp

from kdiv.dev.processor import ProcessorLedger
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.browser import dashboard
from tests.harness.pipeline import processor_pair, produce_traced
from tests.harness.processes import WorkerProcess, free_port

GRACE_S = 2.0


async def routes_view(worker: WorkerProcess) -> dict:
    async with aiohttp.ClientSession() as session, session.get(f"{worker.url}/routes/") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def wait_all_judged(worker: WorkerProcess, traced: int, sink_copies: int, timeout: float = 90.0) -> dict:
    """Until every traced record has a verdict (delivered or lost) in /routes/ and every copy
    the processors wrote was observed."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        view = await routes_view(worker)
        (route,) = view["routes"]
        (hop,) = route["hops"]
        if (
            route["delivered"] + hop["lost"] >= traced
            and route["open_traces"] == 0
            and hop["observed_out"] >= sink_copies
        ):
            # One more judging round (each flush judges) for copies observed last.
            await asyncio.sleep(2)
            return await routes_view(worker)
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"not all {traced} traces judged ({sink_copies} copies written) in {timeout} s: {view}\n"
                f"{worker.log_tail(5)}"
            )
        await asyncio.sleep(0.5)


def audit_worker(bootstrap, source, sink, group, tmp_path) -> WorkerProcess:
    app_id = f"audit{uuid.uuid4().hex[:8]}"
    return WorkerProcess(
        "audit",
        bootstrap=bootstrap,
        topics=[],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={
            "KDIV_ROUTES": f"orders={source}>{group}>{sink}",
            "KDIV_TRACE_GRACE_S": str(GRACE_S),
            "KDIV_TRACE_OFFSETS_POLL_S": "0.5",
            "KDIV_TRACE_PARTITIONS": "2",
            "KDIV_TRACE_SAMPLING": "*=1",
        },
    )


async def trace_incidents(bootstrap: str, app_id: str, verdict: str) -> set[tuple[int, int]]:
    """The source (partition, offset) of every incident of `verdict`; for DUPLICATED, of the
    record at the hop's input whose output has several copies."""
    incidents = await read_incidents(bootstrap, app_id)
    return {(v[-1].partition, v[-1].offset) for v in incidents.values() if v[-1].verdict == verdict}


async def dashboard_shows(worker: WorkerProcess, view: dict) -> None:
    """The dashboard's routes table gives the view's figures, hop by hop."""
    async with dashboard(worker.url) as page:
        rows = await page.table("#routes")
        assert [(r[0], r[3], r[5], r[6], r[7], r[8]) for r in rows] == [
            (
                route["route"],
                hop["group"],
                *(str(hop[k]) for k in ("observed_in", "observed_out", "lost", "duplicated")),
            )
            for route in view["routes"]
            for hop in route["hops"]
        ]
        assert "estimates at the sampling rate" in await page.page.locator("#routes-note").inner_text()
        assert await page.page.locator("#changefeeds-section").is_hidden()
        assert page.errors == []


async def wait_settled(bootstrap: str, worker: WorkerProcess, source: str, sink: str, timeout: float = 90.0) -> dict:
    """Until the worker has committed the end of the route topics, then of its observations
    topic, and holds no open trace: every trace judged, whatever its counters saw before a
    restart."""
    for topic in (source, sink, f"{worker.app_id}-trace-observations"):
        await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=timeout)
    deadline = asyncio.get_running_loop().time() + timeout
    while (view := await routes_view(worker))["routes"][0]["open_traces"]:
        assert asyncio.get_running_loop().time() < deadline, f"traces still open: {view}\n{worker.log_tail(5)}"
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)  # one more judging round (each flush judges)
    return await routes_view(worker)


async def run_pipeline(
    bootstrap, topic_factory, tmp_path, fault: str, *, stall_s: float = 0.0, kill_worker: bool = False
):
    source, sink = topic_factory(4), topic_factory(4)
    group = f"proc{uuid.uuid4().hex[:8]}"
    worker = audit_worker(bootstrap, source, sink, group, tmp_path)
    linger_s = 1.5
    first, second = processor_pair(bootstrap, source, sink, group, fault, linger_s)
    stop = asyncio.Event()
    try:
        worker.start()
        await worker.wait_ready()
        producing = asyncio.create_task(produce_traced(bootstrap, source, stop))
        await first.start()
        await asyncio.sleep(3)
        await second.start()  # a rebalance under load
        await asyncio.sleep(3)
        if kill_worker:
            # Killed mid-judging: it resumes from its checkpoint (traces table, observations offsets).
            worker.sigkill()
            worker.restart()
            await worker.wait_ready()
        if stall_s:
            await asyncio.gather(first.stall(stall_s), second.stall(stall_s))
        await first.stop()  # another
        await asyncio.sleep(3)
        stop.set()
        traced = await producing
        await asyncio.sleep(2 * linger_s)  # the last batches written
        await second.stop()
        ledger = ProcessorLedger.merged([first.ledger, second.ledger])
        if kill_worker:
            view = await wait_settled(bootstrap, worker, source, sink)
        else:
            view = await wait_all_judged(worker, traced, sum(ledger.writes.values()))
        await dashboard_shows(worker, view)
        return worker, traced, view, ledger
    finally:
        stop.set()
        for processor in (first, second):
            await processor.stop()
        worker.terminate()


async def test_records_dropped_at_rebalances_are_lost_and_exactly_those(bootstrap, topic_factory, tmp_path):
    worker, traced, view, ledger = await run_pipeline(bootstrap, topic_factory, tmp_path, "drop")
    assert ledger.lost, "the processors dropped nothing: the test proves nothing"
    lost = await trace_incidents(bootstrap, worker.app_id, "LOST")
    assert lost == ledger.lost
    (hop,) = view["routes"][0]["hops"]
    assert hop["lost"] == len(ledger.lost)
    assert view["routes"][0]["delivered"] == traced - len(ledger.lost)
    assert await trace_incidents(bootstrap, worker.app_id, "DUPLICATED") == ledger.duplicated


async def test_batches_written_twice_are_duplicated_and_exactly_those(bootstrap, topic_factory, tmp_path):
    worker, traced, view, ledger = await run_pipeline(bootstrap, topic_factory, tmp_path, "duplicate")
    assert ledger.duplicated
    assert await trace_incidents(bootstrap, worker.app_id, "DUPLICATED") == ledger.duplicated
    assert await trace_incidents(bootstrap, worker.app_id, "LOST") == set()
    assert view["routes"][0]["delivered"] == traced


async def test_a_stalled_processor_is_late_not_lost(bootstrap, topic_factory, tmp_path):
    worker, traced, view, ledger = await run_pipeline(bootstrap, topic_factory, tmp_path, "none", stall_s=4 * GRACE_S)
    assert ledger.lost == set()
    assert await trace_incidents(bootstrap, worker.app_id, "LOST") == set()
    assert view["routes"][0]["delivered"] == traced


async def test_a_worker_killed_mid_run_names_the_same_records_no_more(bootstrap, topic_factory, tmp_path):
    worker, traced, view, ledger = await run_pipeline(bootstrap, topic_factory, tmp_path, "drop", kill_worker=True)
    assert ledger.lost, "the processors dropped nothing: the test proves nothing"
    # Replayed observations are not judged twice: no false loss, no duplicate, none missed.
    assert await trace_incidents(bootstrap, worker.app_id, "LOST") == ledger.lost
    assert await trace_incidents(bootstrap, worker.app_id, "DUPLICATED") == ledger.duplicated
    # Fatal incidents are logged at ERROR, one line each; nothing else there (the worker misbehaving).
    lost_lines = [line for line in worker.incident_lines() if " LOST (fatal) at " in line]
    assert lost_lines and all("[ERROR]" in line and " route " in line for line in lost_lines), lost_lines
    assert worker.problems() == []
