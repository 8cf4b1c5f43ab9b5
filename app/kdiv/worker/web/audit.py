"""The pipeline audit's view: `GET /routes/`, per route and hop the traces every worker
judged (`kdiv.worker.audit`), summed over the group with the rates they imply."""

from __future__ import annotations

from faust.web import Request

from kdiv.worker.readmodel import AuditSnapshot, WorkerReadModel
from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.params import LOCAL, scope


async def routes_view(site: Site, request: Request) -> Answer:
    """The pipeline audit: per route and hop, traces judged by every worker."""
    local = route_hop_items(site.worker)
    gathered = await site.peers.gather(request, local, sort_key=lambda i: (i["route"], i["hop"]))
    if scope(request) == LOCAL:
        return Answer(gathered)
    # Read again: the groups known may have been learnt while the peers answered.
    return Answer(routes_summary(site.worker.audit(), gathered))


def route_hop_items(worker: WorkerReadModel) -> list[dict]:
    """This worker's counts per route and hop (what its judges decided, what it observed)."""
    audit = worker.audit()
    if audit is None:
        return []
    items = []
    for route in audit.routes:
        for hop_index in range(len(route.groups)):
            stats = audit.hops.get((route.name, hop_index))
            outcomes = dict(stats.outcomes) if stats else {}
            items.append(
                {
                    "route": route.name,
                    "hop": hop_index,
                    "observed_in": audit.traced.get((route.name, hop_index), 0),
                    "observed_out": audit.traced.get((route.name, hop_index + 1), 0),
                    "outcomes": outcomes,
                    "latency_buckets": list(stats.latency_buckets) if stats else [],
                    "latency_sum_ms": stats.latency_sum_ms if stats else 0,
                    "open_traces": worker.route_open_traces(route.name) if hop_index == 0 else 0,
                }
            )
    return items


def routes_summary(audit: AuditSnapshot | None, gathered: dict) -> dict:
    """Every worker's per-hop counts summed per route and hop, with the rates they imply."""
    routes = []
    merged: dict[tuple[str, int], dict] = {}
    for item in gathered["items"]:
        into = merged.setdefault(
            (item["route"], item["hop"]),
            {"observed_in": 0, "observed_out": 0, "outcomes": {}, "latency_sum_ms": 0, "latency_count": 0, "open": 0},
        )
        into["observed_in"] += item["observed_in"]
        into["observed_out"] += item["observed_out"]
        for outcome, count in item["outcomes"].items():
            into["outcomes"][outcome] = into["outcomes"].get(outcome, 0) + count
        into["latency_sum_ms"] += item["latency_sum_ms"]
        into["latency_count"] += sum(item["latency_buckets"])
        into["open"] += item["open_traces"]
    known_groups = audit.known_groups if audit is not None else None
    for route in audit.routes if audit is not None else ():
        per_hop = [merged.get((route.name, index), {}) for index in range(len(route.groups))]
        delivered = sum(counts.get("outcomes", {}).get("DELIVERED", 0) for counts in per_hop)
        hops = []
        for index, (group, counts) in enumerate(zip(route.groups, per_hop, strict=True)):
            outcomes = counts.get("outcomes", {})
            lost, duplicated = outcomes.get("LOST", 0), outcomes.get("DUPLICATED", 0)
            judged = delivered + lost
            latency_count = counts.get("latency_count", 0)
            hops.append(
                {
                    "hop": index,
                    "from": list(route.stages[index]),
                    "group": group,
                    "to": list(route.stages[index + 1]),
                    "group_known": None if known_groups is None else group in known_groups,
                    "observed_in": counts.get("observed_in", 0),
                    "observed_out": counts.get("observed_out", 0),
                    "lost": lost,
                    "duplicated": duplicated,
                    "unresolved": outcomes.get("UNRESOLVED", 0),
                    "loss_rate": lost / judged if judged else None,
                    "duplicate_rate": duplicated / judged if judged else None,
                    "mean_latency_ms": counts.get("latency_sum_ms", 0) / latency_count if latency_count else None,
                }
            )
        rate = route.sampling_rate
        routes.append(
            {
                "route": route.name,
                "hops": hops,
                "delivered": delivered,
                "open_traces": sum(counts.get("open", 0) for counts in per_hop),
                "sampling_rate": rate,
                "note": (
                    "counts are of traced records only: writers trace a sample, so rates are estimates at the "
                    "sampling rate" + ("" if rate is not None else " (KDIV_TRACE_SAMPLING not set: rate unknown)")
                ),
            }
        )
    return {"routes": routes, "unavailable_workers": gathered.get("unavailable_workers", [])}
