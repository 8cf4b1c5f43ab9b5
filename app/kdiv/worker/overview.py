"""The dashboard's overview: what is wrong, where and since when, drawn from the incidents a
worker holds and the group's partitions. Pure: the caller passes the time and every input.

States: "red" when data is being lost now (a fatal incident in the last hour, a failed
push), "amber" when something needs a look (warnings in the last hour, fatal incidents held
from before, a worker not ready or not answering, a reconciliation that found discrepancies
or failed), "green" otherwise; a partition still restoring its state is "recovering".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from kdiv.clock import iso_utc, renderable_ms
from kdiv.incident.bounds import MAX_CHARS, cut

HOUR_MS = 3_600_000
# The chart's bucket widths: the smallest that puts the whole span in TIMELINE_BUCKETS.
BUCKET_WIDTHS_MS = (60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000, 24 * 3_600_000, 7 * 24 * 3_600_000)
TIMELINE_BUCKETS = 60
GROUPS_PAGE = 50
MAX_GROUPS_PAGE = 500
# A grid of more cells than this is cut (the answer says how many there were): the answer
# stays a few 100 KiB whatever the group watches.
MAX_GRID_CELLS = 5000
# Reasons named one by one before "and N more".
MAX_REASONS = 8
# Topics listed (the worst first), failed pushes named, and a reconciliation's classes and
# error shown: each list is cut past these, the answer saying how many there were.
MAX_TOPICS = 500
MAX_FAILED_PUSHES = MAX_GRID_CELLS
MAX_FINDING_CLASSES = 100
MAX_ERROR_CHARS = 2000
# What those bounds make the largest answer (incidents' fields are bounded too,
# kdiv.incident.bounds): a unit test builds it, every string at its longest.
MAX_OVERVIEW_BYTES = 8 << 20

RED, AMBER, GREEN, RECOVERING = "red", "amber", "green", "recovering"
_RANK = {GREEN: 0, RECOVERING: 1, AMBER: 2, RED: 3}


class IncidentLike(Protocol):
    # Read-only: an `Incident` is frozen.
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def verdict(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def detected_at_ms(self) -> int: ...


def worst(*states: str) -> str:
    return max(states, key=_RANK.__getitem__, default=GREEN)


@dataclass(slots=True)
class Faults:
    """Incidents counted: fatal and warning, in the last hour and in all held, and when."""

    fatal: int = 0
    warning: int = 0
    fatal_last_hour: int = 0
    warning_last_hour: int = 0
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, incident: IncidentLike, hour_ago_ms: int) -> None:
        fatal = incident.severity == "fatal"
        recent = incident.detected_at_ms >= hour_ago_ms
        if fatal:
            self.fatal += 1
            self.fatal_last_hour += recent
        else:
            self.warning += 1
            self.warning_last_hour += recent
        at = incident.detected_at_ms
        self.first_ms = at if self.first_ms is None else min(self.first_ms, at)
        self.last_ms = at if self.last_ms is None else max(self.last_ms, at)

    @property
    def state(self) -> str:
        if self.fatal_last_hour:
            return RED
        return AMBER if self.warning_last_hour or self.fatal else GREEN

    def to_json(self) -> dict:
        return {
            "last_hour": {"fatal": self.fatal_last_hour, "warning": self.warning_last_hour},
            "held": {"fatal": self.fatal, "warning": self.warning},
            "first_ms": self.first_ms,
            "first": iso_utc(self.first_ms),
            "last_ms": self.last_ms,
            "last": iso_utc(self.last_ms),
        }


@dataclass(slots=True)
class _Tally:
    """The incidents counted once, for the whole group, each topic, partition and group."""

    total: Faults = field(default_factory=Faults)
    by_topic: dict[str, Faults] = field(default_factory=dict)
    by_partition: dict[tuple[str, int], Faults] = field(default_factory=dict)
    by_group: dict[tuple[str, int, str], Faults] = field(default_factory=dict)


def _tally(incidents: Iterable[IncidentLike], hour_ago_ms: int) -> _Tally:
    tally = _Tally()
    for incident in incidents:
        tally.total.add(incident, hour_ago_ms)
        tally.by_topic.setdefault(incident.topic, Faults()).add(incident, hour_ago_ms)
        tally.by_partition.setdefault((incident.topic, incident.partition), Faults()).add(incident, hour_ago_ms)
        key = (incident.topic, incident.partition, incident.verdict)
        tally.by_group.setdefault(key, Faults()).add(incident, hour_ago_ms)
    return tally


def partition_state(item: dict, faults: Faults | None) -> str:
    """A partition's state from its /partitions/ item and its incidents."""
    if item.get("push_failed"):
        return RED
    from_faults = faults.state if faults is not None else GREEN
    if item.get("recovering") and from_faults == GREEN:
        return RECOVERING
    return from_faults


def _grid(partitions: list[dict], tally: _Tally) -> dict:
    """Every partition as a cell, by topic; at most MAX_GRID_CELLS of them."""
    topics: dict[str, list[dict]] = {}
    shown = 0
    for item in partitions:
        if shown >= MAX_GRID_CELLS:
            break
        key = (item["topic"], item["partition"])
        faults = tally.by_partition.get(key)
        counts = faults or Faults()
        topics.setdefault(item["topic"], []).append(
            {
                "partition": item["partition"],
                "state": partition_state(item, faults),
                "phase": item.get("phase"),
                "recovering": bool(item.get("recovering")),
                "push_failed": item.get("push_failed"),
                "lag": item.get("lag"),
                "fatal": counts.fatal,
                "warning": counts.warning,
                "first_fault_ms": counts.first_ms,
                "first_fault": iso_utc(counts.first_ms),
                "last_fault_ms": counts.last_ms,
                "last_fault": iso_utc(counts.last_ms),
            }
        )
        shown += 1
    return {
        "total": len(partitions),
        "shown": shown,
        "topics": [{"topic": topic, "partitions": cells} for topic, cells in sorted(topics.items())],
    }


def _groups(tally: _Tally, topic: str | None, partition: int | None, offset: int, limit: int) -> dict:
    """Incidents by topic, partition and class: fatal first, then the latest first."""
    matching = [
        (key, faults)
        for key, faults in tally.by_group.items()
        if (topic is None or key[0] == topic) and (partition is None or key[1] == partition)
    ]
    matching.sort(key=lambda kv: (kv[1].fatal == 0, -(kv[1].last_ms or 0), kv[0]))
    page = matching[offset : offset + limit]
    return {
        "total": len(matching),
        "offset": offset,
        "limit": limit,
        "next_offset": offset + limit if offset + limit < len(matching) else None,
        "items": [
            {
                "topic": t,
                "partition": p,
                "class": verdict,
                "severity": "fatal" if faults.fatal else "warning",
                "count": faults.fatal + faults.warning,
                "fatal": faults.fatal,
                "warning": faults.warning,
                "first_ms": faults.first_ms,
                "first": iso_utc(faults.first_ms),
                "last_ms": faults.last_ms,
                "last": iso_utc(faults.last_ms),
            }
            for (t, p, verdict), faults in page
        ],
    }


def timeline(incidents: Iterable[IncidentLike], now_ms: int, first_ms: int | None) -> dict:
    """Fatal and warning counts per bucket, up to now, from the first held incident (at
    least the last hour): TIMELINE_BUCKETS buckets of the smallest width that holds them."""
    span = max(HOUR_MS, now_ms - first_ms + 1 if first_ms is not None else 0)
    width = next((w for w in BUCKET_WIDTHS_MS if w * TIMELINE_BUCKETS >= span), BUCKET_WIDTHS_MS[-1])
    end = (now_ms // width + 1) * width  # the current bucket is the last one
    start = end - width * TIMELINE_BUCKETS
    fatal, warning = [0] * TIMELINE_BUCKETS, [0] * TIMELINE_BUCKETS
    for incident in incidents:
        at = incident.detected_at_ms
        if start <= at < end:
            (fatal if incident.severity == "fatal" else warning)[(at - start) // width] += 1
    return {
        "bucket_ms": width,
        "start_ms": start,
        "start": iso_utc(start),
        "end_ms": end,
        "end": iso_utc(end),
        "fatal": fatal,
        "warning": warning,
    }


def _summary(reconciliation: dict) -> dict:
    summary = reconciliation.get("summary")
    return summary if isinstance(summary, dict) else {}


def _counts(summary: dict) -> dict[str, int]:
    """A summary's findings per class (summary.json is read from disk: anything else is left out)."""
    counts = summary.get("counts")
    if not isinstance(counts, dict):
        return {}
    numbers = [(cut(str(k), 64), n) for k, n in counts.items() if isinstance(n, int) and not isinstance(n, bool)]
    return dict(numbers[:MAX_FINDING_CLASSES])


def reconciliation_state(reconciliation: dict) -> str:
    """Amber for a run that found discrepancies or did not finish; the run is a past night's,
    so never red by itself. A run of another cluster or of topics since recreated
    (`elsewhere`, kdiv.worker.report_scope) says nothing of the data now: green."""
    if not reconciliation.get("available") or reconciliation.get("elsewhere"):
        return GREEN
    status = _summary(reconciliation).get("status")
    return GREEN if status == "clean" else AMBER


def reason(what: str, topic: str | None = None, partition: int | None = None, since_ms: int | None = None) -> dict:
    """One thing wrong: what, where (topic, partition when it is one's) and since when."""
    return {"what": what, "topic": topic, "partition": partition, "since_ms": since_ms, "since": iso_utc(since_ms)}


def _reasons(
    tally: _Tally, failed_pushes: list[tuple[str, int]], process: str, unavailable: list[str], reconciliation: dict
) -> list[dict]:
    """What makes the state what it is, worst first, each naming where and since when."""
    reasons: list[dict] = []
    for topic, partition in failed_pushes:
        faults = tally.by_partition.get((topic, partition))
        reasons.append(
            reason(f"push failed on {topic}[{partition}]", topic, partition, faults.first_ms if faults else None)
        )
    # The faulty partitions of every topic in one pass (a pass per topic made the answer grow
    # as topics x partitions).
    faulty_of: dict[str, list[int]] = {}
    for (t, p), f in tally.by_partition.items():
        if f.state != GREEN:
            faulty_of.setdefault(t, []).append(p)
    for topic, faults in sorted(tally.by_topic.items(), key=lambda kv: (-_RANK[kv[1].state], kv[0])):
        faulty = sorted(faulty_of.get(topic, ()))
        where = f" on partition{'s' if len(faulty) > 1 else ''} {_some(faulty)}" if faulty else ""
        if faults.fatal_last_hour or faults.warning_last_hour:
            what = (
                f"{topic}: {faults.fatal_last_hour} fatal, {faults.warning_last_hour} warning in the last hour{where}"
            )
            reasons.append(reason(what, topic, None, faults.first_ms))
        elif faults.fatal:
            reasons.append(
                reason(
                    f"{topic}: {faults.fatal} fatal held from before the last hour{where}", topic, None, faults.first_ms
                )
            )
    if process != "ready":
        reasons.append(reason(f"worker {process}"))
    if unavailable:
        reasons.append(reason(f"{len(unavailable)} worker(s) not answering: their partitions are missing"))
    if reconciliation_state(reconciliation) != GREEN:
        summary = _summary(reconciliation)
        findings = sum(_counts(summary).values())
        finished = summary.get("finished_at_ms")
        since = finished if renderable_ms(finished) else None
        reasons.append(reason(f"last reconciliation {summary.get('status')}: {findings} findings", since_ms=since))
    if len(reasons) > MAX_REASONS:
        reasons[MAX_REASONS:] = [reason(f"and {len(reasons) - MAX_REASONS} more")]
    return reasons


def _some(partitions: list[int], shown: int = 6) -> str:
    """Partition numbers, the first few of them."""
    listed = ", ".join(map(str, partitions[:shown]))
    return listed + (f" and {len(partitions) - shown} more" if len(partitions) > shown else "")


def reconciliation_json(reconciliation: dict, report_url: str | None) -> dict:
    """The last run as the overview shows it: its status, findings, time and report."""
    if not reconciliation.get("available"):
        return {"available": False, "message": reconciliation.get("message"), "state": GREEN}
    summary = _summary(reconciliation)
    counts = _counts(summary)
    finished = summary.get("finished_at_ms")
    return {
        "available": True,
        "run": reconciliation.get("run"),
        "status": summary.get("status"),
        "state": reconciliation_state(reconciliation),
        "findings": sum(counts.values()),
        "counts": counts,
        "finished_at_ms": finished if renderable_ms(finished) else None,
        "finished_at": iso_utc(finished) if renderable_ms(finished) else None,
        "error": _error(summary.get("error")),
        "report": report_url,
        # Why the run is not about the data watched now, shown beside it; null when it is.
        "elsewhere": reconciliation.get("elsewhere") or None,
    }


def _error(error: object) -> object:
    """A run's error as summary.json gives it, cut: the file is read from disk."""
    if error is None:
        return None
    return cut(error if isinstance(error, str) else repr(error), MAX_ERROR_CHARS)


@dataclass(frozen=True, slots=True)
class GroupsQuery:
    """Which incident groups the overview lists: a partition's (from a click on the grid) or all."""

    topic: str | None = None
    partition: int | None = None
    offset: int = 0
    limit: int = GROUPS_PAGE


def _topics(tally: _Tally, failed_pushes: list[tuple[str, int]]) -> list[dict]:
    """Each topic's state and counts, by name; past MAX_TOPICS, the worst of them."""
    pushes_failed = {t for t, _ in failed_pushes}
    states = {
        topic: worst(faults.state, RED if topic in pushes_failed else GREEN) for topic, faults in tally.by_topic.items()
    }
    shown = sorted(states, key=lambda topic: (-_RANK[states[topic]], topic))[:MAX_TOPICS]
    return [{"topic": topic, "state": states[topic], **tally.by_topic[topic].to_json()} for topic in sorted(shown)]


def overview(
    incidents: list[IncidentLike],
    partitions: list[dict],
    now_ms: int,
    *,
    process: str,
    unavailable_workers: list[str],
    reconciliation: dict,
    report_url: str | None,
    groups: GroupsQuery,
    stalls: list[dict] | None = None,
) -> dict:
    """The overview's answer: state and reasons, counts by topic, the partition grid, a page
    of incident groups, the chart's buckets and the last reconciliation. `stalls`: reasons
    (`reason`) validation makes no progress, first on the page and red: while validation
    stands still, no count below it can be trusted to be complete."""
    stalls = stalls or []
    hour_ago = now_ms - HOUR_MS
    # Other workers' items: only those with the fields the grid is keyed by, and a topic's name.
    partitions = [
        p
        for p in partitions
        if isinstance(p, dict)
        and isinstance(p.get("topic"), str)
        and len(p["topic"]) <= MAX_CHARS["topic"]
        and isinstance(p.get("partition"), int)
    ]
    tally = _tally(incidents, hour_ago)
    for item in partitions:  # a watched topic without incidents is listed too, as green
        tally.by_topic.setdefault(item["topic"], Faults())
    failed_pushes = [(p["topic"], p["partition"]) for p in partitions if p.get("push_failed")]
    reconcile = reconciliation_json(reconciliation, report_url)
    state = worst(
        tally.total.state,
        RED if failed_pushes or stalls else GREEN,
        AMBER if process != "ready" or unavailable_workers else GREEN,
        reconcile["state"],
    )
    return {
        "now_ms": now_ms,
        "now": iso_utc(now_ms),
        "state": state,
        "stalls": stalls,
        "reasons": (stalls + _reasons(tally, failed_pushes, process, unavailable_workers, reconciliation))[
            : MAX_REASONS + 1
        ],
        "process": process,
        "faults": tally.total.to_json(),
        "failed_pushes": [{"topic": t, "partition": p} for t, p in failed_pushes[:MAX_FAILED_PUSHES]],
        "failed_pushes_total": len(failed_pushes),
        "topics": _topics(tally, failed_pushes),
        "topics_total": len(tally.by_topic),
        "grid": _grid(partitions, tally),
        "groups": _groups(tally, groups.topic, groups.partition, groups.offset, groups.limit),
        "timeline": timeline(incidents, now_ms, tally.total.first_ms),
        "reconciliation": reconcile,
        "unavailable_workers": unavailable_workers,
    }
