"""The worker's own status: `GET /health` (ready, recovering or degraded, with the reasons),
`GET /metrics` (Prometheus text) and `GET /reconcile/` (the latest nightly reconciliation's
summary)."""

from __future__ import annotations

from faust.web import Request

from kdiv.untrusted import parse_json
from kdiv.worker import metrics
from kdiv.worker.report_scope import elsewhere
from kdiv.worker.web.handlers import Answer, Site


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


def health(worker) -> tuple[int, dict]:
    """Ready, recovering or degraded, with the reasons."""
    recovery = worker.recovery_status()
    parts = worker.live.validator.partitions
    failed = [{"topic": t, "partition": p} for (t, p), part in sorted(parts.items()) if part.push_failed]
    assigned = worker.assigned_partitions()
    # While tables recover, assigned partitions not yet loaded are still being restored;
    # their state loads when recovery completes (or with a record that comes first).
    restoring = recovery["in_progress"] or not worker.state_schema_ready.is_set()
    loaded = worker.is_loaded
    ready = [{"topic": t, "partition": p} for t, p in assigned if loaded(t, p) or not restoring]
    recovering = [{"topic": t, "partition": p} for t, p in assigned if not loaded(t, p) and restoring]
    # Degraded: serving, but its state is under a subject its readers do not look in.
    findings = [f.to_json() for f in worker.state_check.open.values()]
    lookups = worker.lookups
    waiting = not worker.state_schema_ready.is_set()
    status = (
        "waiting_for_registry"
        if waiting
        else "recovering"
        if recovery["in_progress"]
        else "degraded"
        if findings
        else "ready"
    )
    body = {
        "status": status,
        "ready": ready,
        "recovering": recovering,
        "failed": failed,
        "recovery": recovery,
        "state_load_errors": worker.load_errors_seen,
        "state_schema_findings": findings,
        "schema_registry": {
            "configured": lookups.registry.configured,
            "url": lookups.registry.url if lookups.registry.configured else None,
            "state_schema_id": None if waiting else worker.values.schema_id,
            "available": lookups.available,
            "last_error": lookups.stats.last_error,
            "unchecked_records": worker.stats.schema_unchecked_records,
        },
    }
    # Recovering: not ready for traffic (a readiness probe fails); failed pushes are data
    # faults, reported but not a reason to restart the worker.
    return (503 if recovery["in_progress"] or waiting else 200), body


def last_reconciliation(worker) -> tuple[int, dict]:
    """The summary of the latest run under KDIV_RECONCILE_REPORTS (runs are directories
    named by their snapshot time, so the greatest name is the latest). Not configured, or
    no run yet, is an answer (available: false), not an error. `elsewhere` says why the run
    is not about the data watched now (another cluster, recreated topics), else null."""
    reports = worker.settings.reconcile_reports
    if reports is None:
        return 200, {"available": False, "message": "KDIV_RECONCILE_REPORTS is not set on this worker"}
    runs = sorted(p for p in reports.glob("*/summary.json") if p.is_file()) if reports.is_dir() else []
    if not runs:
        return 200, {"available": False, "message": f"no reconciliation run under {reports} yet"}
    latest = runs[-1]
    try:
        summary = parse_json(latest.read_text(encoding="utf-8"), max_bytes=64 << 20)
    except (OSError, ValueError) as bad:
        return 500, {"error": "Internal Server Error", "message": f"{latest}: {bad}"}
    scope = elsewhere(
        summary if isinstance(summary, dict) else {}, worker.cluster.cluster_id, watched_topic_ids(worker)
    )
    return 200, {"available": True, "run": latest.parent.name, "summary": summary, "elsewhere": scope}


def watched_topic_ids(worker) -> dict[str, str]:
    """The ids of the watched topics this worker has seen, as its partitions last saw them."""
    parts = worker.live.validator.partitions
    return {topic: part.topic_id for (topic, _), part in sorted(parts.items()) if part.topic_id is not None}
