"""`GET /overview/`: what the dashboard's first screen shows (kdiv.worker.overview, JSON shape
in docs/web-views.md). Workers ask each other for their partitions with `scope=local`; the
incidents every worker reads itself, so they are this worker's."""

from __future__ import annotations

import asyncio

from faust.web import Request

from kdiv.worker.overview import GROUPS_PAGE, MAX_GROUPS_PAGE, GroupsQuery, overview, reason
from kdiv.worker.progress import Liveness
from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.params import LOCAL, int_param, scope
from kdiv.worker.web.partitions import partitions
from kdiv.worker.web.reports import report_url
from kdiv.worker.web.status import health_verdict, last_reconciliation

OVERVIEW_PARAMETERS = frozenset({"groups_topic", "groups_partition", "groups_offset", "groups_limit", "scope"})


def groups_query(request: Request) -> GroupsQuery:
    """The incident groups asked for: `groups_topic`, `groups_partition`, `groups_offset`, `groups_limit`."""
    return GroupsQuery(
        topic=request.query.get("groups_topic") or None,
        partition=int_param(request, "groups_partition", None),
        offset=int_param(request, "groups_offset", 0),
        limit=int_param(request, "groups_limit", GROUPS_PAGE, minimum=1, maximum=MAX_GROUPS_PAGE),
    )


async def overview_view(site: Site, request: Request) -> Answer:
    """Data health, the partition grid, incident groups, the fault chart, the last reconciliation."""
    groups = groups_query(request)
    worker = site.worker
    local = partitions(worker, request)
    if scope(request) == LOCAL:
        return Answer({"items": local})
    gathered = await site.peers.gather(request, local)
    # Each part costs tens of milliseconds at 1,000 partitions: between them the event loop
    # answers others (a `/health` probe waits for one part, not for the whole overview).
    await asyncio.sleep(0)
    process_status = health_verdict(worker).status
    status, last = last_reconciliation(worker)
    if status != 200:
        last = {"available": False, "message": last.get("message")}
    await asyncio.sleep(0)
    return Answer(
        overview(
            list(worker.recent_incidents()),
            gathered["items"],
            worker.now_ms(),
            process=process_status,
            unavailable_workers=gathered["unavailable_workers"],
            reconciliation=last,
            report_url=report_url(worker.reconcile_reports, last.get("run")),
            groups=groups,
            stalls=stall_reasons(worker.liveness()),
        )
    )


def stall_reasons(liveness: Liveness) -> list[dict]:
    """The overview's reasons that validation makes no progress, naming where and since when."""
    reasons = [
        reason(
            f"validation stalled on {p.topic}[{p.partition}]: {p.lag} records not validated",
            p.topic,
            p.partition,
            p.stalled_since_ms,
        )
        for p in liveness.stalled
    ]
    if liveness.commit_failing_ms >= liveness.stall_ms:
        reasons.append(
            reason(
                f"validation stalled: commits failing ({liveness.commit_attempts} attempts): {liveness.commit_error}",
                since_ms=liveness.commit_failing_since_ms,
            )
        )
    if liveness.blind:
        reasons.append(
            reason(
                f"validation progress unknown: the log ends cannot be read ({liveness.log_ends_error or 'no answer'})",
                since_ms=liveness.blind_since_ms,
            )
        )
    return reasons
