"""The Faust transport kdiv workers use: Faust's aiokafka driver with exact end offsets.

Faust takes a changelog's end from the consumer's "highwaters" to know when recovery is
done. Two things go wrong there, and both make a restored table silently incomplete:

- faust-streaming 0.15 under ``processing_guarantee="exactly_once"`` reads them from the
  consumer's cached last stable offset, which is -1 for a partition never fetched: a
  taken-over table comes back empty. On every broker we ask the consumer instead
  (ListOffsets under its isolation level: the last stable offset when read_committed).
- Tansu answers ListOffsets too low (see `kdiv.kafka.tansu`); there the end comes from a
  Fetch. Only for Tansu.

Third, after every (re)assignment Faust loses records or stalls its commits, on any
broker. The fetcher already runs while tables recover, so records of source partitions
are fetched (and aiokafka's position moves past them) before Faust seeks the source
partitions back to their committed offsets (`perform_seek`) and resets its read offsets.
Then: aiokafka's `seek_to_committed` leaves a partition without a committed offset (or
committed at 0) where it is, so what was fetched and not processed there is never read;
records of a batch taken before the seek are still handed out after it, and the first
of them, far ahead of the reset read offset, makes Faust take the offsets in between
for a gap (as after compaction) and count them as processed, so a commit passes records
never validated, and the same gap later enters the acked offsets twice, after which the
commit advances one offset per commit interval; and a record being handed out while the
seek runs sets the read offset past the records fetched again, which are then dropped
as already read. `KdivConsumerThread` seeks every source partition (to its beginning
when nothing is committed: kdiv reads from the earliest offset) in one step and stamps
each batch with the number of seeks before it; `KdivConsumer` drops records of batches
taken before a seek that moved their partition, parks its fetch loop during the seek,
and forgets what was acked before it, so reading restarts exactly at the new positions.

The broker URL scheme selects the transport: ``kdiv://`` (any Kafka) or ``kdiv-tansu://``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, cast

import faust.transport.drivers as drivers
from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message

from kdiv.kafka.requests import bound_requests
from kdiv.kafka.tansu import end_offsets
from kdiv.worker.faustcompat.batches import BatchDrainConsumer
from kdiv.worker.faustcompat.epochs import end_offsets_for_epochs
from kdiv.worker.faustcompat.parsed import parse_in_bulk

KAFKA_SCHEME = "kdiv"
TANSU_SCHEME = "kdiv-tansu"


# Fetched record bytes one drain of the worker's consumer hands over at most (the first
# partition's whatever its size): what is parsed into objects at once. A DIV record of a
# small value takes about 70 bytes in a batch and ten times that parsed (its headers), so
# 16 MiB drains held 230,000 records (200 MB) at a time in a burst, and what the burst left
# allocated among them kept that memory in the process; 1 MiB is about 14,000 records.
DRAIN_BYTES = 1 << 20


# A partition's fetch is never asked smaller than this: a fetch costs the worker per partition
# it returns, whatever its size, and Kafka returns a first batch larger than the fetch size whole.
PARTITION_FETCH_FLOOR = 64 << 10


def partition_fetch_bytes(budget: int, partitions: int, ceiling: int) -> int:
    """The fetch size per partition that keeps what the fetcher holds within `budget` bytes:
    aiokafka fetches every partition that has nothing waiting, up to its fetch size, while
    the worker validates the others, so a backlog over many partitions is fetched whole
    (1 MiB, Faust's size, x 1,000 partitions). Never above `ceiling` (the configured size)
    nor below `PARTITION_FETCH_FLOOR`."""
    return max(min(ceiling, budget // max(partitions, 1)), min(PARTITION_FETCH_FLOOR, ceiling))


def within_drain_budget(fetched: Mapping, active: Any, budget: int) -> Any:
    """The active partitions whose fetched results, oldest first, fit in `budget` bytes (at
    least the first); all of `active`, as Faust asked, when every fetched result fits (the
    drain then waits for any partition, as it always did)."""
    chosen: set = set()
    used = 0
    left_out = False
    for tp, result in list(fetched.items()):
        if not _is_active(tp, active):
            continue
        size = _fetched_bytes(result)
        if chosen and used + size > budget:
            left_out = True
            break
        chosen.add(tp)
        used += size
    return chosen if left_out else active


def _is_active(tp: Any, active: Any) -> bool:
    """Whether a drain asking for `active` takes `tp`: none given is every partition (aiokafka's rule)."""
    return not active or tp in active


def has_fetched(fetched: Mapping, active: Any) -> bool:
    """Whether any active partition has a fetch result waiting."""
    return any(_is_active(tp, active) for tp in fetched)


async def wait_for_fetched(fetcher: Any, timeout: float) -> None:
    """Until the fetcher has new results, or `timeout` seconds; its error, if it has one (an
    authorization failure), raised as aiokafka's own drain would."""
    waiter = fetcher._create_fetch_waiter()
    done, _ = await asyncio.wait([waiter], timeout=timeout)
    if not done:
        waiter.cancel()
    elif not waiter.cancelled():
        waiter.result()


def _fetched_bytes(result: Any) -> int:
    """The record bytes a fetch result holds (an error holds none)."""
    partition_records = getattr(result, "_partition_records", None)
    records = getattr(partition_records, "_records", None)
    return records.size_in_bytes() if records is not None else 0


class _Fetched(dict):
    """A batch of fetched records, with the consumer thread's seek count when it was taken
    and its drain's number (`BatchDrainConsumer.hold`)."""

    seeks = 0
    drain: int | None = None


class KdivConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread with exact end offsets and seeks that lose nothing."""

    tansu = False
    # Seeks back to committed offsets so far, and per source partition the count right
    # after the last one that moved it. Only the consumer thread's loop changes them.
    _seeks = 0
    _moved: dict[TP, int]
    # Per source partition, the highest offset the next seek may move it to: the first
    # offset its saved state has not validated (`KdivConsumer.cap_next_seek`).
    _caps: dict[TP, int]

    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        if not self.tansu:
            # DIV judges what the topic's consumers read: committed records only, under
            # either processing guarantee. An aborted transaction's records are no data (a
            # DivWriter takes their seqs again), and Faust reads them under at_least_once.
            # (Tansu delivers aborted records whatever the isolation level.)
            consumer._isolation_level = "read_committed"
        return consumer

    async def on_partitions_assigned(self, assigned, generation_id: int = 0) -> None:
        """Faust's, after the fetch size per partition is set for the new assignment."""
        handler = cast(BatchDrainConsumer, self.consumer).batch_handler
        # A handler without a budget leaves aiokafka's size (an error here would stop the
        # rebalance, and the worker with it).
        budget = getattr(handler, "fetch_buffer_bytes", None)
        if isinstance(budget, int):
            fetcher = self._ensure_consumer()._fetcher
            fetcher._max_partition_fetch_bytes = partition_fetch_bytes(
                budget, len(assigned), self.app.conf.consumer_max_fetch_size
            )
        await super().on_partitions_assigned(assigned, generation_id)

    async def on_start(self) -> None:
        """Faust's start of the aiokafka consumer; then, before any assignment lets it fetch,
        its watched topics' records parsed in bulk (`kdiv.worker.faustcompat.parsed`)."""
        await super().on_start()
        handler = cast(BatchDrainConsumer, self.consumer).batch_handler
        if handler is not None:
            parse_in_bulk(self._ensure_consumer(), handler.topics)

    def verify_event_path(self, now: float, tp: TP) -> None:
        """Faust's livelock check of one partition, for the partitions Faust's streams read
        (changelogs) only. The watched topics' records never pass through a Faust stream, so
        Faust would judge them stuck ("Stream has not started processing", a 17-line error
        every few seconds) while they are validated; their progress is measured against the
        true log ends instead (`kdiv.worker.logends`). It is also skipped while a partition
        has no position (aiokafka resetting it after records were deleted under the worker),
        where Faust's check would crash the worker."""
        handler = cast(BatchDrainConsumer, self.consumer).batch_handler
        if handler is not None and tp.topic in handler.topics:
            return None
        subscription = self._ensure_consumer()._fetcher._subscriptions.subscription
        assignment = None if subscription is None else subscription.assignment
        state = None if assignment is None else assignment.state_value(TopicPartition(tp.topic, tp.partition))
        if state is not None and not state.has_valid_position:
            return None
        return super().verify_event_path(now, tp)

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        return await end_offsets(self._ensure_consumer(), partitions, tansu=self.tansu)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Every assigned partition to its committed offset, in one step (see the module doc)."""
        return await self.call_thread(self._seek_to_committed)

    async def _seek_to_committed(self) -> Mapping[TP, int]:
        """Move every assigned partition to its committed offset, and every source
        partition without one (or committed at 0, which aiokafka leaves alone) to its
        beginning: kdiv workers read from the earliest offset."""
        consumer = self._ensure_consumer()
        changelogs = self.app.tables.changelog_topics
        partitions = sorted(consumer.assignment())
        committed: dict[TP, int | None] = {tp: await consumer.committed(tp) for tp in partitions}
        caps = self.__dict__.setdefault("_caps", {})
        resumed = self.__dict__.setdefault("_resumed", {})
        for tp, cap in caps.items():
            if tp in committed and (committed[tp] is None or cast(int, committed[tp]) > cap):
                if committed[tp] is None and cap:
                    resumed[tp] = cap
                committed[tp] = cap  # 0: from the beginning
        caps.clear()
        unset = [tp for tp in partitions if not committed[tp] and tp.topic not in changelogs]
        beginnings = await consumer.beginning_offsets(unset) if unset else {}
        targets = {tp: committed[tp] or beginnings.get(tp) for tp in partitions}
        self._seek_stamped(consumer, {tp: offset for tp, offset in targets.items() if offset is not None})
        return {tp: offset for tp, offset in committed.items() if offset is not None}

    def _seek_stamped(self, consumer, offsets: Mapping[TP, int]) -> None:
        """Seek each partition still assigned (a rebalance may have begun meanwhile) and
        stamp it moved. Never awaits: a batch is taken from the fetcher wholly before or
        wholly after these seeks, and `_fetch_records` stamps it with the count of seeks."""
        self._seeks += 1
        moved = self.__dict__.setdefault("_moved", {})
        still_assigned = consumer.assignment()
        for tp, offset in offsets.items():
            if tp in still_assigned:
                consumer.seek(tp, offset)
                moved[tp] = self._seeks

    async def restart_from_beginning(self, partitions: list[TP]) -> None:
        """Move `partitions` to their beginning now, dropping what was fetched before."""
        await self.call_thread(self._restart_from_beginning, partitions)

    async def _restart_from_beginning(self, partitions: list[TP]) -> None:
        consumer = self._ensure_consumer()
        assigned = consumer.assignment()
        beginnings = await consumer.beginning_offsets([tp for tp in partitions if tp in assigned])
        self._seek_stamped(consumer, beginnings)

    async def restart_at(self, offsets: Mapping[TP, int]) -> None:
        """Move partitions to the given offsets now, dropping what was fetched before."""
        await self.call_thread(self._restart_at, offsets)

    async def _restart_at(self, offsets: Mapping[TP, int]) -> None:
        self._seek_stamped(self._ensure_consumer(), offsets)

    async def leader_epoch_ends(self, epochs: Mapping[TP, int]) -> Mapping[TP, tuple[int, int]]:
        """`kdiv.worker.faustcompat.epochs.end_offsets_for_epochs`, on the consumer's client."""
        return await self.call_thread(self._leader_epoch_ends, epochs)

    async def _leader_epoch_ends(self, epochs: Mapping[TP, int]) -> Mapping[TP, tuple[int, int]]:
        return await end_offsets_for_epochs(self._ensure_consumer()._client, epochs)

    async def _fetch_records(self, consumer, active_partitions, timeout=None, max_records=None) -> _Fetched:
        # Faust drains every partition's fetched records at once: after a burst over 1,000
        # partitions, two million records parsed into one batch (a gigabyte). Those past the
        # budget stay fetched, as bytes, for the next call. aiokafka's drain, when nothing is
        # fetched yet, waits and then takes all that came meanwhile (a fetch response of up
        # to 50 MiB: 230,000 records in one drain at 1,000 partitions): the wait is here, so
        # the budget is applied to what the wait brought.
        fetcher = consumer._fetcher
        if timeout and not has_fetched(fetcher._records, active_partitions):
            await wait_for_fetched(fetcher, timeout)
            timeout = 0
        chosen = within_drain_budget(fetcher._records, active_partitions, DRAIN_BYTES)
        records = _Fetched(await super()._fetch_records(consumer, chosen, timeout, max_records))
        records.seeks = self._seeks
        if records:
            drainer = cast(BatchDrainConsumer, self.consumer)
            records.drain = drainer.hold(frozenset((tp.topic, tp.partition) for tp, taken in records.items() if taken))
        return records

    def fetch_only_unpaused(self, paused: set[TP], resumed: set[TP]) -> None:
        """From any thread: have aiokafka stop fetching `paused` and fetch `resumed` again
        (done in the consumer thread, whose loop owns aiokafka's partition states)."""
        self.thread_loop.call_soon_threadsafe(self._fetch_only_unpaused, paused, resumed)

    def _fetch_only_unpaused(self, paused: set[TP], resumed: set[TP]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        assigned = consumer.assignment()
        stop = [TopicPartition(tp.topic, tp.partition) for tp in paused if tp in assigned]
        consumer.pause(*stop)
        # What was fetched of them and not taken is dropped: their position has not moved
        # past it, so they are read from there when resumed.
        for tp in stop:
            consumer._fetcher._records.pop(tp, None)
        consumer.resume(*(TopicPartition(tp.topic, tp.partition) for tp in resumed if tp in assigned))

    def take_resumed(self) -> dict[TP, int]:
        """Partitions the last seek resumed where their saved state ends, with nothing
        committed: the offset each resumed at."""
        resumed, self.__dict__["_resumed"] = self.__dict__.get("_resumed", {}), {}
        return resumed

    def moved_since(self, tp: TP, seeks: int) -> bool:
        """True when a seek moved the partition after a batch with `seeks` was taken."""
        return self.__dict__.get("_moved", {}).get(tp, 0) > seeks


class TansuConsumerThread(KdivConsumerThread):
    """The same on Tansu, whose end offsets come from a Fetch."""

    tansu = True


class KdivConsumer(BatchDrainConsumer, faust_aiokafka.Consumer):
    """Faust's aiokafka consumer with kdiv's batch loop and exact seeks."""

    thread_class: type[KdivConsumerThread] = KdivConsumerThread
    _batch_seeks = 0

    # Faust pauses a partition by leaving it out of what it takes from the fetcher, which
    # still fetched it: the worker's own changelog partitions, paused once restored, were
    # fetched as the worker wrote its state. In a burst over 1,000 partitions that doubled
    # the worker's CPU per record (fetches answered at once, one after the other, each
    # naming every such partition) and held fetched state writes. Paused here, aiokafka
    # does not fetch them either.
    def pause_partitions(self, tps) -> None:
        super().pause_partitions(tps)
        cast(KdivConsumerThread, self._thread).fetch_only_unpaused(set(tps), set())

    def resume_partitions(self, tps) -> None:
        super().resume_partitions(tps)
        cast(KdivConsumerThread, self._thread).fetch_only_unpaused(set(), set(tps))

    async def _getmany(self, active_partitions, timeout: float):
        records = await super()._getmany(active_partitions, timeout)
        self._batch_seeks = getattr(records, "seeks", 0)
        return records

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        """Faust's per-message fetch, without records taken before a seek moved their partition."""
        thread = cast(KdivConsumerThread, self._thread)
        async with aclosing(super().getmany(timeout)) as batch:  # type: ignore[type-var]
            async for tp, message in batch:
                if thread.moved_since(tp, self._batch_seeks):
                    # Taken before a seek moved this partition: it is read again from
                    # its new position, in order.
                    continue
                yield tp, message

    async def perform_seek(self) -> None:
        """Faust's seek after assignment, with the fetch loop parked and old acks forgotten."""
        flowing = self.flow_active
        if flowing:
            # Park the fetch loop first: the record it is handing out may be stale after
            # the seek, and Faust records its read offset once it is handed out, which
            # must happen before the seek resets the read offsets, not after.
            self.stop_flow()
        try:
            await super().perform_seek()
            # Everything after the committed offsets is read again: what was acked (or
            # taken for a gap) before counts for nothing.
            changelogs = self.app.tables.changelog_topics
            self._forget_progress([tp for tp in self.assignment() if tp.topic not in changelogs])
            # Resumed where the saved state ends with nothing committed: that position is
            # committed at the next commit, not only after the partition's next record (until
            # then its group has no offset there, and lag monitors see nothing).
            resumed = cast(KdivConsumerThread, self._thread).take_resumed()
            for tp in resumed:
                self._committed_offset[tp] = None  # Faust took the seek position for a commit
            self.mark_flushed(resumed)
        finally:
            if flowing:
                self.resume_flow()

    def cap_next_seek(self, caps: Mapping[TP, int]) -> None:
        """Have the seek after this assignment move each partition to its committed offset
        or its cap, whichever is lower: the cap is the first offset its saved state has not
        validated (0, the beginning, after a rewind), and a committed offset past it counts
        records that were never validated or belong to a log that is gone."""
        thread = cast(KdivConsumerThread, self._thread)
        thread.__dict__.setdefault("_caps", {}).update(caps)

    async def restart_from_beginning(self, partitions: list[TP]) -> None:
        """Read `partitions` again from their beginning, now (their log was rewound): what
        was fetched, processed or flushed before counts for nothing, and nothing is
        committed for them until records after the restart are flushed."""
        thread = cast(KdivConsumerThread, self._thread)
        await thread.restart_from_beginning(partitions)
        for tp in partitions:
            self._read_offset[tp] = None
            self._committed_offset[tp] = None
        self._forget_progress(partitions)

    async def restart_at(self, offsets: Mapping[TP, int]) -> None:
        """Read partitions again from the given offsets, now (their logs were truncated
        there): as `restart_from_beginning`, from those offsets."""
        thread = cast(KdivConsumerThread, self._thread)
        await thread.restart_at(offsets)
        for tp in offsets:
            self._read_offset[tp] = None
            self._committed_offset[tp] = None
        self._forget_progress(list(offsets))

    def _forget_progress(self, partitions: list[TP]) -> None:
        """Drop what was acked, taken for a gap or batched for `partitions`: they are read again."""
        for tp in partitions:
            self._acked.pop(tp, None)
            self._acked_index.pop(tp, None)
            self._gap.pop(tp, None)
        self.forget_batches(partitions)

    def _new_consumer_thread(self) -> KdivConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)


class TansuConsumer(KdivConsumer):
    """KdivConsumer on Tansu."""

    thread_class = TansuConsumerThread


class KdivProducer(faust_aiokafka.Producer):
    """Faust's aiokafka producer, each request within its `max_request_size`
    (`kdiv.kafka.requests`: a state write of 1,000 partitions was one request of 107 MB)."""

    def _new_producer(self, transactional_id=None):
        producer = super()._new_producer(transactional_id)
        bound_requests(producer, name="the worker's producer (state changelogs, incidents)")
        return producer


class KdivTransport(faust_aiokafka.Transport):
    """The transport of broker URLs `kdiv://`."""

    Consumer = KdivConsumer
    Producer = KdivProducer


class TansuTransport(faust_aiokafka.Transport):
    """The transport of broker URLs `kdiv-tansu://`."""

    Consumer = TansuConsumer
    Producer = KdivProducer


drivers.TRANSPORTS.aliases[KAFKA_SCHEME] = f"{__name__}:KdivTransport"
drivers.TRANSPORTS.aliases[TANSU_SCHEME] = f"{__name__}:TansuTransport"


def cap_next_seek(consumer, caps: Mapping[TP, int]) -> None:
    """`KdivConsumer.cap_next_seek`, for Faust's app.consumer."""
    cast(KdivConsumer, consumer).cap_next_seek(caps)


async def restart_from_beginning(consumer, partitions: list[TP]) -> None:
    """`KdivConsumer.restart_from_beginning`, for Faust's app.consumer."""
    await cast(KdivConsumer, consumer).restart_from_beginning(partitions)


async def restart_at(consumer, offsets: Mapping[TP, int]) -> None:
    """`KdivConsumer.restart_at`, for Faust's app.consumer."""
    await cast(KdivConsumer, consumer).restart_at(offsets)


async def leader_epoch_ends(consumer, epochs: Mapping[TP, int]) -> Mapping[TP, tuple[int, int]]:
    """Where each partition's given leader epoch ends in its leader's log: (epoch, end offset)
    (`kdiv.worker.faustcompat.epochs`), for Faust's app.consumer."""
    return await cast(KdivConsumerThread, cast(KdivConsumer, consumer)._thread).leader_epoch_ends(epochs)


def broker_url(bootstrap: str, *, tansu: bool) -> str:
    """Faust broker URL(s) for a bootstrap list "host:port[,host:port...]"."""
    scheme = TANSU_SCHEME if tansu else KAFKA_SCHEME
    hosts = [h.strip() for h in bootstrap.split(",") if h.strip()]
    if not hosts:
        raise ValueError("empty bootstrap address")
    return ";".join(f"{scheme}://{h.removeprefix('kafka://')}" for h in hosts)
