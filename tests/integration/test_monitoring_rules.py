"""docker/'s alert rules and Grafana dashboard ask only for metrics kdiv exports.

No promtool here: every PromQL expression's metric names are taken out and looked up in
what a real worker serves on /metrics and what the reconciliation's textfile holds.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import aiohttp
import yaml
from prometheus_client import generate_latest

from kdiv.reconcile.prometheus import build_registry
from tests.harness.broker import produce_with_faults_for, wait_until_caught_up
from tests.harness.processes import WorkerProcess, free_port

DOCKER = Path(__file__).resolve().parents[2] / "docker"
# PromQL's functions and keywords, which look like names; and the series Prometheus makes itself.
PROMQL_WORDS = {"time", "sum", "max", "min", "rate", "increase", "and", "or", "unless"}
PROMETHEUS_SERIES = {"up"}
_QUOTED = re.compile(r'"[^"]*"')


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects (label values and label names left out)."""
    bare = _QUOTED.sub('""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)  # label matchers
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", bare)  # grouping labels
    bare = re.sub(r"\[[^\]]*\]", "[]", bare)  # ranges
    return {name for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare) if name not in PROMQL_WORDS}


def exported(text: str) -> set[str]:
    """The series names of the samples, and of every declared family (a family may have no
    sample yet: no trace judged, no changefeed row read)."""
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names |= {name + suffix for suffix in suffixes}
    return names


def rule_expressions() -> dict[str, str]:
    rules = yaml.safe_load((DOCKER / "prometheus" / "alerts.yml").read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def dashboard_expressions() -> dict[str, str]:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "kdiv.json").read_text())
    return {
        f"{panel['title']} / {target['refId']}": target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    }


def test_the_name_parser_finds_names_and_only_names():
    assert metric_names('sum by (topic, class) (increase(kdiv_faults_total{job="kdiv"}[5m])) > 0') == {
        "kdiv_faults_total"
    }
    assert metric_names("time() - kdiv_reconcile_last_run_timestamp_seconds > 26 * 3600") == {
        "kdiv_reconcile_last_run_timestamp_seconds"
    }


async def test_every_rule_and_panel_asks_for_metrics_that_exist(bootstrap, topic_factory, tmp_path):
    topic, sink, changefeed = topic_factory(2), topic_factory(2), topic_factory(1)
    app_id = f"mon-{uuid.uuid4().hex[:8]}"
    # With a route and a changefeed: their families are declared only when configured.
    worker = WorkerProcess(
        "mon",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        web_port=free_port(),
        env={
            "KDIV_ROUTES": f"mon={topic}>mon-processor>{sink}",
            "KDIV_TICDC_TOPICS": changefeed,
            "KDIV_TICDC_PROTOCOL": "simple",
        },
    )
    try:
        worker.start()
        await worker.wait_ready()
        await produce_with_faults_for(bootstrap, topic, 1.5, rate=300, fault_every=10)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        async with aiohttp.ClientSession() as session, session.get(f"{worker.url}/metrics") as response:
            worker_metrics = exported(await response.text())
    finally:
        worker.terminate()
    summary = {"status": "discrepancies", "finished_at_ms": 1, "duration_s": 1.0, "snapshot": {"taken_at_ms": 1}}
    summary |= {"topics": [topic], "records_read": {topic: 1}, "counts": {"LOST": 1}, "by_topic": {topic: {"LOST": 1}}}
    reconcile_metrics = exported(generate_latest(build_registry(summary)).decode())
    known = worker_metrics | reconcile_metrics | PROMETHEUS_SERIES
    assert {"kdiv_faults_total", "kdiv_reconcile_status", "kdiv_trace_outcomes_total"} <= known

    expressions = {**rule_expressions(), **dashboard_expressions()}
    assert len(expressions) >= 20
    unknown = {where: sorted(metric_names(expr) - known) for where, expr in expressions.items()}
    assert {where: names for where, names in unknown.items() if names} == {}
    assert all(metric_names(expr) for expr in expressions.values())
