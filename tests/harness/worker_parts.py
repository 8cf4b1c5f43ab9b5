"""A validation worker's parts as the views read them, without a Faust app or a broker: the
real validator, incidents, changefeed counts, pipeline audit, progress, restore listener and
registry lookups, filled with a little of everything a view shows."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from kdiv.config.settings import ChangefeedSettings, RegistrySettings, Settings
from kdiv.div.faults import Verdict
from kdiv.div.segment import Segment
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import ChecksumType
from kdiv.incident.shape import Incident
from kdiv.registry.client import SchemaRegistry
from kdiv.registry.subjects import SchemaLookups
from kdiv.trace.judge import Observation
from kdiv.worker.audit import HopStats, PipelineAudit
from kdiv.worker.changefeeds import ChangefeedChecks
from kdiv.worker.incidents import RecentIncidents
from kdiv.worker.progress import Liveness, Progress
from kdiv.worker.restore import RestoreListener
from tests.harness.streams import GUID_A, GUID_B, NOW

REGISTRY_PASSWORD = "s3cret-registry-password"
AUDIT_SETTINGS = Settings.from_env(
    {
        "KDIV_ROUTES": "flow=orders>enricher>enriched>shipper>shipped;fan=orders>mailer>mailed",
        "KDIV_TRACE_PARTITIONS": "4",
        "KDIV_TRACE_SAMPLING": "orders=0.25",
    }
)


def incident(topic: str, partition: int, producer: str | None, verdict: str, at_ms: int, seq: int = 7) -> Incident:
    return Incident(
        topic, partition, producer, 1, seq, verdict, 120, "fatal", f"{verdict} at {seq}", at_ms - 500, at_ms
    )


def worker_parts(reports: Path | None = None, *, audit: bool = True, configured_registry: bool = True):
    """A namespace with what `ValidationWorker` gives the views: attributes and methods of
    the same names, over real parts."""
    validator = DataIntegrityValidator()
    pushed = validator.partition("orders", 1)
    pushed.in_push, pushed.push_failed, pushed.last_offset, pushed.records = True, True, 41, 42
    pushed.verdict_counts = {Verdict.MISSING: 2, Verdict.UNTRACKED: 3}
    pushed.untold_gaps, pushed.topic_id = 1, "topic-id-orders"
    live_segment = Segment(1, 5, ChecksumType.ADHASH, [0] * 8)
    live_segment.last_offset = 40
    idle_segment = Segment(2, 9, ChecksumType.NONE, [0] * 8)
    idle_segment.last_offset = 12
    pushed.tracker.segments[GUID_A] = live_segment
    pushed.tracker.segments[GUID_B] = idle_segment.pack()  # an idle producer is kept packed
    streamed = validator.partition("orders", 0)
    streamed.last_offset, streamed.records = 9, 10  # all OK
    streamed.tracker.segments[GUID_B] = Segment(1, 3, ChecksumType.ADHASH, [0] * 8)
    faulty = validator.partition("payments", 0)
    faulty.records, faulty.verdict_counts = 2, {Verdict.CORRUPT: 2}  # no OK record

    progress = Progress(60_000)
    assigned = [("cf", 0), ("orders", 0), ("orders", 1), ("orders", 2), ("payments", 0)]
    progress.assign(assigned, NOW - 120_000)
    progress.validated(("orders", 0), 10, NOW - 120_000)
    progress.log_ends({("orders", 0): (0, 25), ("orders", 1): (0, 42)}, NOW - 100_000)
    progress.validated(("orders", 1), 42, NOW - 90_000)
    progress.log_ends({("orders", 0): (0, 25), ("orders", 1): (0, 42)}, NOW)

    recent = RecentIncidents(1_000, 1 << 20)
    for number, held in enumerate(
        [
            incident("orders", 1, GUID_A.hex(), "MISSING", NOW - 3_000, seq=5),
            incident("orders", 1, GUID_A.hex(), "DUPLICATE", NOW - 2_000, seq=6),
            incident("payments", 0, None, "CORRUPT", NOW - 1_000),
        ]
    ):
        recent.add(b"key-%d" % number, held, 200)

    changefeeds = ChangefeedChecks(ChangefeedSettings(), None)  # type: ignore[arg-type]  # no registry asked
    changefeeds.counts.update(
        {("cf", 0, "db.users", "OK"): 5, ("cf", 1, "db.users", "OK"): 2, ("cf", 0, "db.items", "CORRUPT"): 1}
    )
    changefeeds.records.update({("cf", 0): 6, ("cf", 1): 2})
    changefeeds.last_offsets.update({("cf", 0): 77})
    changefeeds.registry_waits = 3

    restore = RestoreListener(lambda: NOW)
    restore.totals.records, restore.totals.batches, restore.totals.completed = 100, 4, 2
    restore.totals.last_duration_ms = 1_500
    restore.on_record("app-state-changelog", 3, 10, b"v", 20)

    url = f"https://kdiv:{REGISTRY_PASSWORD}@registry.example:8081" if configured_registry else "none"
    lookups = SchemaLookups(SchemaRegistry(RegistrySettings(url=url)), clock=lambda: NOW / 1000)
    lookups.stats.requests, lookups.stats.failures, lookups.stats.last_error = 9, 1, "timed out"

    pipeline = None
    if audit:
        pipeline = PipelineAudit(AUDIT_SETTINGS)
        pipeline.traced.update({("flow", 0): 8, ("flow", 1): 6, ("flow", 2): 5, ("fan", 0): 8})
        judged = HopStats(outcomes=Counter({"DELIVERED": 5, "LOST": 1, "DUPLICATED": 1}))
        judged.add_latency(30)
        judged.add_latency(700)
        pipeline.hops[("flow", 1)] = judged
        pipeline.hops[("fan", 0)] = HopStats(outcomes=Counter({"UNRESOLVED": 2}))
        pipeline.known_groups = frozenset({"enricher", "mailer"})
        # Traces seen at the routes' start, awaiting their verdicts: two of flow's, one of fan's.
        judge = pipeline._judge_of(0)
        for number, route in enumerate(("flow", "flow", "fan")):
            seen = Observation(bytes([number]) * 16, route, 0, "orders", 0, number, NOW - 1_000, NOW - 1_500)
            judge.observe(seen, NOW - 1_000)

    ready = asyncio.Event()
    ready.set()
    finding = SimpleNamespace(to_json=lambda: {"class": "SUBJECT_MISMATCH", "schema_id": 12})
    liveness = Liveness(
        stalled=tuple(p for p in progress.snapshot(NOW) if p.stalled),
        blind=False,
        blind_since_ms=None,
        log_ends_error=None,
        commit_failing_since_ms=NOW - 70_000,
        commit_attempts=4,
        commit_error="request timed out",
        commit_failing_ms=70_000,
        stall_ms=60_000,
    )
    loaded = {("cf", 0), ("orders", 0), ("orders", 1), ("payments", 0)}
    return SimpleNamespace(
        app=SimpleNamespace(conf=SimpleNamespace(canonical_url="http://worker-1:6066")),
        settings=SimpleNamespace(reconcile_reports=reports),
        cluster=SimpleNamespace(cluster_id="cluster-1"),
        clock=lambda: NOW,
        live=SimpleNamespace(validator=validator, replays_skipped=11),
        progress=progress,
        partition_progress=lambda: progress.snapshot(NOW),
        liveness=lambda: liveness,
        assigned_partitions=lambda: list(assigned),
        is_loaded=lambda topic, partition: (topic, partition) in loaded,
        changefeed_topics=frozenset({"cf"}),
        changefeeds=changefeeds,
        recent=recent,
        incidents_read_to={0: 3, 1: 0},
        recovery_status=lambda: {"in_progress": False, "active_remaining": 0, "standby_remaining": 5},
        restore=restore,
        state_schema_ready=ready,
        values=SimpleNamespace(schema_id=7),
        state_check=SimpleNamespace(open={("app-state-changelog", 12): finding}, repairs=2),
        load_errors_seen=1,
        lookups=lookups,
        stats=SimpleNamespace(
            batches=101,
            incidents_sent=102,
            log_rewinds=103,
            deletions_before_validation=104,
            producers_evicted=105,
            ledger_entries_sent=106,
            state_writes=107,
            bad_incident_records=108,
            schema_checked_records=109,
            schema_unchecked_records=110,
        ),
        audit=pipeline,
    )


def reconcile_reports(directory: Path) -> Path:
    """A KDIV_RECONCILE_REPORTS with one run, whose summary names the worker's cluster."""
    run = directory / "20261128T000000Z"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"status": "clean", "cluster_id": "cluster-1"}))
    (run / "report.html").write_text("<p>clean</p>")
    return directory
