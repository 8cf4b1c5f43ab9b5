"""The worker's own status: `GET /health` (ready, recovering or degraded, with the reasons),
`GET /metrics` (Prometheus text) and `GET /reconcile/` (the latest nightly reconciliation's
summary)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

from faust.web import Request

from kdiv.clock import iso_utc
from kdiv.untrusted import parse_json
from kdiv.worker import metrics
from kdiv.worker.progress import Liveness
from kdiv.worker.readmodel import RecoveryStatus, RegistryStatus, WorkerReadModel
from kdiv.worker.report_scope import elsewhere
from kdiv.worker.web.guard import clipped
from kdiv.worker.web.handlers import Answer, Site

log = logging.getLogger(__name__)
# The largest summary.json read (one holds counts and per-topic figures, not records).
MAX_SUMMARY_BYTES = 64 << 20


async def health_view(site: Site, request: Request) -> Answer:
    """Ready, recovering or degraded, with the reasons."""
    status, body = health(site.worker)
    return Answer(body, status)


async def metrics_view(site: Site, request: Request) -> Answer:
    """The worker's metrics, in Prometheus' text format."""
    return Answer(metrics.render(site.worker), content_type=metrics.CONTENT_TYPE)


async def reconcile_view(site: Site, request: Request) -> Answer:
    """The summary of the latest reconciliation run."""
    status, body = last_reconciliation(site.worker)
    return Answer(body, status)


@dataclass(frozen=True)
class HealthVerdict:
    """What `/health` says, before the lists that name each partition."""

    status: str
    code: int
    recovery: RecoveryStatus
    restoring: bool
    schema_pending: bool
    liveness: Liveness
    findings: list
    registry: RegistryStatus


def health_verdict(worker: WorkerReadModel) -> HealthVerdict:
    """Ready, recovering or degraded: the status alone, which the overview shows (the lists of
    `health`, a dict per partition, cost as much again at 1,000 partitions)."""
    recovery = worker.recovery()
    # While tables recover, assigned partitions not yet loaded are still being restored;
    # their state loads when recovery completes (or with a record that comes first).
    restoring = recovery["in_progress"] or not worker.state_schema_ready()
    # Degraded: serving, but its state is under a subject its readers do not look in.
    findings = worker.state_schema_findings()
    registry = worker.registry()
    # The state schema is registered once the tables are restored: until then, with no
    # registry configured, the worker is recovering, not waiting for one.
    schema_pending = not worker.state_schema_ready()
    waiting = schema_pending and registry.configured
    liveness = worker.liveness()
    # Stalled: validation makes no progress where records wait (docs/worker.md#liveness).
    stalled = liveness.is_stalled
    # A restore that makes no progress is stalled, not recovering (docs/worker.md#liveness).
    restore_moving = (recovery["in_progress"] or (schema_pending and not waiting)) and (
        liveness.restore_stalled_since_ms is None
    )
    status = (
        "recovering"
        if restore_moving
        else "waiting_for_registry"
        if waiting
        else "stalled"
        if stalled
        else "degraded"
        if findings
        else "ready"
    )
    # Recovering: not ready for traffic (a readiness probe fails); failed pushes are data
    # faults, reported but not a reason to restart the worker.
    code = 503 if recovery["in_progress"] or schema_pending or stalled else 200
    return HealthVerdict(status, code, recovery, restoring, schema_pending, liveness, findings, registry)


def health(worker: WorkerReadModel) -> tuple[int, dict]:
    """Ready, recovering or degraded, with the reasons."""
    verdict = health_verdict(worker)
    recovery, liveness, registry = verdict.recovery, verdict.liveness, verdict.registry
    findings, schema_pending = verdict.findings, verdict.schema_pending
    failed = [{"topic": t, "partition": p} for t, p in worker.failed_pushes()]
    assigned = worker.assigned_partitions()
    loaded = worker.is_loaded
    ready = [{"topic": t, "partition": p} for t, p in assigned if loaded(t, p) or not verdict.restoring]
    recovering = [{"topic": t, "partition": p} for t, p in assigned if not loaded(t, p) and verdict.restoring]
    status = verdict.status
    body = {
        "status": status,
        "ready": ready,
        "recovering": recovering,
        "failed": failed,
        "recovery": recovery,
        "stalled": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "since": iso_utc(p.stalled_since_ms),
                "lag": p.lag,
                "lag_age_s": None if p.lag_age_ms is None else p.lag_age_ms / 1000,
            }
            for p in liveness.stalled
        ],
        "reasons": liveness.reasons(),
        "progress": {
            "lag": sum(p.lag or 0 for p in worker.partition_progress()),
            "log_ends_unreadable_since": iso_utc(liveness.blind_since_ms),
            "log_ends_error": liveness.log_ends_error,
            "commit_failing_since": iso_utc(liveness.commit_failing_since_ms),
            "commit_attempts": liveness.commit_attempts,
            "commit_error": liveness.commit_error,
        },
        "state_load_errors": worker.load_errors_seen(),
        "state_schema_findings": findings,
        "schema_registry": {
            "configured": registry.configured,
            "url": registry.url,
            "state_schema_id": None if schema_pending else worker.state_schema_id(),
            "available": registry.available,
            "last_error": registry.last_error,
            "unchecked_records": worker.counters().schema_unchecked_records,
        },
    }
    return verdict.code, body


def last_reconciliation(worker: WorkerReadModel) -> tuple[int, dict]:
    """The summary of the latest run under KDIV_RECONCILE_REPORTS (runs are directories
    named by their snapshot time, so the greatest name is the latest). Not configured, or
    no run yet, is an answer (available: false), not an error. A summary that cannot be read
    or parsed is the reconciliation job's fault, not the worker's: a 502 naming the run (the
    host's paths are for the log, which says it once per file). `elsewhere` says why the run
    is not about the data watched now (another cluster, recreated topics), else null."""
    reports = worker.reconcile_reports
    if reports is None:
        return 200, {"available": False, "message": "KDIV_RECONCILE_REPORTS is not set on this worker"}
    runs = sorted(p for p in reports.glob("*/summary.json") if p.is_file()) if reports.is_dir() else []
    if not runs:
        return 200, {"available": False, "message": "no reconciliation run in KDIV_RECONCILE_REPORTS yet"}
    latest = runs[-1]
    run = latest.parent.name
    try:
        with latest.open("rb") as file:  # one byte more than is parsed: a larger file is refused unread
            summary = parse_json(file.read(MAX_SUMMARY_BYTES + 1), max_bytes=MAX_SUMMARY_BYTES)
    except OSError as failed:
        problem = failed.strerror or type(failed).__name__
    except ValueError as bad:  # not UTF-8, not JSON, too deep or too large
        problem = str(bad)
    else:
        scope = elsewhere(summary if isinstance(summary, dict) else {}, worker.cluster_id, worker.watched_topic_ids())
        return 200, {"available": True, "run": run, "summary": summary, "elsewhere": scope}
    _BROKEN_SUMMARIES.log_once(latest, problem)
    return 502, {
        "error": HTTPStatus.BAD_GATEWAY.phrase,
        "available": False,
        "run": run,
        "message": f"the summary.json of reconciliation run {run!r} cannot be read: {clipped(problem, 200)}",
    }


class _OncePerFile:
    """Logs a broken file once per version of it (path, size, modification time), not once
    per request: the dashboard asks for the summary every few seconds."""

    def __init__(self, limit: int = 64) -> None:
        self._seen: set[tuple] = set()
        self._limit = limit

    def log_once(self, path: Path, problem: str) -> None:
        try:
            stat = path.stat()
            version: tuple = (str(path), stat.st_size, stat.st_mtime_ns)
        except OSError:
            version = (str(path), None, None)
        if version in self._seen:
            return
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(version)
        log.warning("reconciliation summary %s cannot be read: %s", path, clipped(problem, 200))


_BROKEN_SUMMARIES = _OncePerFile()
