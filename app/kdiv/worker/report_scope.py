"""Whether a reconciliation report is about the data a worker watches now: a report of
another cluster (its cluster id differs from the worker's), or one that read topics since
deleted and created again (their topic ids differ), is from elsewhere or from before, never a
current reason to worry. Pure: the caller passes the report's summary, read from disk
(untrusted: odd values are no evidence), and what the worker knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Topics named before "and N more".
_SHOWN = 4


def elsewhere(summary: Mapping[str, Any], cluster_id: str | None, topic_ids: Mapping[str, str]) -> str | None:
    """Why the report is not about the data the worker watches now, or None when it is (or
    nothing says otherwise: a report or a worker without ids). `topic_ids`: the worker's
    watched topics' current ids, those it knows."""
    reported_cluster = summary.get("cluster_id")
    if isinstance(reported_cluster, str) and cluster_id is not None and reported_cluster != cluster_id:
        return f"from another cluster: the report read cluster {reported_cluster}, this worker's is {cluster_id}"
    reported_ids = summary.get("topic_ids")
    if not isinstance(reported_ids, Mapping):
        return None
    recreated = sorted(
        topic
        for topic, topic_id in reported_ids.items()
        if isinstance(topic, str) and isinstance(topic_id, str) and topic_ids.get(topic, topic_id) != topic_id
    )
    if not recreated:
        return None
    named = ", ".join(recreated[:_SHOWN]) + (f" and {len(recreated) - _SHOWN} more" if len(recreated) > _SHOWN else "")
    return f"from a previous run: {named} {'was' if len(recreated) == 1 else 'were'} deleted and created again since"
