"""Prometheus metrics of one worker, read from its live state at scrape time.

A collector rather than counters updated per record: the validator already counts per
partition, and the hot path stays free of metric calls.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from kdiv.div.faults import Verdict
from kdiv.worker.readmodel import AuditSnapshot, WorkerReadModel

# aiohttp sets the charset itself and refuses one here.
CONTENT_TYPE = "text/plain; version=0.0.4"
_TP = ["topic", "partition"]


class WorkerCollector:
    """Prometheus collector reading the worker's live state at each scrape."""

    def __init__(self, worker: WorkerReadModel) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        """The metric families of this scrape."""
        worker = self.worker
        validated = CounterMetricFamily("kdiv_records_validated", "Records validated, per partition", labels=_TP)
        faults = CounterMetricFamily(
            "kdiv_faults",
            "Records judged other than OK or UNTRACKED, per partition and class",
            labels=[*_TP, "class"],
        )
        untracked = CounterMetricFamily("kdiv_records_untracked", "Records without a div header", labels=_TP)
        untold = CounterMetricFamily(
            "kdiv_compaction_gaps_untold",
            "Gaps in a compacted topic reported MISSING because the offset holes that would show compaction "
            "made them are not known (compaction or loss, which cannot be told), per partition",
            labels=_TP,
        )
        producers = GaugeMetricFamily("kdiv_producers_tracked", "Producers with state, per partition", labels=_TP)
        in_push = GaugeMetricFamily("kdiv_partition_in_push", "1 between START_OF_PUSH and END_OF_PUSH", labels=_TP)
        push_failed = GaugeMetricFamily("kdiv_push_failed", "1 when the last push had a fatal fault", labels=_TP)
        lag = GaugeMetricFamily(
            "kdiv_consumer_lag",
            "Records not yet validated, up to the partition's true log end (ListOffsets)",
            labels=_TP,
        )
        lag_age = GaugeMetricFamily(
            "kdiv_lag_age_seconds", "Age of the oldest record not yet validated, at most (0: none)", labels=_TP
        )
        committed = GaugeMetricFamily(
            "kdiv_validated_offset",
            "The next offset to validate: every record before it is validated and committed",
            labels=_TP,
        )
        log_end = GaugeMetricFamily(
            "kdiv_log_end_offset", "The partition's true log end, as last read (ListOffsets)", labels=_TP
        )
        stalled = GaugeMetricFamily(
            "kdiv_partition_stalled",
            "1 while the partition has records not validated and no progress for KDIV_STALL_S",
            labels=_TP,
        )
        recovering = GaugeMetricFamily(
            "kdiv_partition_recovering",
            "Per partition assigned to this worker: 1 while its state is being restored, 0 once loaded "
            "(a changefeed partition has none: 0 once assigned)",
            labels=_TP,
        )
        loaded = worker.partition_states()
        changefeed_partitions = []
        for topic, partition in worker.assigned_partitions():
            recovering.add_metric([topic, str(partition)], int(not worker.is_loaded(topic, partition)))
            if worker.is_changefeed(topic):
                changefeed_partitions.append((topic, partition))
        for (topic, partition), part in loaded.items():
            labels = [topic, str(partition)]
            validated.add_metric(labels, part.records)
            for verdict, count in sorted(part.verdict_counts.items(), key=lambda item: item[0].value):
                if verdict is Verdict.UNTRACKED:
                    untracked.add_metric(labels, count)
                else:
                    faults.add_metric([*labels, verdict.value], count)
            if part.untold_gaps:
                untold.add_metric(labels, part.untold_gaps)
            producers.add_metric(labels, part.producers)
            in_push.add_metric(labels, int(part.in_push))
            push_failed.add_metric(labels, int(part.push_failed))
        # Changefeed partitions: rows verified by checksum (by verdict in kdiv_changefeed_rows).
        for topic, partition in changefeed_partitions:
            validated.add_metric([topic, str(partition)], worker.changefeed_partition(topic, partition).records)
        for measured in worker.partition_progress():
            labels = [measured.topic, str(measured.partition)]
            stalled.add_metric(labels, int(measured.stalled))
            if measured.validated is not None:
                committed.add_metric(labels, measured.validated)
            if measured.log_end is not None:
                log_end.add_metric(labels, measured.log_end)
            if measured.lag is not None:
                lag.add_metric(labels, measured.lag)
                lag_age.add_metric(labels, (measured.lag_age_ms or 0) / 1000)
        yield from (
            validated,
            faults,
            untracked,
            untold,
            producers,
            in_push,
            push_failed,
            lag,
            lag_age,
            committed,
            log_end,
            stalled,
            recovering,
        )

        rows = CounterMetricFamily(
            "kdiv_changefeed_rows",
            "TiCDC changefeed row images verified by checksum, per topic, table and verdict",
            labels=["topic", "table", "verdict"],
        )
        for (topic, table, verdict_name), count in sorted(worker.changefeed_rows().items()):
            rows.add_metric([topic, table, verdict_name], count)
        yield rows

        audit = worker.audit()
        if audit is not None:
            yield from _audit_metrics(audit)

        stats = worker.counters()
        registry = worker.registry()
        restores = worker.restores()
        for name, help_text, value in (
            ("kdiv_batches", "Batches validated", stats.batches),
            ("kdiv_incidents_sent", "Incidents written to the incidents topic", stats.incidents_sent),
            (
                "kdiv_log_rewinds",
                "Partition logs found rewound under validated offsets (LOG_REWOUND)",
                stats.log_rewinds,
            ),
            (
                "kdiv_deletions_before_validation",
                "Offset ranges deleted from a partition's log before they were validated (DELETED_BEFORE_VALIDATION)",
                stats.deletions_before_validation,
            ),
            (
                "kdiv_producers_evicted",
                "Producers forgotten over KDIV_PRODUCERS_LIMIT (PRODUCERS_LIMIT incidents)",
                stats.producers_evicted,
            ),
            ("kdiv_ledger_entries_sent", "Key ledger entries written (compacted topics)", stats.ledger_entries_sent),
            ("kdiv_state_writes", "Units of state written to the tables", stats.state_writes),
            (
                "kdiv_replays_skipped",
                "Re-delivered records whose effect was already saved",
                stats.replays_skipped,
            ),
            ("kdiv_bad_incident_records", "Unreadable records in the incidents topic", stats.bad_incident_records),
            ("kdiv_schema_checked_records", "Framed records whose schema id was checked", stats.schema_checked_records),
            (
                "kdiv_schema_unchecked_records",
                "Framed records left unchecked: the registry could not answer",
                stats.schema_unchecked_records,
            ),
            (
                "kdiv_changefeed_registry_waits",
                "Waits for the registry before a changefeed writer schema could be read",
                stats.changefeed_registry_waits,
            ),
            ("kdiv_schema_registry_requests", "Requests to the Schema Registry", registry.requests),
            (
                "kdiv_schema_registry_failures",
                "Registry requests without a usable answer",
                registry.failures,
            ),
            (
                "kdiv_state_schema_repairs",
                "State schemas registered under their changelog subject by kdiv",
                stats.state_schema_repairs,
            ),
            (
                "kdiv_restore_records",
                "Changelog records applied to the state store (restores and standbys)",
                restores.records,
            ),
            ("kdiv_restore_batches", "Changelog batches applied to the state store", restores.batches),
            (
                "kdiv_restores_completed",
                "Changelog partitions whose active restore completed",
                restores.completed,
            ),
        ):
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], value)
            yield counter

        recovery = worker.recovery()
        liveness = worker.liveness()
        gauges: tuple[tuple[str, str, float], ...] = (
            (
                "kdiv_progress_unknown",
                "1 while the true log ends could not be read for KDIV_STALL_S (progress not measured)",
                int(liveness.blind),
            ),
            (
                "kdiv_restore_stalled",
                "1 while restoring the tables has made no progress for KDIV_STALL_S",
                int(liveness.restore_stalled_since_ms is not None),
            ),
            (
                "kdiv_commit_failing_seconds",
                "How long commits have been failing and tried again (0: the last one was written)",
                liveness.commit_failing_ms / 1000,
            ),
            ("kdiv_recovery_in_progress", "1 while tables are being restored", int(recovery["in_progress"])),
            ("kdiv_recovery_active_remaining", "Changelog records left to restore", recovery["active_remaining"]),
            ("kdiv_recovery_standby_remaining", "Changelog records standbys are behind", recovery["standby_remaining"]),
            (
                "kdiv_restore_last_duration_seconds",
                "Duration of the last completed partition restore",
                restores.last_duration_ms / 1000,
            ),
            (
                "kdiv_restores_in_progress",
                "Changelog partitions being restored or replicated now",
                restores.in_progress,
            ),
            (
                "kdiv_state_schema_findings",
                "Open SUBJECT_MISMATCH / SCHEMA_UNKNOWN findings in the state",
                len(worker.state_schema_findings()),
            ),
            (
                "kdiv_schema_registry_available",
                "0 while the registry is backed off after a failure",
                int(registry.available),
            ),
        )
        for name, help_text, gauge_value in gauges:
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], gauge_value)
            yield gauge


def _audit_metrics(audit: AuditSnapshot) -> Iterator[Metric]:
    """The pipeline audit's counters per route and hop (of traced records only)."""
    observed = CounterMetricFamily(
        "kdiv_trace_observations", "Traced records seen per route and stage", labels=["route", "stage"]
    )
    for (route, stage), count in sorted(audit.traced.items()):
        observed.add_metric([route, str(stage)], count)
    outcomes = CounterMetricFamily(
        "kdiv_trace_outcomes",
        "Traces judged per route and hop: DELIVERED (at the route's end), LOST, DUPLICATED, UNRESOLVED",
        labels=["route", "hop", "outcome"],
    )
    latency = HistogramMetricFamily(
        "kdiv_trace_hop_latency_ms", "Per hop: output record timestamp minus input's", labels=["route", "hop"]
    )
    for (route, hop), stats in sorted(audit.hops.items()):
        for outcome, count in sorted(stats.outcomes.items()):
            outcomes.add_metric([route, str(hop), outcome], count)
        if any(stats.latency_buckets):
            cumulative, buckets = 0, []
            for bound, count in zip((*audit.latency_bounds_ms, float("inf")), stats.latency_buckets, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
            latency.add_metric([route, str(hop)], buckets, stats.latency_sum_ms)
    yield from (observed, outcomes, latency)
    for name, help_text, value, kind in (
        ("kdiv_trace_open", "Traces awaiting a verdict on this worker", audit.open_traces, GaugeMetricFamily),
        (
            "kdiv_trace_header_errors",
            "Unreadable trace headers on route topics",
            audit.header_errors,
            CounterMetricFamily,
        ),
        (
            "kdiv_trace_bad_observations",
            "Unreadable observations or saved traces",
            audit.bad_observations,
            CounterMetricFamily,
        ),
    ):
        family = kind(name, help_text)
        family.add_metric([], value)
        yield family


def render(worker: WorkerReadModel) -> bytes:
    """The worker's metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    return generate_latest(registry)
