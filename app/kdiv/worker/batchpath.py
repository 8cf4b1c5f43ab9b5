"""The worker's batch path: fetched records into the unit of work, by the kind of their topic,
and the flush that commits it.

Kinds: a DIV topic's records go to `LiveValidation` (a route topic's traced records are
observed for the pipeline audit first), a TiCDC changefeed's to the row checksum checks,
the observations topic's to the trace judges. What they find is added to the `UnitOfWork`;
`flush` adds what is judged at a flush (schemas, held changefeed rows, traces, rewinds,
deletions, evictions) and commits the unit through the sink (`kdiv.worker.unit`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast

from aiokafka.errors import KafkaError
from faust.types import TP

from kdiv.clock import iso_utc
from kdiv.div.record import consumed
from kdiv.div.validator import ValidationResult
from kdiv.div.wire import scan_div_header
from kdiv.worker.audit import PipelineAudit
from kdiv.worker.changefeeds import ChangefeedChecks
from kdiv.worker.faustcompat.tables import partition_items
from kdiv.worker.incident_log import IncidentLog
from kdiv.worker.incidents import eviction_incident, incidents_for, trace_incident
from kdiv.worker.live import LiveValidation
from kdiv.worker.logstarts import LogStartChecks
from kdiv.worker.ownership import Ownership
from kdiv.worker.rewinds import RewindChecks
from kdiv.worker.schemas import SchemaChecks
from kdiv.worker.unit import CommitFailures, CommitTimedOut, StateSink, UnitOfWork

log = logging.getLogger("kdiv.worker")

# Records validated in one call (a slice), and the time slices may take before the event
# loop gets a turn (web views, heartbeats). An answer needs a few turns, so a turn must be
# short: a slice of new producers takes their full path, record by record.
SLICE_RECORDS = 250
YIELD_AFTER_S = 0.02
# A commit that failed is tried again after this long, doubling up to the cap: a broker
# back from an outage is written to within seconds.
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 2.0
# What a commit may fail with and be tried again: a broker that does not answer, or not in time.
RETRIABLE = (KafkaError, CommitTimedOut, TimeoutError, OSError)


class BatchPath:
    """Fetched batches into the unit of work (`process`), and its commit (`flush`)."""

    def __init__(
        self,
        *,
        live: LiveValidation,
        unit: UnitOfWork,
        sink: StateSink,
        runs: IncidentLog,
        stats: Any,
        clock: Callable[[], int],
        batch_max: int,
        ownership: Ownership,
        schemas: SchemaChecks,
        rewinds: RewindChecks,
        log_starts: LogStartChecks,
        changefeed_topics: Collection[str],
        changefeeds: ChangefeedChecks,
        audit: PipelineAudit | None,
        observations: str,
        trace_table: Any = None,
        commit_timeout_s: float | None = None,
    ) -> None:
        self.live = live
        self.unit = unit
        self.sink = sink
        self.runs = runs
        self.stats = stats
        self.clock = clock
        # Records validated since the last flush past which `process` asks for one.
        self.batch_max = batch_max
        self.ownership = ownership
        self.schemas = schemas
        self.rewinds = rewinds
        self.log_starts = log_starts
        self.changefeed_topics = changefeed_topics
        self.changefeeds = changefeeds
        self.audit = audit
        self.observations = observations
        self.trace_table = trace_table
        self.commit_timeout_s = commit_timeout_s
        self.commit_failures = CommitFailures()
        self._unflushed_records = 0
        # (result, its incident) of the bulk path's reported results, for the fault run log.
        self._observed: list = []
        # Per partition, the producers whose OK records the bulk path must report (`IncidentLog`).
        self._watch: dict[tuple[str, int], set[bytes]] = {}

    def forget_watch(self, key: tuple[str, int]) -> None:
        """The producers watched on a partition's bulk path are made again at its next batch."""
        self._watch.pop(key, None)

    def forget_batch(self, key: tuple[str, int]) -> None:
        """Drop what the batch path holds of a partition besides the unit of work (its log is gone)."""
        self.forget_watch(key)
        self.schemas.forget(key)

    async def process(self, batch: Mapping[TP, Sequence]) -> bool:
        """Validate fetched records (aiokafka's parsed records, in offset order per partition)
        into the unit of work, by the kind of their topic; written by `flush`. True when
        enough is pending to flush now."""
        now = self.clock()
        await self.log_starts.check_log_starts(batch)
        audit = self.audit
        for tp, records in batch.items():
            key = (tp.topic, tp.partition)
            if tp.topic in self.changefeed_topics:
                await self._verify_changefeed(key, records, now)
            elif audit is not None and tp.topic == self.observations:
                self._receive_observations(audit, key, records, now)
            else:
                if audit is not None and audit.is_route_topic(tp.topic):
                    audit.observe(tp.topic, tp.partition, records)
                await self._validate_div(key, records, now)
        self.rewinds.note_rewinds()
        return self._unflushed_records >= self.batch_max

    def _receive_observations(self, audit: PipelineAudit, key: tuple[str, int], records: Sequence, now: int) -> None:
        """An observations partition's records: into its trace judge."""
        partition = key[1]
        if partition not in audit.judges:
            audit.load(partition, partition_items(self.trace_table, partition))
        audit.receive(partition, records, now)
        self.unit.touch(key)

    async def _validate_div(self, key: tuple[str, int], records: Sequence, now: int) -> None:
        """A DIV partition's records: in bulk while they are new in-order records, one by one
        otherwise (re-deliveries, push markers), each record's headers scanned once."""
        topic, partition = key
        live = self.live
        self.ownership.ensure_loaded(key)
        if self.rewinds.checks_leader_epochs and await self.rewinds.log_diverged(key, records):
            return  # read again from where the log diverged
        self.schemas.note_framing(topic, partition, records)
        watch = self._watch.get(key)
        if watch is None:
            watch = self._watch[key] = live.producers_behind_deletions(topic, partition)
            watch |= self.runs.producers_in_runs(topic, partition)
        results: list[ValidationResult] = []
        i, end = 0, len(records)
        turn = time.monotonic()
        while True:
            # In slices, the event loop served between them: a fetch of new producers' records
            # takes the full path record by record, and /health must answer meanwhile.
            stop = min(end, i + SLICE_RECORDS)
            taken = records if i == 0 and stop == end else records[i:stop]
            i += live.process_run(topic, partition, taken, 0, now, watch, results)
            self._observe(key, results, now)
            if i == end:
                break
            if i == stop:
                if time.monotonic() - turn >= YIELD_AFTER_S:
                    await asyncio.sleep(0)
                    turn = time.monotonic()
                    if not live.is_loaded(topic, partition):
                        return  # revoked meanwhile: its new owner reads these records again
                continue
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

    async def _verify_changefeed(self, key: tuple[str, int], records: Sequence, now: int) -> None:
        """A changefeed partition's records: row checksums instead of DIV."""
        topic, partition = key
        self.schemas.note_framing(topic, partition, records)
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
        await self.schemas.judge_schemas(self.unit)
        for incident in self.changefeeds.give_up_held(self.clock()):
            self.unit.add_incident((incident.topic, incident.partition), incident)
        if self.audit is not None:
            self._judge_traces()
        await self.rewinds.check_recreated_topics()
        await self.log_starts.poll_log_starts()
        await self.rewinds.check_high_watermarks()
        self.rewinds.note_rewinds()
        await self._evict_over_limit()
        await self._commit(self.unit)
        self._unflushed_records = 0
        observed, self._observed = self._observed, []
        self.runs.observe(observed)
        self._watch.clear()
        self.stats.batches += 1

    async def _evict_over_limit(self) -> None:
        """Partitions tracking more producers than KDIV_PRODUCERS_LIMIT forget the least
        recently seen, before their writes (which delete them) and after the incident; the
        event loop runs between partitions (an eviction may walk 100,000 producers)."""
        now = self.clock()
        for key in sorted(self.live.loaded):
            await asyncio.sleep(0)
            if not self.live.is_loaded(*key):
                continue  # revoked meanwhile
            eviction = self.live.evict_over_limit(*key)
            if eviction is None:
                continue
            incident = eviction_incident(eviction, now)
            self.unit.add_incident(key, incident)
            self.stats.producers_evicted += len(eviction.guids)
        await asyncio.sleep(0)

    def _judge_traces(self) -> None:
        """The judges' verdicts: incidents (LOST, DUPLICATED, UNRESOLVED), written with their
        observations partition's table changes."""
        audit = cast(PipelineAudit, self.audit)
        now = self.clock()
        for partition, verdict in audit.judge(now):
            if verdict.outcome.value != "DELIVERED":
                incident = trace_incident(verdict, now)
                self.unit.add_incident((self.observations, partition), incident)
        for partition in audit.judges:
            self.unit.touch((self.observations, partition))

    async def _commit(self, unit: UnitOfWork) -> None:
        """Take what validation left for the unit's partitions into it, and commit it; a
        commit that fails on the broker, or takes longer than its bound, is tried again,
        whole, until it is written (the offsets wait: nothing after the last commit counts)."""
        await unit.gather(self.live, self.audit, self.observations)
        failures = self.commit_failures
        retry_s = RETRY_FIRST_S
        while True:
            try:
                committed = await unit.commit(self.sink, self.commit_timeout_s)
                break
            except RETRIABLE as failure:
                if failures.failed(failure, self.clock()):
                    log.warning(
                        "commit failed, tried again until written (offsets wait): %s: %s",
                        type(failure).__name__,
                        failures.last_error,
                    )
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, RETRY_CAP_S)
        since, attempts = failures.succeeded()
        if since is not None:
            log.warning("commit written after %d failed attempts since %s", attempts, iso_utc(since))
        self.stats.incidents_sent += committed.incidents
        self.runs.written(committed.written_incidents)
        self.stats.ledger_entries_sent += committed.ledger_entries
        self.stats.state_writes += committed.state_writes
