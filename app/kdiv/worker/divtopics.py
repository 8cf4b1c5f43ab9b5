"""The DIV topics' partitions (`kdiv.worker.kinds`): their records validated by
`LiveValidation`, their saved state loaded from their table, one partition's RocksDB at a
time, unreadable entries counted and logged.

A route topic's traced records are observed for the pipeline audit before they are
validated. At a flush, before the commit: partitions of a topic deleted and created again
are read again from the new log's beginning, and partitions tracking more producers than the
limit forget the least recently seen; after it, the fault runs learn what was reported.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from kdiv.div.record import consumed
from kdiv.div.validator import ValidationResult
from kdiv.div.wire import scan_div_header
from kdiv.state.tables import table_name
from kdiv.untrusted import preview
from kdiv.worker.audit import PipelineAudit
from kdiv.worker.faustcompat.tables import partition_items
from kdiv.worker.incident_log import IncidentLog
from kdiv.worker.incidents import eviction_incident, incidents_for
from kdiv.worker.kinds import ALL_TAKEN, Key, Taken
from kdiv.worker.live import LiveValidation
from kdiv.worker.rewinds import RewindChecks
from kdiv.worker.turns import loop_turns
from kdiv.worker.unit import UnitOfWork

log = logging.getLogger("kdiv.worker")

# Records validated in one call (a slice): the event loop may get a turn between slices
# (`kdiv.worker.turns`), and a slice of new producers takes their full path, record by record.
SLICE_RECORDS = 250
NOT_TAKEN = Taken(stopped_at=0)


class DivTopics:
    """The DIV topics' partitions: load, take, forget; and their checks at a flush."""

    def __init__(
        self,
        *,
        live: LiveValidation,
        unit: UnitOfWork,
        runs: IncidentLog,
        stats: Any,
        clock: Callable[[], int],
        tables: Mapping[str, Any],
        partition_counts: Mapping[str, int],
        rewinds: RewindChecks,
        note_framing: Callable[[str, int, Sequence], None],
        audit: PipelineAudit | None = None,
    ) -> None:
        self.live = live
        self.unit = unit
        self.runs = runs
        self.stats = stats
        self.clock = clock
        # The state table of each topic (one per partition count), and its partition count.
        self.tables = tables
        self.partition_counts = partition_counts
        self.rewinds = rewinds
        self.note_framing = note_framing
        self.audit = audit
        self.load_errors_seen = 0
        # (result, its incident) of the bulk path's reported results, for the fault run log.
        self._observed: list[tuple[ValidationResult, Any]] = []
        # Per partition, the producers whose OK records the bulk path must report
        # (`IncidentLog`); grown by validation until the flush that writes its faults.
        self._watch: dict[Key, set[bytes]] = {}

    # -- lifecycle -----------------------------------------------------------------------------

    def is_loaded(self, key: Key) -> bool:
        return self.live.is_loaded(*key)

    def loaded(self) -> set[Key]:
        return set(self.live.loaded)

    def load(self, keys: Collection[Key]) -> None:
        """Install the partitions' saved state, one pass over each table partition's RocksDB
        (topics with the same partition count share a table)."""
        # (partition count: the table, partition) -> the partitions of its topics to load.
        wanted: dict[tuple[int, int], set[Key]] = {}
        for key in keys:
            if not self.live.is_loaded(*key):
                wanted.setdefault((self.partition_counts[key[0]], key[1]), set()).add(key)
        for (count, partition), keys_there in sorted(wanted.items()):
            table = self.tables[next(iter(keys_there))[0]]
            self.live.load_many(keys_there, partition_items(table, partition))
            self._count_load_errors(count)

    def _count_load_errors(self, partition_count: int) -> None:
        errors = self.live.load_errors
        self.load_errors_seen += len(errors)
        for error in errors:
            log.error(
                "unreadable state %s in table %s: %s; that producer starts afresh",
                preview(error.key),
                table_name(partition_count),
                error.reason,
            )
        errors.clear()

    def forget(self, key: Key) -> None:
        """Unload the partition (its next owner, or its next load, reads it from the table)."""
        self.live.unload(*key)
        self._watch.pop(key, None)
        if self.audit is not None:
            self.audit.forget_source(*key)

    # -- records -------------------------------------------------------------------------------

    async def take(self, key: Key, records: Sequence, start: int, now_ms: int) -> Taken:
        """In bulk while they are new in-order records, one by one otherwise (re-deliveries,
        push markers), each record's headers scanned once; in slices, the event loop served
        between them (a fetch of new producers' records takes the full path record by record,
        and /health must answer meanwhile)."""
        topic, partition = key
        live = self.live
        turns = loop_turns()
        if await turns.pause_if_due() and not live.is_loaded(topic, partition):
            return NOT_TAKEN  # revoked meanwhile: its new owner reads these records again
        if start == 0:
            if self.rewinds.checks_leader_epochs and await self.rewinds.log_diverged(key, records):
                return NOT_TAKEN  # read again from where the log diverged
            if self.audit is not None and self.audit.is_route_topic(topic):
                self.audit.observe(topic, partition, records)
            self.note_framing(topic, partition, records)
        watch = self._watch_of(key)
        results: list[ValidationResult] = []
        i, end = start, len(records)
        while i < end:
            stop = min(end, i + SLICE_RECORDS)
            taken = records if i == 0 and stop == end else records[i:stop]
            i += live.process_run(topic, partition, taken, 0, now_ms, watch, results)
            self._observe(key, results, now_ms)
            if i == end:
                break
            if i == stop:
                if await turns.pause_if_due() and not live.is_loaded(topic, partition):
                    return NOT_TAKEN  # revoked meanwhile: its new owner reads these records again
                continue
            # A re-delivery or a push marker, one by one.
            record = consumed(topic, partition, records[i])
            scanned = scan_div_header(record.headers)
            if live.opens_unit(record, scanned):
                # A push marker: what came before it is written before it is judged (that
                # commit leaves the partition clean, so taken again from here it goes on).
                self.unit.touch(key)
                return Taken(stopped_at=i, commit_first=True)
            result = live.process(record, now_ms, scanned)
            if result is not None:
                results.append(result)
                self._observe(key, results, now_ms)  # the batch may end here
            i += 1
        self.unit.touch(key)
        return ALL_TAKEN

    def _watch_of(self, key: Key) -> set[bytes]:
        watch = self._watch.get(key)
        if watch is None:
            watch = self._watch[key] = self.runs.producers_in_runs(*key)
        # Producers behind a deletion found since: their next record is reported.
        watch |= self.live.producers_behind_deletions(*key)
        return watch

    def _observe(self, key: Key, results: list[ValidationResult], now_ms: int) -> None:
        """Incidents for `results` (then emptied), pending until their unit is written."""
        observed = self._observed
        live = self.live
        behind = live.behind_deletions
        for result in results:
            incidents = incidents_for(result, now_ms, live.deletion_behind(result) if behind else None)
            observed.append((result, incidents[0] if incidents else None))
            if incidents:
                self.unit.add_incidents(key, incidents)
        results.clear()

    # -- at a flush ----------------------------------------------------------------------------

    async def read_recreated_topics_again(self, unit: UnitOfWork) -> None:
        """A partition whose topic was deleted and created again since its state was saved may
        have been validated against the new log as if it went on from the old one: its
        unflushed work is dropped, its state loaded again as saved, the rewind reported, and
        the partition read again from the new log's beginning."""
        recreated = await self.rewinds.recreated_topics(unit.partitions)
        for key, topic_id in recreated:
            unit.drop(key)
            self.forget(key)
            self.load([key])
            self.live.check_topic_id(key[0], key[1], topic_id)
        if recreated:
            await self.rewinds.read_again_from_beginning([key for key, _ in recreated])

    async def evict_over_limit(self, unit: UnitOfWork) -> None:
        """Partitions tracking more producers than KDIV_PRODUCERS_LIMIT forget the least
        recently seen, before their writes (which delete them) and after the incident; the
        event loop runs between partitions (an eviction may walk 100,000 producers)."""
        now = self.clock()
        turns = loop_turns()
        for key in sorted(self.live.loaded):
            if await turns.pause_if_due() and not self.live.is_loaded(*key):
                continue  # revoked meanwhile
            eviction = self.live.evict_over_limit(*key)
            if eviction is None:
                continue
            unit.add_incident(key, eviction_incident(eviction, now))
            self.stats.producers_evicted += len(eviction.guids)
        await asyncio.sleep(0)

    def flushed(self) -> None:
        """After a commit: the fault runs learn what the bulk path reported, and the
        producers watched are chosen again at each partition's next batch."""
        observed, self._observed = self._observed, []
        self.runs.observe(observed)
        self._watch.clear()
