"""The watched topics' records in whole fetched batches, past Faust's per-event stream.

Faust hands every record to its streams one at a time: a Message, then an Event, a queue
hand-off, an asyncio.wait over new tasks per record, and an ack. That costs about 100 us a
record, twenty times what validating it does. kdiv keeps Faust for everything else (group
membership, assignment, tables and their recovery, standbys, commits, the web server) and
takes the source records straight from Faust's consumer: `BatchDrainConsumer` replaces the
fetch loop (`Consumer._drain_messages`), gives each fetched batch of the watched topics to a
`SourceBatchHandler` as aiokafka's own records, and passes every other record (changelogs
being restored or kept as standbys) to Faust exactly as Faust's loop does.

Commits: the handler validates in `process` and keeps what it found pending, with the
offsets it covers (its unit of work owns them); `flush` writes it in the order the crash
protocol needs (incidents acknowledged, then state) and returns the offsets that may commit
now. Those are all the consumer keeps: `_new_offset` (what Faust commits) is the offset the
handler last let commit, so one commit covers everything before it and no per-record
bookkeeping is needed. Faust's commit ticks and its rebalance and shutdown path
(`wait_empty`) flush first.

Records: for the watched topics the fetcher of the consumer Faust starts for kdiv hands over
its parsed records in bulk, not a ConsumerRecord each (`kdiv.worker.faustcompat.parsed`,
installed by `kdiv.worker.faustcompat.transport`).

Rebalances stay exact: a batch is processed and flushed under one lock, which Faust's
revocation (through `wait_empty`) waits for, so a revoked partition is never written after
its revocation; a batch fetched before a rebalance began (flow stopped, or another
generation) is dropped unprocessed, and its records are fetched again from the committed
offsets when the new assignment seeks there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from aiokafka import TopicPartition
from faust.types import TP

from kdiv.worker.faustcompat.epochs import records_from


class SourceBatchHandler(Protocol):
    """What the fetch loop hands the watched topics' records to (the validation worker)."""

    topics: frozenset[str]
    # The fetched bytes the consumer may hold for the handler, shared by the assigned
    # partitions (`kdiv.worker.faustcompat.transport.partition_fetch_bytes`).
    fetch_buffer_bytes: int

    async def process(self, batch: Mapping[TP, Sequence[Any]]) -> bool:
        """Validate fetched records (aiokafka's parsed records: offset, timestamp, key, value,
        headers; in offset order per partition); True when enough is pending that it should
        be flushed now."""
        ...

    async def flush(self) -> Mapping[tuple[str, int], int]:
        """Write everything pending; the offsets that may be committed now, per (topic, partition)."""
        ...

    def forget_offsets(self, keys: Sequence[tuple[str, int]]) -> None:
        """The partitions were moved (a seek): nothing taken before may commit."""
        ...

    def on_flushed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Every record before these offsets counts as validated and written (a partition
        resumed where its saved state ends, with nothing to read before it)."""
        ...


_HANDLER = "kdiv_batch_handler"


def attach_batch_handler(app: Any, handler: SourceBatchHandler) -> None:
    """Hand the app's watched-topic records to `handler` (its consumer is made later)."""
    setattr(app, _HANDLER, handler)


class BatchDrainConsumer:
    """Mixin for Faust's aiokafka Consumer: the batch fetch loop and commits by flushed offset."""

    _lock: asyncio.Lock | None = None
    _lock_owner: asyncio.Task | None = None

    @property
    def batch_handler(self) -> SourceBatchHandler | None:
        """The handler attached to the app, if any (`attach_batch_handler`)."""
        return getattr(self.app, _HANDLER, None)  # type: ignore[attr-defined]

    @property
    def _batch_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _offsets(self, name: str) -> dict[TP, int]:
        return self.__dict__.setdefault(name, {})

    # -- Faust's private loop, replaced --------------------------------------------------

    async def _drain_messages(self, fetcher) -> None:
        handler = self.batch_handler
        if handler is None:
            await super()._drain_messages(fetcher)  # type: ignore[misc]
            return
        consumer_should_stop = self._stopped.is_set  # type: ignore[attr-defined]
        fetcher_should_stop = fetcher._stopped.is_set
        # The next batch is fetched (and parsed, in the consumer thread) while this one is
        # validated: otherwise each waits for the other. Batches stay in fetch order.
        fetching: asyncio.Future | None = None
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                if fetching is None:
                    fetching = asyncio.ensure_future(self._fetch_batch())
                records, active, generation = await fetching
                fetching = asyncio.ensure_future(self._fetch_batch())
                try:
                    await asyncio.sleep(0)
                    if not records or self.should_stop:  # type: ignore[attr-defined]
                        continue
                    await self._take(handler, records, active, generation)
                finally:
                    self.release_held(getattr(records, "drain", None))
        except self.consumer_stopped_errors:  # type: ignore[attr-defined]
            if self.transport.app.should_stop:  # type: ignore[attr-defined]
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:  # type: ignore[attr-defined]
                return
            raise
        finally:
            if fetching is not None and not fetching.done():
                fetching.cancel()
            self._held().clear()

    async def _fetch_batch(self) -> tuple[Any, Any, int]:
        """Faust's fetch, with the consumer generation it was taken in."""
        records, active = await self._wait_next_records(timeout=1.0)  # type: ignore[attr-defined]
        return records, active, self.app.consumer_generation_id  # type: ignore[attr-defined]

    # -- records drained from the fetcher, not yet taken ------------------------------------

    def _held(self) -> dict[int, frozenset[tuple[str, int]]]:
        return self.__dict__.setdefault("_kdiv_held", {})

    def hold(self, partitions: frozenset[tuple[str, int]]) -> int:
        """The consumer thread drained these partitions' records from the fetcher: they are
        on their way (`records_held`) until the drain's batch is taken. The drain's number."""
        number = self.__dict__.get("_kdiv_drains", 0) + 1
        self.__dict__["_kdiv_drains"] = number
        self._held()[number] = partitions
        return number

    def release_held(self, drain: int | None) -> None:
        """The batch of drain `drain` was taken (or dropped): it and every earlier drain,
        whose batches came before it, are no longer on their way."""
        if drain is None:
            return
        held = self._held()
        for number in [n for n in list(held) if n <= drain]:
            held.pop(number, None)

    def records_held(self) -> frozenset[tuple[str, int]]:
        """The partitions of batches drained from the fetcher and not yet taken (the next
        batch, drained in the consumer thread while this one is validated, and this one
        until it is): their records are in neither the fetcher nor the unit of work."""
        return frozenset().union(*list(self._held().values()))

    async def _take(self, handler: SourceBatchHandler, records, active, generation: int) -> None:
        thread = self._thread  # type: ignore[attr-defined]
        seeks = getattr(records, "seeks", 0)
        buffered = self._buffered_partitions  # type: ignore[attr-defined]
        read_offset = self._read_offset  # type: ignore[attr-defined]
        monitor = self.app.monitor  # type: ignore[attr-defined]
        batch: dict[TP, Sequence[Any]] = {}
        others = []
        for tp, tp_records in records.items():
            if active is not None and tp not in active and tp not in buffered:
                continue
            if thread.moved_since(tp, seeks):
                # Taken before a seek moved this partition: read again from its new position.
                continue
            monitor.track_tp_end_offset(tp, self.highwater(tp))  # type: ignore[attr-defined]
            if tp.topic not in handler.topics:
                others.append((tp, tp_records))
                continue
            start = read_offset[tp]
            if start is not None and tp_records and tp_records[0].offset < start:
                tp_records = records_from(tp_records, start)
            if tp_records:
                batch[tp] = tp_records
        for tp, tp_records in others:
            await self._deliver_one_by_one(tp, tp_records)
        if not batch:
            return
        async with self._batch_lock:
            if not self.flow_active or self.app.consumer_generation_id != generation:  # type: ignore[attr-defined]
                # A rebalance began after the fetch: the new assignment reads these again.
                return
            for tp, tp_records in batch.items():
                read_offset[tp] = tp_records[-1].offset + 1
            if await handler.process(batch):
                await self._flush_locked(handler)

    async def _deliver_one_by_one(self, tp: TP, tp_records) -> None:
        """Faust's own per-message path, for the records that are not the watched topics'."""
        to_message = self._to_message  # type: ignore[attr-defined]
        callback = self.callback  # type: ignore[attr-defined]
        read_offset = self._read_offset  # type: ignore[attr-defined]
        acks_enabled_for = self.app.topics.acks_enabled_for  # type: ignore[attr-defined]
        for count, record in enumerate(tp_records):
            if count and not count % 100:
                await asyncio.sleep(0)
            offset = record.offset
            r_offset = read_offset[tp]
            if r_offset is None or offset >= r_offset:
                if offset - (r_offset or 0) > 1 and r_offset and acks_enabled_for(tp.topic):
                    await self._add_gap(tp, r_offset + 1, offset)  # type: ignore[attr-defined]
                await self.wait_first(callback(to_message(tp, record)), self.suspend_flow.wait())  # type: ignore[attr-defined]
                read_offset[tp] = offset

    # -- flushing before Faust commits ----------------------------------------------------

    async def _flush_locked(self, handler: SourceBatchHandler) -> None:
        # As aiokafka's TopicPartition: a transactional commit (exactly_once) takes no other.
        committable = await handler.flush()
        self._offsets("_kdiv_flushed").update((TopicPartition(*key), offset) for key, offset in committable.items())

    async def flush_batches(self) -> None:
        """Write what the handler holds, once the batch in progress is done."""
        handler = self.batch_handler
        if handler is None:
            return
        if self._lock_owner is asyncio.current_task():
            await self._flush_locked(handler)
            return
        async with self._batch_lock:
            await self._flush_locked(handler)

    async def commit(self, *args, **kwargs) -> bool:
        """Faust's commit, after writing what the handler holds."""
        await self.flush_batches()
        return await super().commit(*args, **kwargs)  # type: ignore[misc]

    async def wait_empty(self) -> None:
        """Faust's wait before revocation and shutdown: the batch in progress ends first."""
        # Faust's revocation and shutdown wait here for in-flight work, then commit: hold
        # the batch lock throughout, so no batch starts before Faust has committed.
        async with self._batch_lock:
            self._lock_owner = asyncio.current_task()
            try:
                await self.flush_batches()
                await super().wait_empty()  # type: ignore[misc]
            finally:
                self._lock_owner = None

    def _new_offset(self, tp: TP) -> int | None:
        handler = self.batch_handler
        if handler is not None and tp.topic in handler.topics:
            return self._offsets("_kdiv_flushed").get(tp)
        return super()._new_offset(tp)  # type: ignore[misc]

    def _filter_tps_with_pending_acks(self, topics=None):
        # Faust looks for commits to make among partitions with acked messages; flushed
        # batches ack none, so their partitions are named here.
        seen = set()
        for tp in super()._filter_tps_with_pending_acks(topics):
            seen.add(tp)
            yield tp
        for tp in self._offsets("_kdiv_flushed"):
            if tp not in seen and (topics is None or tp in topics or tp.topic in topics):
                yield tp

    def mark_flushed(self, offsets: Mapping[TP, int]) -> None:
        """Have the next commit commit these offsets, as if records up to them were flushed."""
        self._offsets("_kdiv_flushed").update(offsets)
        handler = self.batch_handler
        if handler is not None:
            handler.on_flushed({(tp.topic, tp.partition): offset for tp, offset in offsets.items()})

    def forget_batches(self, tps) -> None:
        """After a seek: what was processed or flushed before it counts for nothing."""
        tps = list(tps)
        for tp in tps:
            self._offsets("_kdiv_flushed").pop(tp, None)
        handler = self.batch_handler
        if handler is not None:
            handler.forget_offsets([(tp.topic, tp.partition) for tp in tps])
