"""Records deleted before they were validated: the log starts past the next offset to validate.

Asked of the brokers (ListOffsets EARLIEST) when a batch goes on past a gap
(`check_log_starts`) and, for idle partitions, every `LOG_START_POLL_MS` at a flush
(`poll_log_starts`); a deletion found becomes an incident in the unit of work
(`LiveValidation.log_starts_at` accounts for the offsets).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from aiokafka.errors import KafkaError
from faust.types import TP

from kdiv.worker.faustcompat.epochs import fetched_span
from kdiv.worker.incidents import deletion_incident
from kdiv.worker.live import LiveValidation
from kdiv.worker.rewinds import fetched_highwater
from kdiv.worker.unit import UnitOfWork

log = logging.getLogger("kdiv.worker")

# Log start offsets: how long one ListOffsets may take, how often it is tried before a gap
# is judged without it, and how often idle partitions are polled.
LOG_START_TIMEOUT_S = 5.0
LOG_START_ATTEMPTS = 3
LOG_START_RETRY_S = 0.5
LOG_START_POLL_MS = 5_000


class LogStartChecks:
    """Deletions before validation in the worker's partitions."""

    def __init__(
        self,
        app: Any,
        live: LiveValidation,
        unit: UnitOfWork,
        stats: Any,
        clock: Callable[[], int],
        *,
        div_topics: Collection[str],
        assigned_partitions: Callable[[], list[tuple[str, int]]],
    ) -> None:
        self.app = app
        self.live = live
        self.unit = unit
        self.stats = stats
        self.clock = clock
        # The DIV topics: the only ones whose validated offsets the DIV state keeps.
        self.div_topics = div_topics
        self.assigned_partitions = assigned_partitions
        # Log start polls (`poll_log_starts`): when the next is due, and the partitions the
        # last one found behind the log start, with their last validated offset then.
        self._next_log_start_poll_ms = 0
        self._behind_log_start: dict[TP, int] = {}
        # Per partition, the position the fetch of its last batch left (`check_log_starts`).
        self._fetched_to: dict[TP, int] = {}

    def forget(self, tp: TP) -> None:
        """A revoked partition: where its last fetch left off says nothing of the next owner's."""
        self._fetched_to.pop(tp, None)

    async def check_log_starts(self, batch: Mapping[TP, Sequence]) -> None:
        """Before a batch is validated: a partition whose records go on past the offset after
        its last validated one may have lost records to retention or DeleteRecords before they
        were read (the consumer then resets to the log start). The log start the broker gives
        tells; a gap alone does not (compaction and transaction markers leave gaps too). Asked
        now, before the records after the gap are judged, so that each producer's next MISSING
        can say its records were deleted. Not asked when the batch's fetch started at the next
        offset to validate or where the previous batch's fetch left off: the records between
        were none a consumer reads, and the consumer was not reset."""
        gaps: dict[TP, tuple[int, int]] = {}
        for tp, records in batch.items():
            if not records or tp.topic not in self.div_topics:
                continue
            key = (tp.topic, tp.partition)
            validated = self.live.validated_to(*key)
            fetched_from, fetched_to = fetched_span(records)
            left_off = self._fetched_to.pop(tp, None)
            if fetched_to is not None:
                self._fetched_to[tp] = fetched_to
            if validated is None or records[0].offset <= validated + 1:
                continue
            if fetched_from is not None and (fetched_from <= validated + 1 or fetched_from == left_off):
                continue
            gaps[tp] = (validated, records[0].offset)
        if not gaps:
            return
        starts = await self._log_starts(list(gaps), attempts=LOG_START_ATTEMPTS)
        for tp, (validated, first) in sorted(gaps.items()):
            start = starts.get(tp)
            if start is None:
                log.error(
                    "log start of %s[%d] unknown: offsets %d..%d, skipped by the consumer, are judged as a gap; "
                    "records deleted there before validation show as plain MISSING",
                    tp.topic,
                    tp.partition,
                    validated + 1,
                    first - 1,
                )
                continue
            # Offsets from `first` on are read now: deleted later, they were validated.
            self._note_deletion(
                tp,
                min(start, first),
                "fetch",
                f"the consumer read offset {first} next after offset {validated}, and the log starts at offset {start}",
            )

    async def poll_log_starts(self) -> None:
        """Every `LOG_START_POLL_MS`, at a flush: partitions whose log starts past the offset
        after their last validated one with no record read since to show it (everything up to
        the end deleted). Found when two polls in a row see the same last validated offset
        behind the log start, and the consumer has fetched from the new log start (its high
        watermark is at or past it): a batch fetched before the deletion and not yet
        validated is validated first, and no high watermark from before the deletion stays
        below the offsets accounted for."""
        now = self.clock()
        if now < self._next_log_start_poll_ms:
            return
        self._next_log_start_poll_ms = now + LOG_START_POLL_MS
        positions: dict[TP, int] = {}
        for topic, partition in self.assigned_partitions():
            validated = self.live.validated_to(topic, partition)
            if validated is not None and topic in self.div_topics:
                positions[TP(topic, partition)] = validated
        behind, self._behind_log_start = self._behind_log_start, {}
        if not positions:
            return
        starts = await self._log_starts(list(positions), attempts=1)
        for tp, validated in sorted(positions.items()):
            start = starts.get(tp)
            if start is None or start <= validated + 1:
                continue
            highwater = fetched_highwater(self.app, tp.topic, tp.partition)
            if behind.get(tp) == validated and highwater is not None and highwater >= start:
                self._note_deletion(
                    tp, start, "log start poll", f"the log starts at offset {start}, and nothing after it was read"
                )
            else:
                self._behind_log_start[tp] = validated

    async def _log_starts(self, partitions: list[TP], attempts: int) -> dict[TP, int]:
        """The partitions' log start offsets (ListOffsets EARLIEST); those the broker did not
        give after `attempts` tries are left out (and logged)."""
        consumer = self.app.consumer
        if consumer is None:
            return {}
        failure: BaseException | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(LOG_START_RETRY_S)
            try:
                found = await asyncio.wait_for(consumer.earliest_offsets(*partitions), LOG_START_TIMEOUT_S)
            except (TimeoutError, KafkaError) as failed:
                failure = failed
                continue
            return {TP(tp.topic, tp.partition): offset for tp, offset in found.items() if offset >= 0}
        log.warning("log start offsets of %s not read: %r", sorted(f"{t}[{p}]" for t, p in partitions), failure)
        return {}

    def _note_deletion(self, tp: TP, log_start: int, detected_by: str, detail: str) -> None:
        """The partition's log starts at `log_start`: records deleted before they were
        validated become one incident, written with the partition's next unit."""
        deletion = self.live.log_starts_at(tp.topic, tp.partition, log_start, detected_by, detail)
        if deletion is None:
            return
        key = (tp.topic, tp.partition)
        incident = deletion_incident(deletion, self.clock())
        self.unit.add_incident(key, incident)
        self.stats.deletions_before_validation += 1
