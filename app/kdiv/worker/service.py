"""The live validator as a Faust application: agents, state tables, incidents.

The watched topics' records arrive in whole fetched batches (`kdiv.worker.faustcompat.batches`)
and go to `LiveValidation` in bulk (`process_run`: a result only for what is not an intact
in-order record), which decides what is new and what is a replay; this module does the I/O in
the order `kdiv.worker.live` requires: incidents (awaited), then the partition state, then
producer states, all before the batch's offsets can be committed (Faust flushes its producer
first).

State lives in one RocksDB table per partition count of the watched topics: Faust keeps a
table's changelog partition with the source partition of the same number, which only
holds for topics with the table's partition count. Keys of all watched topics with that
count share the table: the partition state and producer states of a source partition
then share one changelog partition, whose order makes the write order above hold after a
crash too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from faust.types import TP, EventT

from kdiv.clock import wall_clock_ms
from kdiv.config.settings import Settings
from kdiv.div.record import FetchedRecord, consumed
from kdiv.div.validator import DataIntegrityValidator, Semantics, TopicPolicy, ValidationResult
from kdiv.div.wire import scan_div_header
from kdiv.kafka.committed import read_committed
from kdiv.kafka.consume import topic_partitions as partitions_of
from kdiv.kafka.discovery import ClusterView
from kdiv.kafka.tansu import enable_tansu_producer_ids
from kdiv.kafka.topicids import TopicIds
from kdiv.registry.client import SchemaRegistry
from kdiv.registry.subjects import UNCHECKED, SchemaLookups
from kdiv.state.framing import schema_id_of
from kdiv.state.tables import changelog_topic_name, ledger_changelog_topic_name, state_changelogs, table_name
from kdiv.state.values import StateValues
from kdiv.trace.routes import validate_routes
from kdiv.worker.audit import PipelineAudit
from kdiv.worker.changefeeds import ChangefeedChecks
from kdiv.worker.credentials import faust_credentials
from kdiv.worker.faustcompat.batches import attach_batch_handler
from kdiv.worker.faustcompat.internals import (
    changelog_highwater,
    committed_offset,
    recovery_status,
    restored_partitions,
)
from kdiv.worker.faustcompat.sink import FaustSink
from kdiv.worker.faustcompat.tables import partition_items
from kdiv.worker.faustcompat.transport import (
    broker_url,
)
from kdiv.worker.incidents import (
    FaultRunLog,
    Incident,
    RecentIncidents,
    eviction_incident,
    incidents_for,
    schema_incident,
    trace_incident,
)
from kdiv.worker.live import LiveValidation
from kdiv.worker.logstarts import LogStartChecks
from kdiv.worker.restore import RestoreListener, StateTable, changelog_partitions
from kdiv.worker.rewinds import RewindChecks, fetched_highwater
from kdiv.worker.statecheck import (
    LOCAL_STATE_SCHEMA_ID,
    LOCAL_STORE,
    StateFinding,
    StateSchemaCheck,
    register_state_schema,
)
from kdiv.worker.unit import UnitOfWork
from kdiv.worker.views import register_views

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
    """The live validator inside the Faust app: validation, state writes, incidents, schema checks."""

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
        lags = {t.name: t.compaction_lag_ms for t in cluster.topics}
        # The state schema's id comes from the registry once the app runs (`register_state_schema`):
        # until then state is neither loaded nor written, and /health says why.
        self.values = StateValues(LOCAL_STATE_SCHEMA_ID if state_schema_id is None else state_schema_id)
        self.state_schema_ready = asyncio.Event()
        self._registering = asyncio.Lock()
        if state_schema_id is not None:
            self.state_schema_ready.set()
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
        self.state_check = StateSchemaCheck(self.lookups, self.values, auto_repair=settings.schema_auto_repair)
        self.restore = RestoreListener(clock)
        self.tables = {n: self._state_table(table_name(n), n) for n in cluster.partition_counts}
        self._table_of_topic = {t.name: self.tables[t.partitions] for t in cluster.topics}
        # The key ledger is written, never read, by the worker: a topic of its own, no table.
        self._ledger_topic_of = {
            t.name: ledger_changelog_topic_name(settings.app_id, t.partitions)
            for t in cluster.topics
            if t.compaction_lag_ms is not None
        }
        self._changelogs = [changelog_topic_name(settings.app_id, n) for n in cluster.partition_counts]
        self.recent = RecentIncidents(settings.recent_incidents)
        # Per incidents-topic partition: the offset `recent` holds every incident before.
        self.incidents_read_to: dict[int, int] = {}
        self.runs = FaultRunLog(log)
        self.stats = WorkerStats()
        self.load_errors_seen = 0
        self._schema_judged: set[tuple[str, int, str, int]] = set()
        self._schema_topics = {t.name for t in cluster.topics if settings.checks_schemas_of(t.name)}
        self.topics = frozenset(t.name for t in cluster.topics)
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
        self._unflushed_records = 0
        self._observed: list = []
        # Per partition, the producers whose OK records the bulk path must report (`FaultRunLog`).
        self._watch: dict[tuple[str, int], set[bytes]] = {}
        self._framed: dict[tuple[str, int, str, int], list[int]] = {}
        # TiCDC changefeed topics: verified by row checksum on the batch path, no DIV state.
        self.changefeed_topics = frozenset(t.name for t in cluster.topics if settings.is_changefeed(t.name))
        self.changefeeds = ChangefeedChecks(settings.changefeeds, self.lookups)
        self.rewinds = RewindChecks(
            app,
            self.live,
            self.unit,
            self.stats,
            clock,
            detects_rewinds=settings.semantics == "exact",
            topic_ids=TopicIds(settings),
            cluster=cluster,
            table_of_topic=self._table_of_topic,
            assigned_partitions=self.assigned_partitions,
            forget_batch=self._forget_batch,
        )
        self.log_starts = LogStartChecks(
            app,
            self.live,
            self.unit,
            self.stats,
            clock,
            table_of_topic=self._table_of_topic,
            changefeed_topics=self.changefeed_topics,
            assigned_partitions=self.assigned_partitions,
            ensure_loaded=self._ensure_loaded,
            forget_watch=self._forget_watch,
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
                help="kdiv pipeline audit: open traces by observations partition, route and trace id",
            ),
        )

        @table.on_recover
        async def after_restore() -> None:
            self._load_traces()

        return table

    def _load_traces(self) -> None:
        """Judges for the assigned observations partitions, from the saved traces."""
        audit = self.audit
        if audit is None or self.app.consumer is None:
            return
        assigned = {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.settings.observations}
        for partition in sorted(assigned - audit.judges.keys()):
            loaded = audit.load(partition, partition_items(self.trace_table, partition))
            log.info("pipeline audit: %d open traces loaded for observations partition %d", loaded, partition)

    async def poll_committed_offsets(self) -> None:
        """The route groups' committed offsets, polled: the judges' evidence of loss."""
        audit = self.audit
        if audit is None:
            return
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.settings.bootstrap,
            client_id=f"{self.settings.app_id}-audit-offsets",
            **self.settings.kafka_security.aiokafka_kwargs(),
        )
        await admin.start()
        reported: set[str] = set()
        try:
            while True:
                try:
                    partitions = {t.name: t.partitions for t in self.cluster.topics}
                    groups, offsets = await read_committed(admin, audit.routes, partitions)
                    audit.known_groups = groups
                    unknown = set(validate_routes(audit.routes, self.settings.audit.route_topics(), groups))
                    for problem in sorted(unknown - reported):
                        log.warning("pipeline audit: %s; its traces wait (lag, not loss) until it commits", problem)
                    reported = unknown
                    audit.note_committed(offsets)
                except KafkaError as failed:
                    log.warning("pipeline audit: committed offsets not read: %s", failed)
                await asyncio.sleep(self.settings.audit.offsets_poll_s)
        finally:
            await admin.close()

    # -- the state's schemas -----------------------------------------------------------------

    async def register_state_schema(self) -> None:
        """Register the state schema under each changelog's subject (waiting out registry
        outages, while the web views answer) and write state with its id from then on."""
        async with self._registering:
            if self.state_schema_ready.is_set():
                return
            changelogs = state_changelogs(self.settings.app_id, self.cluster)
            self.values.use(await register_state_schema(self.lookups.registry, changelogs))
            self.state_schema_ready.set()

    async def after_restore(self, table: StateTable, changelog: str) -> None:
        """Register the state schema (first time), end the restore listener, learn the writer
        schemas of the state, load the assigned partitions' state, then check the subject of
        every schema id the state holds."""
        # Here, not at import: the worker and its web views run while the registry is down.
        # Faust awaits this before the stream resumes, so nothing is written before.
        await self.register_state_schema()
        self.restore.on_end(changelog, changelog_partitions(restored_partitions(self.app, table), changelog))
        ids = self.restore.first_offsets(changelog)
        for value in table.values():
            schema_id = schema_id_of(value)
            if schema_id is not None and schema_id not in ids:
                # Held by the local store, not re-read from the changelog this time.
                ids[schema_id] = (-1, LOCAL_STORE)
        await self.state_check.learn_writer_schemas(ids)
        # Loaded once the writer schemas of what was restored are known, and before the
        # stream resumes (Faust awaits this), not at each partition's next record: an idle
        # partition's state, owner and lag are in the views and metrics right after every
        # rebalance, kept partitions included (all are revoked first).
        count = next(n for n, t in self.tables.items() if t is table)
        self._load_assigned(only_partition_count=count)
        await self.rewinds.check_topic_ids(count)
        await self._report_state_findings(await self.state_check.check(changelog, ids))

    async def watch_state_schemas(self, recheck_s: float) -> None:
        """Check ids standbys replicate, and look again at open findings (a repair clears them)."""
        last_recheck = 0.0
        while True:
            await asyncio.sleep(1.0)
            if self.restore.new_ids:
                self.restore.new_ids = False
                for changelog in self._changelogs:
                    await self._report_state_findings(
                        await self.state_check.check(changelog, self.restore.first_offsets(changelog))
                    )
            now = self.clock() / 1000
            if self.state_check.open and now - last_recheck >= recheck_s:
                last_recheck = now
                await self._report_state_findings(await self.state_check.recheck())

    async def _report_state_findings(self, findings: list[StateFinding]) -> None:
        now = self.clock()
        incidents = [
            schema_incident(
                f.changelog,
                f.partition,
                f.first_offset,
                "value",
                f.schema_id,
                f.verdict,
                f.expected_subject,
                f.registered_subjects,
                f.detail,
                -1,
                now,
                resolved_at_ms=now if f.resolved else None,
            )
            for f in findings
        ]
        await self._send_incidents(incidents)

    async def _send_incidents(self, incidents: list[Incident]) -> None:
        if not incidents:
            return
        await asyncio.gather(*await self.sink.send_incidents(incidents))
        self.stats.incidents_sent += len(incidents)

    # -- watched topics' schemas -------------------------------------------------------------

    async def _judge_schemas(self, framed: dict[tuple[str, int, str, int], list[int]], unit: UnitOfWork) -> None:
        """Incidents for framed records whose schema id is unknown or under another subject.

        `framed`: (topic, partition, field, id) -> (first offset, its timestamp, records).
        One incident per identity per worker; a record the registry cannot be asked about
        now is counted unchecked and its id is asked about again with the next batch.
        """
        now = self.clock()
        for (topic, partition, message_field, schema_id), (offset, timestamp, records) in framed.items():
            identity = (topic, partition, message_field, schema_id)
            if identity in self._schema_judged:
                self.stats.schema_checked_records += records
                continue
            strategy = self.settings.subject_strategy(topic)
            judgement = await self.lookups.judgement(schema_id, topic, strategy, is_key=message_field == "key")
            verdict, info, expected = judgement.verdict, judgement.info, judgement.expected_subject
            if verdict == UNCHECKED:
                self.stats.schema_unchecked_records += records
                continue
            self.stats.schema_checked_records += records
            self._schema_judged.add(identity)
            if verdict is None:
                continue
            registered = tuple(sorted(info.subjects)) if info else ()
            detail = (
                f"{message_field} schema id {schema_id} is unknown to the registry"
                if info is None
                else f"{message_field} schema id {schema_id} is registered under {list(registered) or 'no subject'}, "
                f"not under {expected or 'a subject the ' + strategy + ' strategy can name'}"
            )
            unit.add_incident(
                (topic, partition),
                schema_incident(
                    topic,
                    partition,
                    offset,
                    message_field,
                    schema_id,
                    verdict,
                    expected,
                    registered,
                    detail,
                    timestamp,
                    now,
                ),
            )

    def lag(self, topic: str, partition: int) -> int | None:
        """Records between the last validated one and the partition's high watermark."""
        if topic in self.changefeed_topics:
            last_offset = self.changefeeds.last_offsets.get((topic, partition))
            if last_offset is None:  # nothing verified since the worker started: from its position
                committed = committed_offset(self.app, TP(topic, partition))
                last_offset = None if committed is None else committed - 1
        else:
            part = self.live.validator.partitions.get((topic, partition))
            last_offset = None if part is None else part.last_offset
        highwater = fetched_highwater(self.app, topic, partition)
        if last_offset is None or highwater is None:
            return None
        return max(highwater - (last_offset + 1), 0)

    def is_loaded(self, topic: str, partition: int) -> bool:
        """True once a partition can be judged here: its saved state installed, or, for a
        changefeed partition (no saved state to restore), at once."""
        return topic in self.changefeed_topics or (topic, partition) in self.live.validator.partitions

    def recovery_status(self) -> dict:
        """Whether the tables are being restored, and what is left (for /health and metrics)."""
        return recovery_status(self.app)

    # -- ownership ---------------------------------------------------------------------------

    def on_revoked(self, revoked: Iterable[TP]) -> None:
        """Unload revoked partitions: their next owner reads them from the table."""
        for tp in revoked:
            self.live.unload(tp.topic, tp.partition)
            self.log_starts.forget(tp)
            self.changefeeds.forget(tp.topic, tp.partition)
            if self.audit is not None:
                if tp.topic == self.settings.observations:
                    self.audit.unload(tp.partition)
                else:
                    self.audit.forget_source(tp.topic, tp.partition)

    def on_assigned(self, assigned: Iterable[TP]) -> None:
        """Unload loaded partitions that this assignment did not keep."""
        keep = {(tp.topic, tp.partition) for tp in assigned}
        for topic, partition in self.live.loaded - keep:
            self.live.unload(topic, partition)

    def assigned_partitions(self) -> list[tuple[str, int]]:
        """The watched partitions assigned to this worker now, sorted."""
        if self.app.consumer is None:
            return []
        return sorted(
            (tp.topic, tp.partition)
            for tp in self.app.consumer.assignment()
            if self.cluster.topic(tp.topic) is not None
        )

    def _load_assigned(self, only_partition_count: int | None = None) -> None:
        """Load every assigned, not yet loaded source partition in one pass per table
        (only the table of topics with `only_partition_count` partitions, when given)."""
        wanted_by_table: dict[int, set[tuple[str, int]]] = {}
        for name, partition in self.assigned_partitions():
            topic = self.cluster.topic(name)
            if topic is None or (only_partition_count is not None and topic.partitions != only_partition_count):
                continue
            if name in self.changefeed_topics:
                continue
            if not self.live.is_loaded(name, partition):
                wanted_by_table.setdefault(topic.partitions, set()).add((name, partition))
        for n, wanted in wanted_by_table.items():
            self.live.load_many(wanted, self.tables[n].items())
            self.load_errors_seen += len(self.live.load_errors)
            for error in self.live.load_errors:
                log.error(
                    "unreadable state %r in table %s: %s; that producer starts afresh",
                    error.key,
                    table_name(n),
                    error.reason,
                )
            self.live.load_errors.clear()

    def _forget_watch(self, key: tuple[str, int]) -> None:
        self._watch.pop(key, None)

    def _forget_batch(self, key: tuple[str, int]) -> None:
        """Drop what the batch path holds of a partition besides the unit of work (its log is gone)."""
        self._forget_watch(key)
        self._framed = {k: v for k, v in self._framed.items() if (k[0], k[1]) != key}

    def _ensure_loaded(self, key: tuple[str, int]) -> None:
        """Install a watched partition's saved state if it is not yet."""
        if not self.live.is_loaded(*key):
            self._load_assigned()
            if not self.live.is_loaded(*key):  # not in the assignment the consumer reports yet
                self.live.load(key[0], key[1], self._table_of_topic[key[0]].items())

    # -- validation --------------------------------------------------------------------------

    async def process(self, batch: Mapping[TP, Sequence]) -> bool:
        """Validate fetched records (aiokafka's parsed records, in offset order per partition);
        what they change is written by `flush`. True when enough is pending to flush now."""
        now = self.clock()
        live = self.live
        await self.log_starts.check_log_starts(batch)
        for tp, records in batch.items():
            key = topic, partition = (tp.topic, tp.partition)
            if topic in self.changefeed_topics:
                await self._verify_changefeed(key, records, now)
                continue
            audit = self.audit
            if audit is not None:
                if topic == self.settings.observations:
                    if partition not in audit.judges:
                        audit.load(partition, partition_items(self.trace_table, partition))
                    audit.receive(partition, records, now)
                    self.unit.touch(key)
                    continue
                if audit.is_route_topic(topic):
                    audit.observe(topic, partition, records)
            self._ensure_loaded(key)
            if self.rewinds.checks_leader_epochs and await self.rewinds.log_diverged(key, records):
                continue  # read again from where the log diverged
            if topic in self._schema_topics:
                for record in records:
                    self._note_framing(topic, partition, record, self._framed)
            watch = self._watch.get(key)
            if watch is None:
                watch = self._watch[key] = live.producers_behind_deletions(topic, partition)
                watch |= self.runs.producers_in_runs(topic, partition)
            results: list[ValidationResult] = []
            i, end = 0, len(records)
            while True:
                i = live.process_run(topic, partition, records, i, now, watch, results)
                self._observe(key, results, now)
                if i == end:
                    break
                # A re-delivery or a push marker, one by one.
                record = consumed(topic, partition, records[i])
                scanned = scan_div_header(record.headers)
                if live.opens_unit(record, scanned):
                    # A push marker: what came before it is written before it is judged.
                    await self._commit(self.unit.split([key]))
                result = live.process(record, now, scanned)
                if result is not None:
                    results.append(result)
                i += 1
            self.unit.touch(key)
            self._unflushed_records += end
        self.rewinds.note_rewinds()
        return self._unflushed_records >= self.settings.batch_max

    async def _verify_changefeed(self, key: tuple[str, int], records: Sequence, now: int) -> None:
        """A changefeed partition's records: row checksums instead of DIV."""
        topic, partition = key
        if topic in self._schema_topics:
            for record in records:
                self._note_framing(topic, partition, record, self._framed)
        await self.changefeeds.learn_schemas(records)
        incidents = self.changefeeds.verify(topic, partition, records, now)
        if incidents:
            self.unit.add_incidents(key, incidents)
        self.unit.touch(key)
        self._unflushed_records += len(records)

    def _observe(self, key: tuple[str, int], results: list[ValidationResult], now: int) -> None:
        """Incidents for `results` (then emptied), pending until their unit is written."""
        observed = self._observed
        live = self.live
        behind = live.behind_deletions
        for result in results:
            incidents = incidents_for(result, now, live.deletion_behind(result) if behind else None)
            observed.append((result, incidents[0] if incidents else None))
            if incidents:
                self.unit.add_incidents(key, incidents)
        results.clear()

    async def flush(self) -> None:
        """Write everything validated since the last flush, in the crash protocol's order."""
        if self._framed:
            framed, self._framed = self._framed, {}
            await self._judge_schemas(framed, self.unit)
        for incident in self.changefeeds.give_up_held(self.clock()):
            self.unit.add_incident((incident.topic, incident.partition), incident)
        if self.audit is not None:
            self._judge_traces()
        await self.rewinds.check_recreated_topics()
        await self.log_starts.poll_log_starts()
        await self.rewinds.check_high_watermarks()
        self.rewinds.note_rewinds()
        self._evict_over_limit()
        await self._commit(self.unit)
        self._unflushed_records = 0
        observed, self._observed = self._observed, []
        self.runs.observe(observed)
        self._watch.clear()
        self.stats.batches += 1

    def _evict_over_limit(self) -> None:
        """Partitions tracking more producers than KDIV_PRODUCERS_LIMIT forget the least
        recently seen, before their writes (which delete them) and after the incident."""
        now = self.clock()
        for key in sorted(self.live.loaded):
            eviction = self.live.evict_over_limit(*key)
            if eviction is None:
                continue
            incident = eviction_incident(eviction, now)
            self.unit.add_incident(key, incident)
            self.stats.producers_evicted += len(eviction.guids)
            log.warning("%s at %s[%d]: %s", incident.verdict, key[0], key[1], incident.detail)

    def _judge_traces(self) -> None:
        """The judges' verdicts: incidents (LOST, DUPLICATED, UNRESOLVED), written with their
        observations partition's table changes."""
        audit = cast(PipelineAudit, self.audit)
        now = self.clock()
        for partition, verdict in audit.judge(now):
            if verdict.outcome.value != "DELIVERED":
                incident = trace_incident(verdict, now)
                log.error("%s on route %s: %s", incident.verdict, verdict.route, verdict.detail)
                self.unit.add_incident((self.settings.observations, partition), incident)
        for partition in audit.judges:
            self.unit.touch((self.settings.observations, partition))

    def _note_framing(self, topic: str, partition: int, record: FetchedRecord, framed: dict) -> None:
        parts = (
            (("value", record.value), ("key", record.key))
            if self.settings.schema_check_keys
            else (("value", record.value),)
        )
        for message_field, raw in parts:
            schema_id = schema_id_of(raw)
            if schema_id is None:
                continue
            seen = framed.get((topic, partition, message_field, schema_id))
            if seen is None:
                framed[(topic, partition, message_field, schema_id)] = [
                    record.offset,
                    record.timestamp,
                    1,
                ]
            else:
                seen[2] += 1

    async def _commit(self, unit: UnitOfWork) -> None:
        """Take what validation left for the unit's partitions into it, and commit it."""
        unit.gather(self.live, self.audit, self.settings.observations)
        committed = await unit.commit(self.sink)
        self.stats.incidents_sent += committed.incidents
        self.stats.ledger_entries_sent += committed.ledger_entries
        self.stats.state_writes += committed.state_writes

    # -- incidents, for the views ------------------------------------------------------------

    def incidents_consumer(self) -> AIOKafkaConsumer:
        """The consumer `read_incidents` follows the incidents topic with, not started."""
        return AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap,
            client_id=f"{self.settings.app_id}-incidents-reader",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self.settings.kafka_security.aiokafka_kwargs(),
        )

    async def read_incidents(self) -> None:
        """Follow the whole incidents topic, so every worker can show every incident."""
        consumer = self.incidents_consumer()
        await consumer.start()
        try:
            assigned = await partitions_of(consumer, self.settings.incidents)
            consumer.assign(assigned)
            while True:
                batches = await consumer.getmany(timeout_ms=1000)
                for records in batches.values():
                    for record in records:
                        self._add_incident(record)
                # The view says how far it has read: a worker's list trails the topic by a
                # fetch, and a reader can tell "not yet read" from "not there".
                for tp in assigned:
                    self.incidents_read_to[tp.partition] = await consumer.position(tp)
        finally:
            await consumer.stop()

    def _add_incident(self, record) -> None:
        if record.value is None:
            return
        try:
            incident = Incident.from_value(record.value)
        except (ValueError, TypeError) as bad:
            self.stats.bad_incident_records += 1
            log.error("unreadable incident at %s[%d]@%d: %s", record.topic, record.partition, record.offset, bad)
            return
        self.recent.add(record.key, incident)


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
        store="rocksdb://",
        datadir=str(settings.data_dir),
        processing_guarantee=settings.processing_guarantee,
        # Takeover after a worker dies takes about two session timeouts (README, "Timeouts").
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
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
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
    )
    # `faust worker` sets conf.web_enabled from its own --with-web flag (default on); the
    # boot strategy's choice wins over both, so KDIV_WEB_ENABLED means what it says.
    app.boot_strategy.enable_web = settings.web_enabled
    worker = ValidationWorker(app, settings, cluster, state_schema_id)
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

    register_views(app, worker)

    @app.task
    async def follow_incidents():
        await worker.read_incidents()

    @app.task
    async def poll_committed_offsets():
        await worker.poll_committed_offsets()

    @app.task
    async def watch_state_schemas():
        await worker.watch_state_schemas(settings.schema_recheck_s)

    return app, worker
