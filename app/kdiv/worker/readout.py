"""A running `ValidationWorker`'s read model (`kdiv.worker.readmodel`): each answer read from
the worker's parts at the moment it is asked, as values the views and metrics cannot change
the worker through."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from kdiv.incident.shape import Incident
from kdiv.worker.audit import LATENCY_BUCKETS_MS
from kdiv.worker.progress import Liveness, PartitionProgress
from kdiv.worker.readmodel import (
    AuditRoute,
    AuditSnapshot,
    ChangefeedPartition,
    Counters,
    HopCounts,
    PartitionState,
    ProducerState,
    RecoveryStatus,
    RegistryStatus,
    RestoreTotals,
)

if TYPE_CHECKING:
    from kdiv.div.validator import PartitionValidation
    from kdiv.worker.service import ValidationWorker

_NO_PRODUCERS: Mapping[bytes, ProducerState] = MappingProxyType({})


def partition_state(topic: str, partition: int, part: PartitionValidation) -> PartitionState:
    """The read model's copy of the validator's state of a partition."""
    return PartitionState(
        topic=topic,
        partition=partition,
        in_push=part.in_push,
        push_failed=part.push_failed,
        last_offset=part.last_offset,
        records=part.records,
        verdict_counts=dict(part.verdict_counts),
        untold_gaps=part.untold_gaps,
        producers=len(part.tracker.segments),
        topic_id=part.topic_id,
    )


class WorkerReadout:
    """`WorkerReadModel` of a `ValidationWorker`."""

    def __init__(self, worker: ValidationWorker) -> None:
        self._worker = worker

    @property
    def canonical_url(self) -> str:
        return str(self._worker.app.conf.canonical_url)

    @property
    def reconcile_reports(self) -> Path | None:
        return self._worker.settings.reconcile_reports

    @property
    def cluster_id(self) -> str | None:
        return self._worker.cluster.cluster_id

    def now_ms(self) -> int:
        return self._worker.clock()

    def failed_pushes(self) -> list[tuple[str, int]]:
        return sorted(key for key, part in self._worker.live.validator.partitions.items() if part.push_failed)

    def partition_states(self) -> dict[tuple[str, int], PartitionState]:
        return {
            key: partition_state(*key, part) for key, part in sorted(self._worker.live.validator.partitions.items())
        }

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        part = self._worker.live.validator.partitions.get((topic, partition))
        return None if part is None else partition_state(topic, partition, part)

    def producers_of(self, topic: str, partition: int) -> Mapping[bytes, ProducerState]:
        part = self._worker.live.validator.partitions.get((topic, partition))
        # A view, not a copy: a partition may track 100,000s of producers.
        return _NO_PRODUCERS if part is None else MappingProxyType(part.tracker.segments)

    def assigned_partitions(self) -> list[tuple[str, int]]:
        return self._worker.assigned_partitions()

    def is_loaded(self, topic: str, partition: int) -> bool:
        return self._worker.is_loaded(topic, partition)

    def is_changefeed(self, topic: str) -> bool:
        return topic in self._worker.changefeed_topics

    def changefeed_partition(self, topic: str, partition: int) -> ChangefeedPartition:
        changefeeds = self._worker.changefeeds
        return ChangefeedPartition(
            last_offset=changefeeds.last_offsets.get((topic, partition)),
            records=changefeeds.records[(topic, partition)],
            counts=changefeeds.partition_counts(topic, partition),
        )

    def changefeed_tables(self, topic: str | None, table: str | None) -> list[dict]:
        return self._worker.changefeeds.table_counts(topic, table)

    def changefeed_rows(self) -> dict[tuple[str, str, str], int]:
        by_table: dict[tuple[str, str, str], int] = {}
        for (topic, _partition, table, verdict), count in self._worker.changefeeds.counts.items():
            by_table[(topic, table, verdict)] = by_table.get((topic, table, verdict), 0) + count
        return by_table

    def progress_of(self, topic: str, partition: int) -> PartitionProgress | None:
        return self._worker.progress.of((topic, partition), self._worker.clock())

    def partition_progress(self) -> list[PartitionProgress]:
        return self._worker.partition_progress()

    def liveness(self) -> Liveness:
        return self._worker.liveness()

    def recent_incidents(self) -> Iterator[Incident]:
        return self._worker.recent.newest_first()

    def incidents_read_to(self) -> dict[int, int]:
        return dict(self._worker.incidents_read_to)

    def recovery(self) -> RecoveryStatus:
        status = self._worker.recovery_status()
        return RecoveryStatus(
            in_progress=status["in_progress"],
            active_remaining=status["active_remaining"],
            standby_remaining=status["standby_remaining"],
        )

    def restores(self) -> RestoreTotals:
        restore = self._worker.restore
        totals = restore.totals
        return RestoreTotals(
            records=totals.records,
            batches=totals.batches,
            completed=totals.completed,
            last_duration_ms=totals.last_duration_ms,
            in_progress=len(restore.active),
        )

    def state_schema_ready(self) -> bool:
        return self._worker.state_schema_ready.is_set()

    def state_schema_id(self) -> int:
        return self._worker.values.schema_id

    def state_schema_findings(self) -> list[dict]:
        return [f.to_json() for f in self._worker.state_check.open.values()]

    def load_errors_seen(self) -> int:
        return self._worker.load_errors_seen

    def registry(self) -> RegistryStatus:
        lookups = self._worker.lookups
        configured = lookups.registry.configured
        return RegistryStatus(
            configured=configured,
            # Redacted by the client: no credentials in the URL a view shows.
            url=lookups.registry.url if configured else None,
            available=lookups.available,
            last_error=lookups.stats.last_error,
            requests=lookups.stats.requests,
            failures=lookups.stats.failures,
        )

    def counters(self) -> Counters:
        worker = self._worker
        stats = worker.stats
        return Counters(
            batches=stats.batches,
            incidents_sent=stats.incidents_sent,
            log_rewinds=stats.log_rewinds,
            deletions_before_validation=stats.deletions_before_validation,
            producers_evicted=stats.producers_evicted,
            ledger_entries_sent=stats.ledger_entries_sent,
            state_writes=stats.state_writes,
            replays_skipped=worker.live.replays_skipped,
            bad_incident_records=stats.bad_incident_records,
            schema_checked_records=stats.schema_checked_records,
            schema_unchecked_records=stats.schema_unchecked_records,
            changefeed_registry_waits=worker.changefeeds.registry_waits,
            state_schema_repairs=worker.state_check.repairs,
        )

    def watched_topic_ids(self) -> dict[str, str]:
        parts = self._worker.live.validator.partitions
        return {topic: part.topic_id for (topic, _), part in sorted(parts.items()) if part.topic_id is not None}

    def audit(self) -> AuditSnapshot | None:
        audit = self._worker.audit
        if audit is None:
            return None
        sampling = audit.settings.sampling
        return AuditSnapshot(
            routes=tuple(
                AuditRoute(
                    name=route.name,
                    stages=route.stages,
                    groups=tuple(hop.group for hop in route.hops),
                    sampling_rate=sampling.rate_for(route.stages[0][0]) if sampling is not None else None,
                )
                for route in audit.routes
            ),
            known_groups=audit.known_groups,
            traced=dict(audit.traced),
            hops={
                key: HopCounts(dict(stats.outcomes), tuple(stats.latency_buckets), stats.latency_sum_ms)
                for key, stats in audit.hops.items()
            },
            latency_bounds_ms=LATENCY_BUCKETS_MS,
            open_traces=audit.open_traces(),
            header_errors=audit.header_errors,
            bad_observations=audit.bad_observations,
        )

    def route_open_traces(self, route: str) -> int:
        audit = self._worker.audit
        return 0 if audit is None else audit.open_traces(route)
