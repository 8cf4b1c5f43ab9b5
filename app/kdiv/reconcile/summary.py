"""The run's summary as summary.json holds it (its keys: see kdiv.reconcile.prometheus).

The job gives what it knows of the run; the findings add `counts` {class: finding rows},
`records` {class: records the findings stand for} and `by_topic` {topic: {class: finding
rows}}, and settle `status`. The counts arrive aggregated (kdiv.reconcile.aggregates); nothing
here touches a DataFrame or a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdiv.reconcile.findings import BACKLOG_CLASSES, CHECKSUM_CLASSES, CLASSES, ROUTE_CLASSES

STATUS_CLEAN = "clean"
STATUS_DISCREPANCIES = "discrepancies"
STATUS_FAILED = "failed"
STATUSES = (STATUS_CLEAN, STATUS_DISCREPANCIES, STATUS_FAILED)

# summary["incidents"]["status"] (kdiv.reconcile.incidents): counted; no such topic on the
# cluster; the read failed; the snapshot (one saved before incidents were read with it) lacks it.
INCIDENTS_READ = "read"
INCIDENTS_MISSING = "missing"
INCIDENTS_UNREADABLE = "unreadable"
INCIDENTS_NOT_IN_SNAPSHOT = "not_in_snapshot"


@dataclass(frozen=True, order=True)
class ClassCount:
    """The findings of one class on one topic: finding rows, and the records they stand for."""

    topic: str
    cls: str
    findings: int
    records: int


def summary_with_counts(summary: Mapping[str, Any], class_counts: Sequence[ClassCount]) -> dict[str, Any]:
    """`summary` with counts, records, by_topic and status; raises ValueError when the status
    it gives is unknown or contradicts the counts ("clean" with findings, "discrepancies"
    without)."""
    classes = classes_present(
        (c.cls for c in class_counts),
        checksums="changefeeds" in summary,
        routes="routes" in summary,
        backlog=(summary.get("not_validated") or {}).get("status") == "checked",
    )
    counts = dict.fromkeys(classes, 0)
    records = dict.fromkeys(classes, 0)
    # Every topic the run covered, zeros included, so a gauge falls back to 0 when its
    # discrepancies are gone instead of vanishing.
    by_topic = {topic: dict.fromkeys(classes, 0) for topic in run_topics(summary)}
    for c in class_counts:
        counts[c.cls] += c.findings
        records[c.cls] += c.records
        by_topic.setdefault(c.topic, dict.fromkeys(classes, 0))[c.cls] += c.findings
    total = sum(counts.values())
    found = STATUS_DISCREPANCIES if total else STATUS_CLEAN
    status = summary.get("status", found)
    if status not in STATUSES:
        raise ValueError(f"summary status {status!r} is none of {STATUSES}")
    if status != STATUS_FAILED and status != found:
        raise ValueError(f"summary status {status!r} contradicts the findings: {total} finding rows")
    return {**summary, "status": status, "counts": counts, "records": records, "by_topic": by_topic}


def classes_present(
    found: Iterable[str], checksums: bool = False, routes: bool = False, backlog: bool = False
) -> list[str]:
    """CLASSES in their order (then BACKLOG_CLASSES, for a run that compared the topics with
    the worker's committed offsets, CHECKSUM_CLASSES, for one that verified changefeeds, and
    ROUTE_CLASSES, for one that checked routes), then any other class the findings carry: a
    class this module does not know is still reported, never dropped."""
    known = [
        *CLASSES,
        *(BACKLOG_CLASSES if backlog else ()),
        *(CHECKSUM_CLASSES if checksums else ()),
        *(ROUTE_CLASSES if routes else ()),
    ]
    return [*known, *sorted(set(found) - set(known))]


def run_topics(summary: Mapping[str, Any]) -> list[str]:
    """The topics the run covered: those it read, and those it names."""
    topics = set(summary.get("records_read") or {})
    topics.update(summary.get("topics") or ())
    return sorted(topics)


def summary_json(summary: Mapping[str, Any]) -> str:
    # Sorted keys, so two nights' summaries diff cleanly; a NaN is refused rather than written
    # as JSON that strict readers reject.
    return json.dumps(summary, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
