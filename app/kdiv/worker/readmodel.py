"""What the worker's web views and metrics read of it: a `WorkerReadModel`, whose methods
give plain values (these dataclasses, `PartitionProgress`, `Liveness`, incidents), never
the worker's parts to reach into. `kdiv.worker.readout` reads them from a running
`ValidationWorker`; the views and metrics know only this module (an import contract).

Light on purpose: value types only, so what imports it loads no validator, table or client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

from kdiv.div.faults import Verdict
from kdiv.div.segment import Segment
from kdiv.incident.shape import Incident
from kdiv.worker.progress import Liveness, PartitionProgress

# A producer's state as a partition keeps it: unpacked, or packed while idle (`Segment.unpack`).
ProducerState = Segment | bytes


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What the DIV validator holds of one (topic, partition) it has state for."""

    topic: str
    partition: int
    in_push: bool
    push_failed: bool
    last_offset: int
    records: int
    # Per verdict other than OK (UNTRACKED included).
    verdict_counts: Mapping[Verdict, int]
    untold_gaps: int
    producers: int
    topic_id: str | None

    @property
    def counts(self) -> dict[Verdict, int]:
        """Records of the partition by verdict, OK included."""
        ok = self.records - sum(self.verdict_counts.values())
        return {Verdict.OK: ok, **self.verdict_counts} if ok else dict(self.verdict_counts)


@dataclass(frozen=True, slots=True)
class ChangefeedPartition:
    """A changefeed partition's rows verified by this worker since it started."""

    last_offset: int | None
    records: int
    counts: dict[str, int]  # by verdict, all tables


class RecoveryStatus(TypedDict):
    """Whether the tables are being restored, and the changelog records left."""

    in_progress: bool
    active_remaining: int
    standby_remaining: int


@dataclass(frozen=True, slots=True)
class RestoreTotals:
    """Changelog restores of the worker's life, and those under way."""

    records: int
    batches: int
    completed: int
    last_duration_ms: int
    in_progress: int


@dataclass(frozen=True, slots=True)
class RegistryStatus:
    """The Schema Registry as this worker sees it; `url` without credentials, None when not configured."""

    configured: bool
    url: str | None
    available: bool
    last_error: str  # "" when none
    requests: int
    failures: int


@dataclass(frozen=True, slots=True)
class Counters:
    """The worker's own counters since it started."""

    batches: int
    incidents_sent: int
    log_rewinds: int
    deletions_before_validation: int
    producers_evicted: int
    ledger_entries_sent: int
    state_writes: int
    replays_skipped: int
    bad_incident_records: int
    schema_checked_records: int
    schema_unchecked_records: int
    changefeed_registry_waits: int
    state_schema_repairs: int


@dataclass(frozen=True, slots=True)
class HopCounts:
    """What this worker judged of one route hop since it started."""

    outcomes: dict[str, int]
    latency_buckets: tuple[int, ...]  # one per `AuditSnapshot.latency_bounds_ms`, then one over the last
    latency_sum_ms: int


@dataclass(frozen=True, slots=True)
class AuditRoute:
    """A route of the pipeline audit: its stages, each hop's group, and the writers' sampling
    rate at its source (None: not known)."""

    name: str
    stages: tuple[tuple[str, ...], ...]
    groups: tuple[str, ...]
    sampling_rate: float | None


@dataclass(frozen=True, slots=True)
class AuditSnapshot:
    """The pipeline audit's counts on this worker."""

    routes: tuple[AuditRoute, ...]
    # The route groups found on the cluster (None: not looked up yet).
    known_groups: frozenset[str] | None
    traced: dict[tuple[str, int], int]  # (route, stage) -> observations sent
    hops: dict[tuple[str, int], HopCounts]  # (route, hop) -> judged
    latency_bounds_ms: tuple[int, ...]  # the latency buckets' upper bounds
    open_traces: int  # of every route
    header_errors: int
    bad_observations: int


class WorkerReadModel(Protocol):
    """What the views and metrics read of a worker. Every answer is a value of this moment."""

    @property
    def canonical_url(self) -> str:
        """The URL this worker advertises to its group."""
        ...

    @property
    def reconcile_reports(self) -> Path | None:
        """KDIV_RECONCILE_REPORTS (None: not set)."""
        ...

    @property
    def cluster_id(self) -> str | None:
        """The watched cluster's id (None: not known)."""
        ...

    def now_ms(self) -> int:
        """The worker's clock."""
        ...

    def failed_pushes(self) -> list[tuple[str, int]]:
        """The partitions whose push failed (`PartitionState.push_failed`), sorted."""
        ...

    def partition_states(self) -> dict[tuple[str, int], PartitionState]:
        """Every partition the validator has state for, in (topic, partition) order."""
        ...

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """One partition's validator state, None when there is none here."""
        ...

    def producers_of(self, topic: str, partition: int) -> Mapping[bytes, ProducerState]:
        """A partition's producers by GUID, read-only (empty: no state here)."""
        ...

    def assigned_partitions(self) -> list[tuple[str, int]]:
        """The watched partitions assigned to this worker."""
        ...

    def is_loaded(self, topic: str, partition: int) -> bool:
        """Whether an assigned partition can be judged here (its state installed)."""
        ...

    def is_changefeed(self, topic: str) -> bool:
        """Whether a watched topic is a changefeed's (verified by row checksum, no DIV state)."""
        ...

    def changefeed_partition(self, topic: str, partition: int) -> ChangefeedPartition:
        """A changefeed partition's rows verified here."""
        ...

    def changefeed_tables(self, topic: str | None, table: str | None) -> list[dict]:
        """Per topic, partition and table: rows verified here, by verdict (the /changefeeds/ items)."""
        ...

    def changefeed_rows(self) -> dict[tuple[str, str, str], int]:
        """Rows verified here per (topic, table, verdict), over all partitions."""
        ...

    def progress_of(self, topic: str, partition: int) -> PartitionProgress | None:
        """A partition's progress against its true log end (None: not measured)."""
        ...

    def partition_progress(self) -> list[PartitionProgress]:
        """Every assigned partition's progress against its true log end."""
        ...

    def liveness(self) -> Liveness:
        """Whether the worker makes progress."""
        ...

    def recent_incidents(self) -> Iterator[Incident]:
        """The incidents held from the incidents topic, newest first."""
        ...

    def incidents_read_to(self) -> dict[int, int]:
        """Per incidents-topic partition: the offset the held incidents are read up to."""
        ...

    def recovery(self) -> RecoveryStatus:
        """Whether the tables are being restored, and what is left."""
        ...

    def restores(self) -> RestoreTotals:
        """Changelog restores done and under way."""
        ...

    def state_schema_ready(self) -> bool:
        """Whether the state schema's id is known (registered or found)."""
        ...

    def state_schema_id(self) -> int:
        """The id the state is written under."""
        ...

    def state_schema_findings(self) -> list[dict]:
        """Open SUBJECT_MISMATCH / SCHEMA_UNKNOWN findings in the state, as JSON."""
        ...

    def load_errors_seen(self) -> int:
        """State entries that could not be loaded since the worker started."""
        ...

    def registry(self) -> RegistryStatus:
        """The Schema Registry's status here."""
        ...

    def counters(self) -> Counters:
        """The worker's own counters."""
        ...

    def watched_topic_ids(self) -> dict[str, str]:
        """The ids of the watched topics this worker has seen, as its partitions last saw them."""
        ...

    def audit(self) -> AuditSnapshot | None:
        """The pipeline audit's counts (None: the audit is not judged live)."""
        ...

    def route_open_traces(self, route: str) -> int:
        """Traces of `route` awaiting a verdict here (0 without the audit). Asked apart from
        `audit`: counting one route's is a pass over every open trace."""
        ...
