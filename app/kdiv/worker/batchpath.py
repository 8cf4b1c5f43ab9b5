"""The worker's batch path: one record's way from a fetched batch to a committable offset.

1. `process`: each partition's records go to the handler of its topic's kind
   (`kdiv.worker.kinds`), loaded first, which validates them into the unit of work; the unit
   covers the records taken (`UnitOfWork.cover`). A kind that stops before a push marker has
   what came before it committed first, then goes on from the marker.
2. `flush`: the checks that run before a commit (hooks, in order: schemas, held changefeed
   rows, traces, recreated topics, log starts, high watermarks, evictions), then the commit
   of the unit in the crash protocol's steps (`kdiv.worker.unit`), retried whole until it is
   written. It returns the offsets the written units let commit: all the consumer learns.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka.errors import KafkaError
from faust.types import TP

from kdiv.clock import iso_utc
from kdiv.worker.kinds import Key, TopicKinds
from kdiv.worker.live import LiveValidation
from kdiv.worker.ownership import Ownership
from kdiv.worker.unit import AuditWrites, CommitFailures, Committed, CommitTimedOut, StateSink, UnitOfWork

log = logging.getLogger("kdiv.worker")

# A commit that failed is tried again after this long, doubling up to the cap: a broker
# back from an outage is written to within seconds.
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 2.0
# What a commit may fail with and be tried again: a broker that does not answer, or not in time.
RETRIABLE = (KafkaError, CommitTimedOut, TimeoutError, OSError)

# A check run before each batch (it sees the batch), or before each flush's commit (it may
# add to the unit); a plain function or a coroutine function.
BatchHook = Callable[[Mapping[TP, Sequence]], Awaitable[None] | None]
FlushHook = Callable[[UnitOfWork], Awaitable[None] | None]


async def _run(hook: Callable[[Any], Awaitable[None] | None], argument: Any) -> None:
    outcome = hook(argument)
    if inspect.isawaitable(outcome):
        await outcome


class BatchPath:
    """Fetched batches into the unit of work (`process`), and its commit (`flush`)."""

    def __init__(
        self,
        *,
        kinds: TopicKinds,
        ownership: Ownership,
        unit: UnitOfWork,
        sink: StateSink,
        live: LiveValidation,
        clock: Callable[[], int],
        batch_max: int,
        audit: AuditWrites | None = None,
        observations: str = "",
        commit_timeout_s: float | None = None,
        before_batch: Sequence[BatchHook] = (),
        after_batch: Sequence[Callable[[], None]] = (),
        before_commit: Sequence[FlushHook] = (),
        on_committed: Sequence[Callable[[Committed], None]] = (),
        after_flush: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.kinds = kinds
        self.ownership = ownership
        self.unit = unit
        self.sink = sink
        # What validation holds for the unit's partitions (`UnitOfWork.gather`).
        self.live = live
        self.audit = audit
        self.observations = observations
        self.clock = clock
        # Records validated since the last flush past which `process` asks for one.
        self.batch_max = batch_max
        self.commit_timeout_s = commit_timeout_s
        self.before_batch = before_batch
        self.after_batch = after_batch
        self.before_commit = before_commit
        self.on_committed = on_committed
        self.after_flush = after_flush
        self.commit_failures = CommitFailures()
        self._unflushed_records = 0
        # Per partition, the offset written units let commit, not yet handed to the consumer.
        self._committable: dict[Key, int] = {}
        # The partitions of the batch being processed: taken from the consumer, validated in
        # turns, not all in the unit of work yet (the progress check counts them on their way).
        self.taking: frozenset[Key] = frozenset()

    def forget_offsets(self, keys: Iterable[Key]) -> None:
        """The partitions are read again from elsewhere (a seek): nothing taken before it
        may commit."""
        for key in keys:
            self.unit.uncover(key)
            self._committable.pop(key, None)

    async def process(self, batch: Mapping[TP, Sequence]) -> bool:
        """Validate fetched records (aiokafka's parsed records, in offset order per partition)
        into the unit of work, by the kind of their topic; written by `flush`. True when
        enough is pending to flush now."""
        self.taking = frozenset((tp.topic, tp.partition) for tp, records in batch.items() if records)
        try:
            return await self._process(batch)
        finally:
            self.taking = frozenset()

    async def _process(self, batch: Mapping[TP, Sequence]) -> bool:
        now = self.clock()
        self.ownership.load((tp.topic, tp.partition) for tp in batch)
        for hook in self.before_batch:
            await _run(hook, batch)
        for tp, records in batch.items():
            key = (tp.topic, tp.partition)
            kind = self.kinds.of(tp.topic)
            if kind is None or not records:
                continue
            start = 0
            while True:
                taken = await kind.take(key, records, start, now)
                if taken.stopped_at is None:
                    self.unit.cover(key, records[-1].offset + 1)
                    self._unflushed_records += len(records) - start
                    break
                if not taken.commit_first:
                    break  # not taken: read again
                # What came before the record at `stopped_at` is written (and may commit) first.
                self.unit.cover(key, records[taken.stopped_at].offset)
                self._unflushed_records += taken.stopped_at - start
                await self._commit(self.unit.split([key]))
                start = taken.stopped_at
        for after in self.after_batch:
            after()
        return self._unflushed_records >= self.batch_max

    async def flush(self) -> dict[Key, int]:
        """The checks before a commit, then the commit of everything validated since the last
        flush; the offsets that may commit now (of this commit and of any made since the last
        flush)."""
        for hook in self.before_commit:
            await _run(hook, self.unit)
        await self._commit(self.unit)
        self._unflushed_records = 0
        for after in self.after_flush:
            after()
        committable, self._committable = self._committable, {}
        return committable

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
        self._committable.update(committed.offsets)
        for listener in self.on_committed:
            listener(committed)
