"""The live validator as a Faust application: its parts put together, tables and tasks.

The watched topics' records arrive in whole fetched batches (`kdiv.worker.faustcompat.batches`)
and go to the batch path (`kdiv.worker.batchpath`), which hands each partition's records to
the handler of its topic's kind (`kdiv.worker.kinds`, `kdiv.worker.divtopics`); they add what
the records change to the unit of work, which a flush commits through the Faust sink in the
crash protocol's steps (`kdiv.worker.unit`, `kdiv.worker.faustcompat.sink`) before the offsets
it returns can be committed. `ValidationWorker.__init__` builds the parts in dependency order
and lists the checks that run before a commit. Around the path: partition ownership
(`kdiv.worker.ownership`), log rewinds (`kdiv.worker.rewinds`), deletions before validation
(`kdiv.worker.logstarts`), schemas (`kdiv.worker.schemas`) and the route groups' committed
offsets (`kdiv.worker.routeoffsets`).

State lives in one RocksDB table per partition count of the watched topics: Faust keeps a
table's changelog partition with the source partition of the same number, which only
holds for topics with the table's partition count. Keys of all watched topics with that
count share the table: the partition state and producer states of a source partition
then share one changelog partition, whose order makes the write order hold after a crash too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import faust
from aiokafka import AIOKafkaConsumer
from faust.types import TP, EventT

from kdiv.clock import wall_clock_ms
from kdiv.config.settings import Settings
from kdiv.div.validator import DataIntegrityValidator, Semantics, TopicPolicy
from kdiv.kafka.discovery import ClusterView
from kdiv.kafka.tansu import enable_tansu_producer_ids
from kdiv.kafka.topicids import TopicIds
from kdiv.registry.client import SchemaRegistry
from kdiv.registry.subjects import SchemaLookups
from kdiv.state.tables import ledger_changelog_topic_name, table_name
from kdiv.state.values import StateValues
from kdiv.worker import routeoffsets
from kdiv.worker.audit import PipelineAudit
from kdiv.worker.batchpath import BatchPath, FlushHook
from kdiv.worker.changefeeds import ChangefeedChecks
from kdiv.worker.credentials import faust_credentials
from kdiv.worker.divtopics import DivTopics
from kdiv.worker.faustcompat.batches import attach_batch_handler
from kdiv.worker.faustcompat.bulkrestore import (
    BulkRestore,
    KdivTableManager,
    bulk_restore_of,
    ensure_whole,
    install_bulk_restore,
)
from kdiv.worker.faustcompat.internals import (
    changelog_highwater,
    committed_offset,
    records_en_route,
    recovery_status,
    restore_remaining,
    restored_partitions,
)
from kdiv.worker.faustcompat.sink import FaustSink
from kdiv.worker.faustcompat.stores import STORE_SCHEME
from kdiv.worker.faustcompat.tables import partition_values
from kdiv.worker.faustcompat.transport import (
    broker_url,
)
from kdiv.worker.incident_log import IncidentLog
from kdiv.worker.incidents import RecentIncidents
from kdiv.worker.kinds import ChangefeedTopics, ObservationTopics, TopicKinds
from kdiv.worker.live import LiveValidation
from kdiv.worker.logends import LogEnds
from kdiv.worker.logstarts import LogStartChecks
from kdiv.worker.ownership import Ownership
from kdiv.worker.progress import Liveness, PartitionProgress, Progress
from kdiv.worker.readout import WorkerReadout
from kdiv.worker.restore import RestoreListener, StateTable, changelog_partitions
from kdiv.worker.rewinds import RewindChecks
from kdiv.worker.schemas import SchemaChecks
from kdiv.worker.statecheck import (
    LOCAL_STATE_SCHEMA_ID,
)
from kdiv.worker.stopping import exit_when_stop_overruns
from kdiv.worker.storeoptions import rocksdb_options
from kdiv.worker.unit import Committed, UnitOfWork
from kdiv.worker.web.incidents_reader import follow_incidents
from kdiv.worker.web.server import register_views

log = logging.getLogger("kdiv.worker")


PRODUCER_BATCH_BYTES = 256 * 1024
# How stale the worker's view of its topics' partitions may get (see build_app).
METADATA_MAX_AGE_MS = 5_000


@dataclass
class WorkerStats:
    """Counters of the worker's own work, for the metrics."""

    batches: int = 0
    incidents_sent: int = 0
    ledger_entries_sent: int = 0
    log_rewinds: int = 0
    deletions_before_validation: int = 0
    producers_evicted: int = 0
    state_writes: int = 0
    bad_incident_records: int = 0
    schema_checked_records: int = 0
    schema_unchecked_records: int = 0


class ValidationWorker:
    """The live validator inside the Faust app: its parts, wired to the app's tables and signals."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        cluster: ClusterView,
        state_schema_id: int | None = None,
        clock=wall_clock_ms,
    ) -> None:
        self.app = app
        self.settings = settings
        self.cluster = cluster
        self.clock = clock
        # The parts in dependency order: each step uses only what the steps before it built.
        self._build_validation(state_schema_id)
        changefeed_kind, observations_kind = self._build_topic_kinds()
        self._build_progress()
        self._build_batch_path(changefeed_kind, observations_kind)

    def _build_validation(self, state_schema_id: int | None) -> None:
        """The validator, its state tables, the schema checks, the audit and the sink."""
        app, settings, cluster, clock = self.app, self.settings, self.cluster, self.clock
        lags = {t.name: t.compaction_lag_ms for t in cluster.topics}
        # The state schema's id comes from the registry once the app runs
        # (`SchemaChecks.register_state_schema`).
        self.values = StateValues(LOCAL_STATE_SCHEMA_ID if state_schema_id is None else state_schema_id)
        self.live = LiveValidation(
            DataIntegrityValidator(
                lambda topic: TopicPolicy(compaction_lag_ms=lags.get(topic)),
                start_in_push=settings.initial_phase == "push",
                max_age_ms=settings.max_age_ms,
                semantics=Semantics(settings.semantics),
                window=settings.seq_window,
                max_producers=settings.producers_limit,
            ),
            self.values,
            ledger_topics=frozenset(t.name for t in cluster.topics if t.compaction_lag_ms is not None),
        )
        self.lookups = SchemaLookups(
            SchemaRegistry(settings.registry), clock=lambda: clock() / 1000, timeout_s=settings.registry.timeout_s
        )
        self.restore = RestoreListener(clock)
        self.tables = {n: self._state_table(table_name(n), n) for n in cluster.partition_counts}
        self._table_of_topic = {t.name: self.tables[t.partitions] for t in cluster.topics}
        # TiCDC changefeed topics: verified by row checksum on the batch path, no DIV state.
        self.changefeed_topics = frozenset(t.name for t in cluster.topics if settings.is_changefeed(t.name))
        # The key ledger is written, never read, by the worker: a topic of its own, no table.
        self._ledger_topic_of = {
            t.name: ledger_changelog_topic_name(settings.app_id, t.partitions)
            for t in cluster.topics
            if t.compaction_lag_ms is not None
        }
        self.recent = RecentIncidents(settings.recent_incidents, settings.recent_incidents_bytes)
        # Per incidents-topic partition: the offset `recent` holds every incident before.
        self.incidents_read_to: dict[int, int] = {}
        self.runs = IncidentLog(log, settings.log_incidents)
        self.stats = WorkerStats()
        self.schemas = SchemaChecks(
            settings,
            cluster,
            self.lookups,
            self.values,
            self.restore,
            self.stats,
            clock,
            state_schema_known=state_schema_id is not None,
        )
        # The views read these.
        self.state_schema_ready = self.schemas.state_schema_ready
        self.state_check = self.schemas.state_check
        self.topics = frozenset(t.name for t in cluster.topics)
        self.fetch_buffer_bytes = settings.fetch_buffer_bytes
        # The pipeline audit: observations of the route topics' traced records, judged where
        # their trace hashes to in the observations topic (its records go to `process` too).
        self.audit: PipelineAudit | None = None
        if settings.audit.judged_live:
            self.audit = PipelineAudit(settings)
            self.topics |= {settings.observations}
            self.trace_table = self._trace_table(settings.audit.partitions)
        self.sink = FaustSink(
            app,
            settings.incidents,
            self._ledger_topic_of,
            self._table_of_topic,
            settings.observations,
            self.trace_table if self.audit is not None else None,
        )
        # Validated, not yet written: committed before Faust commits (see `flush`).
        self.unit = UnitOfWork()
        self.changefeeds = ChangefeedChecks(settings.changefeeds, self.lookups)

    def _build_topic_kinds(self) -> tuple[ChangefeedTopics, ObservationTopics | None]:
        """One handler per kind of watched topic, the checks they share, and ownership."""
        app, settings, cluster, clock = self.app, self.settings, self.cluster, self.clock
        div_topics = frozenset(t.name for t in cluster.topics) - self.changefeed_topics
        self.kinds = TopicKinds()
        self.ownership = Ownership(app, cluster, self.kinds)
        self.rewinds = RewindChecks(
            app,
            self.live,
            self.unit,
            self.stats,
            clock,
            detects_rewinds=settings.semantics == "exact",
            topic_ids=TopicIds(settings),
            cluster=cluster,
            assigned_partitions=self.ownership.assigned_partitions,
        )
        self.log_starts = LogStartChecks(
            app,
            self.live,
            self.unit,
            self.stats,
            clock,
            div_topics=div_topics,
            assigned_partitions=self.ownership.assigned_partitions,
        )
        self.div = DivTopics(
            live=self.live,
            unit=self.unit,
            runs=self.runs,
            stats=self.stats,
            clock=clock,
            tables=self._table_of_topic,
            partition_counts={t.name: t.partitions for t in cluster.topics},
            rewinds=self.rewinds,
            note_framing=self.schemas.note_framing,
            audit=self.audit,
        )
        self.kinds.register(sorted(div_topics), self.div)
        changefeed_kind = ChangefeedTopics(self.changefeeds, self.unit, self.schemas.note_framing, clock)
        self.kinds.register(sorted(self.changefeed_topics), changefeed_kind)
        observations_kind = None
        if self.audit is not None:
            observations_kind = ObservationTopics(self.audit, self.trace_table, self.unit, clock)
            self.kinds.register([settings.observations], observations_kind)
        # What else is kept of a partition goes with it.
        self.ownership.on_forget(self.schemas.forget)
        self.ownership.on_forget(lambda key: self.log_starts.forget(TP(*key)))
        return changefeed_kind, observations_kind

    def _build_progress(self) -> None:
        """Progress against the true log ends (docs/worker.md#liveness)."""
        app, settings, cluster, clock = self.app, self.settings, self.cluster, self.clock
        self.progress = Progress(int(settings.stall_s * 1000))
        self.log_ends = LogEnds(
            settings,
            self.progress,
            self.assigned_partitions,
            lambda key: committed_offset(app, TP(*key)),
            clock,
            tansu=cluster.tansu,
            paused=lambda: not self.schemas.state_schema_ready.is_set(),
            restoring=lambda: restore_remaining(app),
            en_route=self.records_en_route,
        )

    def records_en_route(self) -> set[tuple[str, int]]:
        """The partitions whose records are on their way: in the batch being validated or in
        the unit of work and not yet written, waiting in the fetcher, or asked for in fetches their leader answered
        within the stall bound (`Progress.judge`)."""
        answered_since = self.clock() - self.progress.stall_ms
        batches = self.batches
        return records_en_route(self.app, answered_since) | batches.taking | set(batches.unit.partitions)

    def _build_batch_path(self, changefeed_kind: ChangefeedTopics, observations_kind: ObservationTopics | None) -> None:
        """The batch path: records to their kind's handler, the checks before a commit, the commit."""
        settings, clock = self.settings, self.clock
        # The checks before a flush's commit, in this order.
        before_commit: list[FlushHook] = [self.schemas.judge_schemas, changefeed_kind.give_up_held]
        if observations_kind is not None:
            before_commit.append(observations_kind.judge_traces)
        before_commit += [
            self.div.read_recreated_topics_again,
            lambda unit: self.log_starts.poll_log_starts(),
            lambda unit: self.rewinds.check_high_watermarks(),
            lambda unit: self.rewinds.note_rewinds(),
            self.div.evict_over_limit,
        ]
        self.batches = BatchPath(
            kinds=self.kinds,
            ownership=self.ownership,
            unit=self.unit,
            sink=self.sink,
            live=self.live,
            clock=clock,
            batch_max=settings.batch_max,
            audit=self.audit,
            observations=settings.observations,
            commit_timeout_s=settings.commit_timeout_s,
            before_batch=[self.log_starts.check_log_starts],
            after_batch=[self.rewinds.note_rewinds],
            before_commit=before_commit,
            on_committed=[self._count_committed],
            after_flush=[self.div.flushed, self._count_flush],
        )

    def _state_table(self, name: str, partitions: int) -> StateTable:
        changelog = f"{self.settings.app_id}-{name}-changelog"

        async def on_changelog_event(event: EventT) -> None:
            message = event.message
            highwater = changelog_highwater(self.app, message.tp)
            self.restore.on_record(message.topic, message.partition, message.offset, message.value, highwater)

        table = cast(
            StateTable,
            self.app.Table(
                name,
                partitions=partitions,
                key_type=bytes,
                value_type=bytes,
                options=rocksdb_options(self.settings),
                help=f"kdiv validator {name} of the watched topics with {partitions} partitions",
                on_changelog_event=on_changelog_event,
            ),
        )
        if table.changelog_topic.get_topic_name() != changelog:
            raise RuntimeError(f"table changelog is {table.changelog_topic.get_topic_name()}, expected {changelog}")
        table.restore_listener = self.restore

        @table.on_recover
        async def after_restore() -> None:
            await self.after_restore(table, changelog)

        return table

    def _trace_table(self, partitions: int) -> StateTable:
        """The audit's open traces (packed `TraceState`s), co-partitioned with the observations."""
        table = cast(
            StateTable,
            self.app.Table(
                "traces",
                partitions=partitions,
                key_type=bytes,
                value_type=bytes,
                options=rocksdb_options(self.settings),
                help="kdiv pipeline audit: open traces by observations partition, route and trace id",
            ),
        )

        @table.on_recover
        async def after_restore() -> None:
            self._load_traces()

        return table

    def _load_traces(self) -> None:
        """Judges for the assigned observations partitions, from the saved traces."""
        self.ownership.load_assigned({self.settings.observations})

    async def poll_committed_offsets(self) -> None:
        """The route groups' committed offsets, polled: the judges' evidence of loss."""
        if self.audit is not None:
            await routeoffsets.poll_committed_offsets(self.audit, self.settings, self.cluster)

    # -- the state's schemas -----------------------------------------------------------------

    async def after_restore(self, table: StateTable, changelog: str) -> None:
        """Register the state schema (first time), end the restore listener, learn the writer
        schemas of the state, load the assigned partitions' state, then check the subject of
        every schema id the state holds."""
        # Here, not at import: the worker and its web views run while the registry is down.
        # Faust awaits this before the stream resumes, so nothing is written before.
        await self.schemas.register_state_schema()
        partitions = changelog_partitions(restored_partitions(self.app, table), changelog)
        bulk = bulk_restore_of(self.app)
        if bulk is not None:
            # Faust's word that the restore is complete is checked: what is missing is read.
            generation = self.app.consumer_generation_id
            restored = {TP(changelog, partition): table for partition in partitions}
            await ensure_whole(bulk, restored, still_wanted=lambda: self.app.consumer_generation_id == generation)
        self.restore.on_end(changelog, partitions)
        ids = await self.schemas.learn_restored(changelog, partition_values(table, partitions))
        # Loaded once the writer schemas of what was restored are known, and before the
        # stream resumes (Faust awaits this), not at each partition's next record: an idle
        # partition's state, owner and lag are in the views and metrics right after every
        # rebalance, kept partitions included (all are revoked first).
        count = next(n for n, t in self.tables.items() if t is table)
        self.ownership.load_assigned({t.name for t in self.cluster.topics if t.partitions == count})
        await self.rewinds.check_topic_ids(count)
        self.schemas.report_state_findings(await self.state_check.check(changelog, ids))

    def _count_committed(self, committed: Committed) -> None:
        self.stats.incidents_sent += committed.incidents
        self.runs.written(committed.written_incidents)
        self.stats.ledger_entries_sent += committed.ledger_entries
        self.stats.state_writes += committed.state_writes

    def _count_flush(self) -> None:
        self.stats.batches += 1

    def lag(self, topic: str, partition: int) -> int | None:
        """Records between the last validated one and the partition's true log end (None:
        not measured yet)."""
        measured = self.progress.of((topic, partition), self.clock())
        return None if measured is None else measured.lag

    def partition_progress(self) -> list[PartitionProgress]:
        """Every assigned partition's progress against its true log end."""
        return self.progress.snapshot(self.clock())

    def liveness(self) -> Liveness:
        """Whether the worker makes progress: stalled partitions, commits failing, log ends unread."""
        now = self.clock()
        progress = self.progress
        failures = self.batches.commit_failures
        restore_stalled = progress.restore_stalled(now)
        return Liveness(
            stalled=tuple(progress.stalled(now)),
            blind=progress.measured_blind(now),
            blind_since_ms=progress.blind_since_ms,
            log_ends_error=progress.log_ends_error,
            commit_failing_since_ms=failures.since_ms,
            commit_attempts=failures.attempts,
            commit_error=failures.last_error,
            commit_failing_ms=0 if failures.since_ms is None else max(now - failures.since_ms, 0),
            stall_ms=progress.stall_ms,
            restore_stalled_since_ms=None if restore_stalled is None else restore_stalled[0],
            restore_remaining=None if restore_stalled is None else restore_stalled[1],
        )

    def on_flushed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Every record before these offsets is validated and written (progress); keyed by
        (topic, partition), as a TP is."""
        now = self.clock()
        for key, offset in offsets.items():
            self.progress.validated(key, offset, now)

    def is_loaded(self, topic: str, partition: int) -> bool:
        """True once a partition can be judged here: its saved state installed, or, for a
        changefeed partition (no saved state to restore), at once."""
        return self.ownership.is_loaded((topic, partition))

    def recovery_status(self) -> dict:
        """Whether the tables are being restored, and what is left (for /health and metrics)."""
        return recovery_status(self.app)

    # -- ownership ---------------------------------------------------------------------------

    def on_revoked(self, revoked: Iterable[TP]) -> None:
        """Forget revoked partitions: their next owner reads them from the table."""
        for tp in revoked:
            self.ownership.forget((tp.topic, tp.partition))

    def on_assigned(self, assigned: Iterable[TP]) -> None:
        self.ownership.keep_only(assigned)

    def assigned_partitions(self) -> list[tuple[str, int]]:
        return self.ownership.assigned_partitions()

    @property
    def load_errors_seen(self) -> int:
        """State entries that could not be loaded since the worker started."""
        return self.div.load_errors_seen

    async def process(self, batch: Mapping[TP, Sequence]) -> bool:
        return await self.batches.process(batch)

    async def flush(self) -> dict[tuple[str, int], int]:
        """Write what is pending; the offsets that may commit now (progress is told them)."""
        offsets = await self.batches.flush()
        self.on_flushed(offsets)
        return offsets

    def forget_offsets(self, keys: Sequence[tuple[str, int]]) -> None:
        self.batches.forget_offsets(keys)

    def read_model(self) -> WorkerReadout:
        """What the web views and metrics read of this worker (`kdiv.worker.readmodel`)."""
        return WorkerReadout(self)


def restore_consumer(settings: Settings) -> AIOKafkaConsumer:
    """The consumer that reads the state changelogs in bulk at a restore (not started): no
    group, committed records only, as the tables' own recovery reads them."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.app_id}-restore",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        request_timeout_ms=int(settings.broker_timeout_s * 1000),
        **settings.kafka_security.aiokafka_kwargs(),
    )


def build_app(
    settings: Settings, cluster: ClusterView, state_schema_id: int | None = None
) -> tuple[faust.App, ValidationWorker]:
    """The Faust app; `state_schema_id`: the state schema's id under the changelog subjects
    when known, else the app registers it when it starts."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    if cluster.tansu:
        # Faust's producers under exactly_once need producer ids, which aiokafka cannot get
        # from Tansu unaided.
        enable_tansu_producer_ids()
    app = faust.App(
        settings.app_id,
        broker=broker_url(settings.bootstrap, tansu=cluster.tansu),
        # Faust hands these to its consumer, producers and topic-creating client alike.
        broker_credentials=faust_credentials(settings.kafka_security),
        # Faust's RocksDB store, all partitions' databases within one memory budget.
        store=f"{STORE_SCHEME}://",
        datadir=str(settings.data_dir),
        processing_guarantee=settings.processing_guarantee,
        # Takeover after a worker dies takes about two session timeouts (docs/worker.md#takeover).
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_commit_interval=settings.commit_interval_s,
        consumer_auto_offset_reset="earliest",
        # A watched topic deleted and created again leaves the assignment at once and comes
        # back at the next metadata refresh: seconds, not aiokafka's default 5 minutes.
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        # aiokafka sends one batch per partition per request: at 16 KiB (the default) a
        # commit's key ledger entries took dozens of round trips while the worker waited.
        # Well under Kafka's default message.max.bytes (1 MiB).
        producer_max_batch_size=min(PRODUCER_BATCH_BYTES, cluster.request_bytes // 2),
        # Every produce request within what the brokers accept (kdiv.kafka.requests).
        producer_max_request_size=cluster.request_bytes,
        # Faust's default is 20 minutes: a request the broker never answers would hold a
        # commit that long. Bounded, a commit fails and is written again (docs/worker.md#liveness).
        producer_request_timeout=settings.broker_timeout_s,
        table_standby_replicas=settings.standby_replicas,
        topic_replication_factor=settings.replication_factor,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=settings.web_enabled,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        autodiscover=False,
        Table=StateTable,
        # The tables restored in bulk, and checked whole before they are loaded.
        TableManager=KdivTableManager,
    )
    # `faust worker` sets conf.web_enabled from its own --with-web flag (default on); the
    # boot strategy's choice wins over both, so KDIV_WEB_ENABLED means what it says.
    app.boot_strategy.enable_web = settings.web_enabled
    worker = ValidationWorker(app, settings, cluster, state_schema_id)
    install_bulk_restore(
        app,
        BulkRestore(
            new_consumer=lambda: restore_consumer(settings),
            listener=worker.restore,
            idle_timeout_s=settings.broker_timeout_s,
        ),
    )
    # Subscribed through Faust (assignment, commits, co-partitioned tables); the records
    # themselves go to the worker in whole fetched batches, not through a stream.
    app.topics.add(app.topic(*(t.name for t in cluster.topics), key_type=bytes, value_type=bytes))
    if settings.audit.judged_live:
        app.topics.add(
            app.topic(settings.observations, partitions=settings.audit.partitions, key_type=bytes, value_type=bytes)
        )
    attach_batch_handler(app, worker)

    # Faust sends the partitions positionally, which its signal type does not describe.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender, revoked, **kwargs) -> None:
        worker.on_revoked(revoked)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender, assigned, **kwargs) -> None:
        worker.on_assigned(assigned)

    register_views(app, settings, worker.read_model())
    exit_when_stop_overruns(lambda: app.should_stop, settings.stop_timeout_s)

    follow_incidents(app, worker)

    @app.task
    async def poll_committed_offsets():
        await worker.poll_committed_offsets()

    @app.task
    async def measure_progress():
        await worker.log_ends.run_forever()

    @app.task
    async def watch_state_schemas():
        await worker.schemas.watch_state_schemas(settings.schema_recheck_s)

    return app, worker
