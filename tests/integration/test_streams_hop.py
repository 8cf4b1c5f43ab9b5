"""A Kafka Streams application as an audited hop, on a real broker: kdiv's Streams hop
(java/streams-hop) between two topics of traced records, SIGKILLed mid-stream (between two
commits) and restarted, under each processing guarantee; and a run that drops chosen records on
purpose. The live worker's /routes/ and incidents and the nightly job must report exactly the
records the destination topic holds twice (as the test reads it, read_committed) and exactly the
records the application dropped: under at_least_once the records it processed again after the
kill, under exactly_once_v2 nothing (its aborted writes are in the log, but no committed reader
sees them)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest
from pyspark.sql import functions as F

from kdiv.div.wire import HEADER_NAME as DIV_HEADER
from kdiv.kafka.consume import read_snapshot
from kdiv.reconcile.findings import ROUTE_DUPLICATED, ROUTE_LOST
from kdiv.reconcile.job import Reconciliation, parse_args, settings_from
from kdiv.reconcile.report import SUMMARY_JSON
from kdiv.trace.header import TRACE_HEADER
from tests.conftest import _create_topic, _delete_topics, run_coroutine
from tests.harness.broker import committed_offsets, read_incidents, wait_until_caught_up
from tests.harness.pipeline import produce_traced
from tests.harness.processes import WorkerProcess, free_port
from tests.harness.streams_hop import StreamsHopProcess
from tests.integration.test_pipeline_audit import routes_view

pytestmark = pytest.mark.broker

PARTITIONS = 3
RATE = 200.0
# Long enough that a kill half-way between two commits finds a few hundred records processed
# (and, under exactly_once_v2, written in the open transaction) but not committed.
COMMIT_INTERVAL_MS = 4000
HOP_PROPERTIES = {
    "commit.interval.ms": str(COMMIT_INTERVAL_MS),
    # The killed instance's partitions go to its successor within seconds, not 45.
    "consumer.session.timeout.ms": "2000",
    "consumer.heartbeat.interval.ms": "500",
}
# The writer's keys are b"k<n>", n its count: records written early in every run.
DROPPED_KEYS = ("k7", "k77", "k177", "k377", "k577")
RUN_TIMEOUT_S = 120.0
KAFKA_SOURCES = ("python", "spark")
# A JVM that ran its shutdown hooks (Kafka Streams closed cleanly) at SIGTERM exits 128 + 15.
SIGTERM_EXIT = 143


@dataclass
class Scenario:
    name: str
    guarantee: str
    kill: bool
    drop_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.source = f"kdiv-streams-src-{self.name}-{suffix}"
        self.destination = f"kdiv-streams-dst-{self.name}-{suffix}"
        self.application_id = f"kdiv-streams-{self.name}-{suffix}"

    @property
    def route(self) -> str:
        return f"{self.name}={self.source}>{self.application_id}>{self.destination}"


SCENARIOS = (
    Scenario("alos", "at_least_once", kill=True),
    Scenario("eos", "exactly_once_v2", kill=True),
    Scenario("drop", "at_least_once", kill=False, drop_keys=DROPPED_KEYS),
)


async def wait_committed_something(bootstrap: str, group: str, topic: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not any(o > 0 for o in (await committed_offsets(bootstrap, group, topic, range(PARTITIONS))).values()):
        assert asyncio.get_running_loop().time() < deadline, f"{group} committed nothing on {topic} in {timeout} s"
        await asyncio.sleep(0.1)


async def run_hop(bootstrap: str, scenario: Scenario, workdir) -> dict:
    """Traced records through the Streams hop (killed between two commits and restarted when the
    scenario says so) until its group has committed the whole source; what the topics hold."""
    hop = StreamsHopProcess(
        bootstrap,
        scenario.application_id,
        scenario.source,
        scenario.destination,
        workdir,
        guarantee=scenario.guarantee,
        drop_keys=scenario.drop_keys,
        properties=HOP_PROPERTIES,
    )
    stop = asyncio.Event()
    producing = asyncio.create_task(produce_traced(bootstrap, scenario.source, stop, rate=RATE))
    try:
        hop.start()
        await hop.wait_running()
        if scenario.kill:
            # Half-way between the first commit and the next: processed records not committed.
            await wait_committed_something(bootstrap, scenario.application_id, scenario.source)
            await asyncio.sleep(COMMIT_INTERVAL_MS / 2000)
            hop.sigkill()
            hop.start()
            await hop.wait_running()
        await asyncio.sleep(4)
        stop.set()
        written = await asyncio.wait_for(producing, 30)
        await wait_until_caught_up(bootstrap, scenario.application_id, scenario.source, timeout=RUN_TIMEOUT_S)
        assert hop.terminate() == SIGTERM_EXIT, hop.log_tail()
    finally:
        stop.set()
        hop.terminate()
        if not producing.done():
            producing.cancel()
    return {"written": written, **await what_the_topics_hold(bootstrap, scenario)}


def trace_of(headers) -> bytes | None:
    return dict(headers).get(TRACE_HEADER)


async def what_the_topics_hold(bootstrap: str, scenario: Scenario) -> dict:
    """Independently of kdiv's audit: per traced source record, its copies in the destination
    as a read_committed reader sees them."""
    at: dict[bytes, tuple[int, int]] = {}
    values: dict[bytes, bytes] = {}
    keys: dict[bytes, bytes] = {}
    async for record in read_snapshot(bootstrap, scenario.source):
        trace = trace_of(record.headers)
        if trace is not None:
            at[trace] = (record.partition, record.offset)
            # The writer gives every record a key and a value.
            assert record.key is not None and record.value is not None, record
            values[trace], keys[trace] = record.value, record.key
    copies: Counter[bytes] = Counter()
    committed = 0
    after_last: dict[int, int] = {}
    async for record in read_snapshot(bootstrap, scenario.destination, isolation_level="read_committed"):
        committed += 1
        after_last[record.partition] = record.offset + 1
        names = [name for name, _ in record.headers]
        trace = trace_of(record.headers)
        # The hop's contract: the trace header kept, the input's `div` not, the value transformed.
        assert trace is not None and trace in at and DIV_HEADER not in names, (record, names)
        assert (record.key, record.value) == (keys[trace], values[trace].upper()), record
        copies[trace] += 1
    in_log = 0
    async for _ in read_snapshot(bootstrap, scenario.destination):  # read_uncommitted: aborted writes too
        in_log += 1
    return {
        "traced": len(at),
        # Where a read_committed consumer's position ends: a transaction's last marker is past it.
        "destination_after_last": after_last,
        "destination_records": committed,
        "aborted_in_log": in_log - committed,
        "duplicated": {at[t] for t, n in copies.items() if n > 1},
        "extra_copies": sum(n - 1 for n in copies.values() if n > 1),
        "lost": {at[t] for t in at if copies[t] == 0},
        "dropped": {at[t] for t in at if keys[t].decode() in scenario.drop_keys},
    }


def audit_worker(bootstrap: str, registry_url: str, workdir) -> WorkerProcess:
    return WorkerProcess(
        "audit",
        bootstrap=bootstrap,
        topics=[],
        app_id=f"audit{uuid.uuid4().hex[:8]}",
        workdir=workdir,
        web_port=free_port(),
        env={
            "KDIV_ROUTES": ";".join(s.route for s in SCENARIOS),
            # Under exactly_once_v2 a hop's output becomes readable at the moment its group's
            # offsets commit (one transaction), so the worker has just the grace to read it: on
            # two cores beside three Streams JVMs that took over 2 s (the default is 30 s).
            "KDIV_TRACE_GRACE_S": "15",
            "KDIV_TRACE_OFFSETS_POLL_S": "0.5",
            "KDIV_TRACE_PARTITIONS": "2",
            "KDIV_TRACE_SAMPLING": "*=1",
            "KDIV_SCHEMA_REGISTRY_URL": registry_url,
        },
    )


async def worker_settled(bootstrap: str, worker: WorkerProcess, held: dict) -> dict:
    """Until the worker has committed the ends of every route topic, then of its observations,
    and holds no open trace; its /routes/ view by route name."""
    for scenario in SCENARIOS:
        await wait_until_caught_up(bootstrap, worker.app_id, scenario.source, workers=[worker], timeout=RUN_TIMEOUT_S)
        await wait_until_caught_up(
            bootstrap,
            worker.app_id,
            scenario.destination,
            workers=[worker],
            timeout=RUN_TIMEOUT_S,
            ends=held[scenario.name]["destination_after_last"],
        )
    await wait_until_caught_up(
        bootstrap, worker.app_id, f"{worker.app_id}-trace-observations", workers=[worker], timeout=RUN_TIMEOUT_S
    )
    deadline = asyncio.get_running_loop().time() + RUN_TIMEOUT_S
    while True:
        view = await routes_view(worker)
        if not any(r["open_traces"] for r in view["routes"]):
            break
        assert asyncio.get_running_loop().time() < deadline, f"traces still open: {view}\n{worker.log_tail(5)}"
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)  # one more judging round (each flush judges)
    return {r["route"]: r for r in (await routes_view(worker))["routes"]}


async def incidents_by_route(bootstrap: str, app_id: str) -> dict[str, dict[str, set[tuple[int, int]]]]:
    found: dict[str, dict[str, set[tuple[int, int]]]] = {
        s.name: {"LOST": set(), "DUPLICATED": set()} for s in SCENARIOS
    }
    for versions in (await read_incidents(bootstrap, app_id)).values():
        last = versions[-1]
        if last.route is not None:
            found[last.route].setdefault(last.verdict, set()).add((last.partition, last.offset))
    return found


def nightly(bootstrap: str, spark, out, kafka_source: str) -> tuple[dict, list]:
    args = parse_args(
        [
            *("--bootstrap", bootstrap, "--app-id", f"qos-{uuid.uuid4().hex[:8]}"),
            *("--routes", ";".join(s.route for s in SCENARIOS), "--out", str(out), "--kafka-source", kafka_source),
        ]
    )
    said: list[str] = []
    settings = settings_from(args, {"KDIV_SCHEMA_REGISTRY_URL": "none"})
    _, report = Reconciliation(args, settings, spark, lambda m, err=False: said.append(m)).run()
    assert report is not None, said
    rows = spark.read.parquet(str(report / "discrepancies")).where(F.col("class").startswith("ROUTE_")).collect()
    return json.loads((report / SUMMARY_JSON).read_text()), rows


@pytest.fixture(scope="module")
def audited(bootstrap, registry_url, spark, tmp_path_factory):
    """Every scenario run in turn under one auditing worker, then one nightly job over them all."""
    workdir = tmp_path_factory.mktemp("streams-hop")
    topics = [t for s in SCENARIOS for t in (s.source, s.destination)]
    for topic in topics:
        run_coroutine(_create_topic(bootstrap, topic, PARTITIONS))
    worker = audit_worker(bootstrap, registry_url, workdir)
    try:

        async def audit() -> tuple[dict, dict, dict]:
            worker.start()
            await worker.wait_ready()
            held = {s.name: await run_hop(bootstrap, s, workdir) for s in SCENARIOS}
            return (
                held,
                await worker_settled(bootstrap, worker, held),
                await incidents_by_route(bootstrap, worker.app_id),
            )

        held, view, incidents = run_coroutine(audit())
        # Through either of the job's Kafka readers: both must skip the aborted transactions' records.
        by_source = {
            source: nightly(bootstrap, spark, tmp_path_factory.mktemp(f"nightly-{source}"), source)
            for source in KAFKA_SOURCES
        }
        yield {"held": held, "view": view, "incidents": incidents, "nightly": by_source}
    finally:
        worker.terminate()
        run_coroutine(_delete_topics(bootstrap, topics))


def audit_says(audited: dict, route: str, kafka_source: str) -> dict:
    """What each of the audit's paths says of a route: live incidents and counts, nightly findings
    and counts (the job reading Kafka through `kafka_source`)."""
    summary, all_rows = audited["nightly"][kafka_source]
    view, summary = audited["view"][route], summary["routes"][route]
    (hop,) = view["hops"]
    rows = [r for r in all_rows if r["route"] == route]
    return {
        "live_lost": audited["incidents"][route]["LOST"],
        "live_duplicated": audited["incidents"][route]["DUPLICATED"],
        "live_counts": (view["delivered"], hop["lost"], hop["duplicated"]),
        "nightly_lost": {(r["partition"], r["offset"]) for r in rows if r["class"] == ROUTE_LOST},
        "nightly_duplicated": {(r["partition"], r["offset"]) for r in rows if r["class"] == ROUTE_DUPLICATED},
        "nightly_counts": (summary["delivered"], summary["lost"], summary["duplicated"]),
        "nightly_traced_pending": (summary["traced"], summary["pending"]),
        "nightly_extra_copies": sum(r["count"] for r in rows if r["class"] == ROUTE_DUPLICATED),
    }


def assert_audit_matches_the_topic(audited: dict, route: str) -> dict:
    held = audited["held"][route]
    for kafka_source in KAFKA_SOURCES:
        said = audit_says(audited, route, kafka_source)
        # The figures of the run, for `pytest -s`.
        print(
            f"\n{route}: written {held['written']}, in the destination {held['destination_records']} "
            f"({held['extra_copies']} extra copies of {len(held['duplicated'])} records, "
            f"{len(held['lost'])} missing, {held['aborted_in_log']} aborted in the log); reported live and "
            f"nightly ({kafka_source}): {said['live_counts']} / {said['nightly_counts']} (delivered, lost, duplicated)"
        )
        expected_counts = (held["traced"] - len(held["lost"]), len(held["lost"]), len(held["duplicated"]))
        assert said["live_lost"] == said["nightly_lost"] == held["lost"], said
        assert said["live_duplicated"] == said["nightly_duplicated"] == held["duplicated"], said
        assert said["live_counts"] == said["nightly_counts"] == expected_counts, said
        assert said["nightly_traced_pending"] == (held["traced"], 0), said
        assert said["nightly_extra_copies"] == held["extra_copies"], said
    return held


def test_at_least_once_killed_between_commits_duplicates_exactly_what_the_destination_holds_twice(audited):
    held = assert_audit_matches_the_topic(audited, "alos")
    assert held["duplicated"], "the kill left nothing processed uncommitted: the test proves nothing"
    assert held["lost"] == set() and held["aborted_in_log"] == 0


def test_exactly_once_v2_killed_between_commits_is_reported_clean(audited):
    held = assert_audit_matches_the_topic(audited, "eos")
    # The killed transaction's writes are in the log: a read_uncommitted auditor would count them.
    assert held["aborted_in_log"] > 0, "the kill found no open transaction: the test proves nothing"
    assert held["duplicated"] == set() and held["lost"] == set()


def test_records_the_application_drops_are_lost_and_exactly_those(audited):
    held = assert_audit_matches_the_topic(audited, "drop")
    assert len(held["dropped"]) == len(DROPPED_KEYS)
    assert held["lost"] == held["dropped"] and held["duplicated"] == set()
