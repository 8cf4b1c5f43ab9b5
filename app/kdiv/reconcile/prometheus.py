"""The reconciliation's outcome as Prometheus gauges, for alerting on the nightly run.

Two ways out: a file for node_exporter's textfile collector (`write_textfile`) or a
Pushgateway (`push`). Both publish a fresh registry built from the run's summary alone, so
a topic the run no longer covers loses its series instead of keeping an old value.

Gauges:
  kdiv_reconcile_status                       0 clean, 1 discrepancies, 2 failed
  kdiv_reconcile_discrepancies{topic,class}   finding rows, zeros included (absent for a failed run)
  kdiv_reconcile_records_read{topic}          records read from the topic's snapshot
  kdiv_reconcile_last_run_timestamp_seconds   when the run finished
  kdiv_reconcile_duration_seconds             the run's wall time
  kdiv_reconcile_snapshot_timestamp_seconds   when the topics' offsets were snapshotted
  kdiv_reconcile_changefeed_rows{topic,table,verdict}
                                              changefeed row images verified, per verdict
  kdiv_reconcile_route_traces{route,hop,outcome}
                                              traces per route hop: TRACED (seen at its input),
                                              DELIVERED (last hop), LOST, DUPLICATED, PENDING

The summary (summary.json, as kdiv.reconcile.report writes it):
  status          "clean", "discrepancies" or "failed"                          required
  finished_at_ms  when the run ended, ms since the epoch                         required
  duration_s      the run's wall time in seconds                                 required
  exit_code       the job's process exit code
  snapshot        {"taken_at_ms": ms since the epoch, ...}; absent when the run failed before it
  topics          names of the topics the run covered
  records_read    {topic: records read}
  by_topic        {topic: {class: finding rows}}               written by report.write_report
  counts          {class: finding rows}                        written by report.write_report
  changefeeds     {topic: {"tables": {table: {verdict: rows}}, ...}}  (kdiv.reconcile.changefeeds)
  routes          {route: {"hops": [{"hop", "traced_in", "delivered", "lost", "duplicated",
                  "pending", ...}], ...}}                       (kdiv.reconcile.routes)
  records         {class: records the findings stand for}      written by report.write_report
  error           what went wrong, for a failed run
Optional keys that are absent leave their gauge without a sample rather than report a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    push_to_gateway,
    write_to_textfile,
)

STATUS_VALUES = {"clean": 0, "discrepancies": 1, "failed": 2}
DEFAULT_JOB = "kdiv_reconcile"


def build_registry(summary: Mapping[str, Any]) -> CollectorRegistry:
    """A new registry holding the summary's gauges; raises KeyError or ValueError when a
    required key is missing or the status is unknown."""
    status = summary["status"]
    if status not in STATUS_VALUES:
        raise ValueError(f"summary status {status!r} is none of {tuple(STATUS_VALUES)}")
    registry = CollectorRegistry()

    Gauge(
        "kdiv_reconcile_status",
        "Outcome of the last reconciliation: 0 clean, 1 discrepancies, 2 failed",
        registry=registry,
    ).set(STATUS_VALUES[status])
    Gauge("kdiv_reconcile_last_run_timestamp_seconds", "When the last reconciliation finished", registry=registry).set(
        summary["finished_at_ms"] / 1000
    )
    Gauge("kdiv_reconcile_duration_seconds", "Wall time of the last reconciliation", registry=registry).set(
        summary["duration_s"]
    )

    taken_at_ms = (summary.get("snapshot") or {}).get("taken_at_ms")
    # Not registered at all without a snapshot: an unset gauge would read 0, i.e. 1970.
    if taken_at_ms is not None:
        Gauge(
            "kdiv_reconcile_snapshot_timestamp_seconds",
            "When the last reconciliation snapshotted the topics' offsets",
            registry=registry,
        ).set(taken_at_ms / 1000)

    records_read = Gauge(
        "kdiv_reconcile_records_read", "Records the last reconciliation read, per topic", ["topic"], registry=registry
    )
    for topic, records in sorted((summary.get("records_read") or {}).items()):
        records_read.labels(topic).set(records)

    discrepancies = Gauge(
        "kdiv_reconcile_discrepancies",
        "Findings (rows) of the last reconciliation, per topic and class",
        ["topic", "class"],
        registry=registry,
    )
    for topic, per_class in sorted((summary.get("by_topic") or {}).items()):
        for cls, findings in sorted(per_class.items()):
            discrepancies.labels(topic, cls).set(findings)

    changefeed_rows = Gauge(
        "kdiv_reconcile_changefeed_rows",
        "Changefeed row images the last reconciliation verified, per topic, table and verdict",
        ["topic", "table", "verdict"],
        registry=registry,
    )
    for topic, entry in sorted((summary.get("changefeeds") or {}).items()):
        for table, per_verdict in sorted((entry.get("tables") or {}).items()):
            for verdict, rows in sorted(per_verdict.items()):
                changefeed_rows.labels(topic, table, verdict).set(rows)

    route_traces = Gauge(
        "kdiv_reconcile_route_traces",
        "Traces of the last reconciliation per route hop: TRACED seen at its input, DELIVERED (last hop), "
        "LOST, DUPLICATED, PENDING (waiting on the hop)",
        ["route", "hop", "outcome"],
        registry=registry,
    )
    for route, entry in sorted((summary.get("routes") or {}).items()):
        for hop in entry.get("hops") or ():
            for outcome, key in _HOP_OUTCOMES:
                route_traces.labels(route, str(hop["hop"]), outcome).set(hop.get(key, 0))
    return registry


# Gauge outcome label -> the hop's key in summary["routes"].
_HOP_OUTCOMES = (
    ("TRACED", "traced_in"),
    ("DELIVERED", "delivered"),
    ("LOST", "lost"),
    ("DUPLICATED", "duplicated"),
    ("PENDING", "pending"),
)


def write_textfile(summary: Mapping[str, Any], path: str | PathLike[str]) -> None:
    """Write the gauges for node_exporter's textfile collector. The collector reads only
    files named *.prom; the file is replaced atomically, so it never sees half of one."""
    write_to_textfile(str(path), build_registry(summary))


def push(summary: Mapping[str, Any], gateway_url: str, job: str = DEFAULT_JOB, *, timeout: float = 30.0) -> None:
    """Push the gauges to a Pushgateway, replacing everything pushed before under `job`
    (an HTTP PUT), so no series of an earlier run lingers."""
    push_to_gateway(gateway_url, job=job, registry=build_registry(summary), timeout=timeout)
