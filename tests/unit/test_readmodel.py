"""The worker's read model (`kdiv.worker.readout` over the worker's parts): the values the
views and metrics are given, copies they cannot change the worker through, and no secret."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from multidict import MultiDict

from kdiv.div.faults import Verdict
from kdiv.worker import metrics
from kdiv.worker.audit import LATENCY_BUCKETS_MS
from kdiv.worker.readmodel import PartitionState, WorkerReadModel
from kdiv.worker.readout import WorkerReadout
from kdiv.worker.web import audit, incidents, overview, partitions, producers, status
from kdiv.worker.web.handlers import Site
from kdiv.worker.web.peers import Peers
from tests.harness.streams import GUID_A, GUID_B
from tests.harness.worker_parts import REGISTRY_PASSWORD, reconcile_reports, worker_parts


def _model(**options) -> tuple[SimpleNamespace, WorkerReadModel]:
    parts = worker_parts(**options)
    return parts, WorkerReadout(parts)  # the parts a ValidationWorker has, no Faust app


def test_partition_states_are_in_order_with_their_counts_ok_included_when_there_is_one() -> None:
    _, model = _model()
    states = model.partition_states()
    assert list(states) == [("orders", 0), ("orders", 1), ("payments", 0)]
    pushed = states[("orders", 1)]
    assert pushed == PartitionState(
        topic="orders",
        partition=1,
        in_push=True,
        push_failed=True,
        last_offset=41,
        records=42,
        verdict_counts={Verdict.MISSING: 2, Verdict.UNTRACKED: 3},
        untold_gaps=1,
        producers=2,
        topic_id="topic-id-orders",
    )
    assert pushed.counts == {Verdict.OK: 37, Verdict.MISSING: 2, Verdict.UNTRACKED: 3}
    assert states[("orders", 0)].counts == {Verdict.OK: 10}
    assert states[("payments", 0)].counts == {Verdict.CORRUPT: 2}  # no OK record: no OK count
    assert model.partition_state("orders", 1) == pushed
    assert model.partition_state("orders", 2) is None  # assigned, no state yet


def test_a_partition_state_is_a_copy_of_that_moment() -> None:
    parts, model = _model()
    before = model.partition_states()[("orders", 1)]
    live = parts.live.validator.partitions[("orders", 1)]
    live.verdict_counts[Verdict.MISSING] += 5
    live.records += 5
    assert before.verdict_counts[Verdict.MISSING] == 2 and before.records == 42
    assert model.partition_states()[("orders", 1)].verdict_counts[Verdict.MISSING] == 7


def test_a_partitions_producers_are_read_only_and_current() -> None:
    parts, model = _model()
    producers_here = model.producers_of("orders", 1)
    assert set(producers_here) == {GUID_A, GUID_B}
    assert isinstance(producers_here[GUID_B], bytes)  # kept packed, shown unpacked by the views
    with pytest.raises(TypeError):
        producers_here[GUID_A] = b""  # type: ignore[index]
    del parts.live.validator.partitions[("orders", 1)].tracker.segments[GUID_B]
    assert set(producers_here) == {GUID_A}
    assert dict(model.producers_of("orders", 2)) == {}


def test_changefeed_rows_are_summed_over_partitions_per_topic_table_and_verdict() -> None:
    _, model = _model()
    assert model.changefeed_rows() == {("cf", "db.users", "OK"): 7, ("cf", "db.items", "CORRUPT"): 1}
    here = model.changefeed_partition("cf", 0)
    assert (here.last_offset, here.records, here.counts) == (77, 6, {"OK": 5, "CORRUPT": 1})
    elsewhere = model.changefeed_partition("cf", 5)
    assert (elsewhere.last_offset, elsewhere.records, elsewhere.counts) == (None, 0, {})
    assert model.is_changefeed("cf") and not model.is_changefeed("orders")


def test_the_registry_url_is_shown_without_its_credentials_and_not_at_all_when_not_configured() -> None:
    _, model = _model()
    registry = model.registry()
    assert registry.url == "https://registry.example:8081" and REGISTRY_PASSWORD not in repr(registry)
    assert (registry.configured, registry.available, registry.requests, registry.failures) == (True, True, 9, 1)
    _, without = _model(configured_registry=False)
    assert (without.registry().configured, without.registry().url) == (False, None)


def test_counters_restores_and_recovery_come_from_their_parts() -> None:
    _, model = _model()
    counters = model.counters()
    assert (counters.batches, counters.incidents_sent, counters.log_rewinds) == (101, 102, 103)
    assert (counters.deletions_before_validation, counters.producers_evicted) == (104, 105)
    assert (counters.ledger_entries_sent, counters.state_writes, counters.bad_incident_records) == (106, 107, 108)
    assert (counters.schema_checked_records, counters.schema_unchecked_records) == (109, 110)
    assert (counters.replays_skipped, counters.changefeed_registry_waits, counters.state_schema_repairs) == (11, 3, 2)
    restores = model.restores()
    assert (restores.records, restores.batches, restores.completed) == (100, 4, 2)
    assert (restores.last_duration_ms, restores.in_progress) == (1_500, 1)
    assert model.recovery() == {"in_progress": False, "active_remaining": 0, "standby_remaining": 5}
    assert model.state_schema_findings() == [{"class": "SUBJECT_MISMATCH", "schema_id": 12}]
    assert (model.state_schema_ready(), model.state_schema_id(), model.load_errors_seen()) == (True, 7, 1)


def test_watched_topic_ids_are_those_the_partitions_last_saw() -> None:
    parts, model = _model()
    assert model.watched_topic_ids() == {"orders": "topic-id-orders"}
    parts.live.validator.partitions[("payments", 0)].topic_id = "topic-id-payments"
    assert model.watched_topic_ids() == {"orders": "topic-id-orders", "payments": "topic-id-payments"}


def test_the_audit_snapshot_names_each_routes_hops_sampling_and_counts() -> None:
    parts, model = _model()
    snapshot = model.audit()
    assert snapshot is not None
    flow, fan = snapshot.routes
    assert (flow.name, flow.groups, flow.sampling_rate) == ("flow", ("enricher", "shipper"), 0.25)
    assert flow.stages == (("orders",), ("enriched",), ("shipped",))
    assert (fan.name, fan.groups, fan.stages) == ("fan", ("mailer",), (("orders",), ("mailed",)))
    assert snapshot.known_groups == frozenset({"enricher", "mailer"})
    assert snapshot.traced[("flow", 1)] == 6 and snapshot.latency_bounds_ms == LATENCY_BUCKETS_MS
    judged = snapshot.hops[("flow", 1)]
    assert judged.outcomes == {"DELIVERED": 5, "LOST": 1, "DUPLICATED": 1} and judged.latency_sum_ms == 730
    assert sum(judged.latency_buckets) == 2 and len(judged.latency_buckets) == len(LATENCY_BUCKETS_MS) + 1
    # A copy: what the audit counts next is the next snapshot's.
    parts.audit.hops[("flow", 1)].add_latency(5)
    parts.audit.traced[("flow", 1)] += 1
    assert sum(judged.latency_buckets) == 2 and snapshot.traced[("flow", 1)] == 6
    assert (snapshot.open_traces, model.route_open_traces("flow"), model.route_open_traces("fan")) == (3, 2, 1)
    assert (snapshot.header_errors, snapshot.bad_observations) == (0, 0)
    without = _model(audit=False)[1]
    assert without.audit() is None and without.route_open_traces("flow") == 0


def test_the_metrics_histogram_uses_the_snapshots_bounds() -> None:
    _, model = _model()
    text = metrics.render(model).decode()
    assert 'kdiv_trace_hop_latency_ms_bucket{hop="1",le="50",route="flow"} 1.0' in text
    assert 'kdiv_trace_hop_latency_ms_bucket{hop="1",le="1000",route="flow"} 2.0' in text
    assert 'kdiv_changefeed_rows_total{table="db.users",topic="cf",verdict="OK"} 7.0' in text
    assert "kdiv_restores_in_progress 1.0" in text and "kdiv_replays_skipped_total 11.0" in text


def _request(**query: str) -> Any:
    """What the views read of an aiohttp request."""
    return SimpleNamespace(query=MultiDict(query), path="/", url="/")


def test_no_view_shows_the_registrys_password(tmp_path: Path) -> None:
    parts, model = _model(reports=reconcile_reports(tmp_path / "reports"))
    parts.app.assignor = SimpleNamespace(external_topics_metadata=dict)  # no peers
    site = Site(parts.app, model, Peers(parts.app, "", ()))
    answers = [
        asyncio.run(view(site, _request(), **path))
        for view, path in (
            (status.health_view, {}),
            (status.metrics_view, {}),
            (status.reconcile_view, {}),
            (overview.overview_view, {}),
            (partitions.partitions_view, {}),
            (partitions.changefeeds_view, {}),
            (producers.producers_view, {}),
            (producers.producer_view, {"guid": GUID_A.hex()}),
            (incidents.incidents_view, {}),
            (audit.routes_view, {}),
        )
    ]
    assert all(answer.status in (200, 503) for answer in answers), [a.status for a in answers]
    shown = [a.body.decode() if isinstance(a.body, bytes) else json.dumps(a.body) for a in answers]
    assert all(REGISTRY_PASSWORD not in text for text in shown)
    assert '"url": "https://registry.example:8081"' in shown[0]


@pytest.mark.parametrize("restore_stalled", [False, True])
def test_a_restore_that_moves_is_recovering_and_one_that_stands_still_is_stalled(restore_stalled: bool) -> None:
    parts, model = _model()
    parts.recovery_status = lambda: {"in_progress": True, "active_remaining": 4400, "standby_remaining": 0}
    base = parts.liveness()
    parts.liveness = lambda: replace(
        base,
        commit_failing_ms=0,
        commit_failing_since_ms=None,
        restore_stalled_since_ms=1_700_000_000_000 if restore_stalled else None,
        restore_remaining=4400 if restore_stalled else None,
    )
    code, body = status.health(model)
    assert (code, body["status"]) == (503, "stalled" if restore_stalled else "recovering")
    said = [reason for reason in body["reasons"] if reason.startswith("restoring the tables stalled since")]
    wanted = "restoring the tables stalled since 2023-11-14T22:13:20.000Z: 4400 changelog records left"
    assert said == ([wanted] if restore_stalled else [])


@pytest.mark.parametrize("configured_registry", [True, False])
def test_before_the_state_schema_is_registered_a_worker_without_a_registry_is_recovering(
    configured_registry: bool,
) -> None:
    """The state schema is registered once the tables are restored: with no registry set, a
    worker restoring its tables is recovering, not waiting for a registry it will never ask;
    with one, it waits for it once the restore is done."""
    parts, model = _model(configured_registry=configured_registry)
    parts.state_schema_ready.clear()
    code, body = status.health(model)
    assert (code, body["status"]) == (503, "waiting_for_registry" if configured_registry else "recovering")
    assert body["schema_registry"]["state_schema_id"] is None
    parts.recovery_status = lambda: {"in_progress": True, "active_remaining": 10, "standby_remaining": 0}
    code, body = status.health(model)
    assert (code, body["status"]) == (503, "recovering")
