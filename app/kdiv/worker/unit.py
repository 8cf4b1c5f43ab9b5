"""The unit of work: what a flush writes, per partition, and the crash protocol that writes it.

Validation adds to a `UnitOfWork` and does no I/O; `commit` then writes everything through a
`StateSink`, in the numbered steps of the crash protocol (`kdiv.worker.live` says why this
order makes a crash at any point lose nothing and report nothing twice):

1. Hand the key ledger entries and the route topics' observations to the producer.
2. Send the incidents, and wait until the incidents, ledger entries and observations are all
   acknowledged: a crash after this re-sends the same records under the same keys.
3. Write each partition's state: the partition state first, then its producers' states, in
   the order of one changelog partition.
4. Write the open traces of the observations partitions, and wait until the changelog
   records of the state and the traces are acknowledged.
5. Release: every write is handed over; the source offsets the unit covers may be committed
   from then on (never before: a commit says everything before it is saved). `commit`
   returns them: the unit owns its offsets, as records are taken (`cover`), carried through
   `split`, and the consumer only learns which offsets may commit (`Committed.offsets`).

A sink that fails at any step leaves a prefix of these writes; the source records after the
last commit are then read and validated again. A commit is bounded in time (`commit`'s
`timeout_s`): past it, or on a broker error, the unit keeps everything and the next `commit`
writes it all again under the same keys, so a retry doubles no incident and loses none
(`again` tells the sink to write tombstones it may already have written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from kdiv.incident.shape import Incident
from kdiv.worker.live import LiveValidation
from kdiv.worker.turns import loop_turns

# (key, value); value None deletes the key.
Change = tuple[bytes, bytes | None]


class StateSink(Protocol):
    """Where a unit of work is written: the incidents topic, the key ledger, the observations
    topic, the state and trace tables. A send returns the acknowledgements to wait for."""

    async def send_ledger(self, topic: str, partition: int, entries: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        """Step 1: key ledger entries of one watched partition, handed to the producer."""
        ...

    async def send_observations(self, records: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        """Step 1: observations (key, value) to the observations topic."""
        ...

    async def send_incidents(self, incidents: Sequence[Incident]) -> list[Awaitable]:
        """Step 2: incidents to the incidents topic."""
        ...

    async def write_state(
        self, topic: str, partition: int, changes: Sequence[Change], *, again: bool = False
    ) -> list[Awaitable]:
        """Step 3: one partition's state changes, in order, into its table; `again`: a retry
        of a failed commit (a delete may already be in the store, its tombstone not sent)."""
        ...

    async def write_traces(self, partition: int, changes: Sequence[Change], *, again: bool = False) -> list[Awaitable]:
        """Step 4: one observations partition's trace changes into the traces table."""
        ...

    async def release(self) -> None:
        """Step 5: every write handed over; the unit's source offsets may be committed."""
        ...


class AuditWrites(Protocol):
    """What the pipeline audit (`kdiv.worker.audit.PipelineAudit`) leaves to write."""

    def take_observations(self, topic: str, partition: int) -> list[tuple[bytes, bytes]]: ...

    def take_changes(self, partition: int) -> list[Change]: ...


@dataclass(slots=True)
class PartitionWork:
    """What one partition has pending: written together by `UnitOfWork.commit`."""

    incidents: list[Incident] = field(default_factory=list)
    ledger: list[tuple[bytes, bytes]] = field(default_factory=list)
    state: list[Change] = field(default_factory=list)
    has_state: bool = False
    observations: list[tuple[bytes, bytes]] = field(default_factory=list)
    traces: list[Change] = field(default_factory=list)
    # The source offset after the last record this work covers (None: it covers no record,
    # e.g. traces judged at a flush): committable once the work is written.
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Committed:
    """What one commit wrote, for the worker's counters."""

    # The incidents written, for the log (once acknowledged, as the topic has them).
    written_incidents: tuple[Incident, ...] = ()
    ledger_entries: int = 0
    state_writes: int = 0
    # Per partition, the source offset every record before which is validated and written:
    # what may be committed now.
    offsets: Mapping[tuple[str, int], int] = field(default_factory=dict)

    @property
    def incidents(self) -> int:
        return len(self.written_incidents)


class CommitTimedOut(Exception):
    """A commit did not finish within its bound; the unit keeps its writes for a retry."""


@dataclass(slots=True)
class CommitFailures:
    """The commits failing now: since when, how many attempts, the last error (for /health)."""

    since_ms: int | None = None
    attempts: int = 0
    last_error: str | None = None

    def failed(self, error: BaseException, now_ms: int) -> bool:
        """Count a failed attempt; True for the first of a run (the one to log)."""
        first = self.since_ms is None
        if first:
            self.since_ms = now_ms
        self.attempts += 1
        self.last_error = (str(error) or type(error).__name__)[:300]
        return first

    def succeeded(self) -> tuple[int | None, int]:
        """End a run of failures; (since, attempts) of the run that ended (since None: none)."""
        ended = (self.since_ms, self.attempts)
        self.since_ms, self.attempts, self.last_error = None, 0, None
        return ended


class UnitOfWork:
    """Pending writes per partition (topic, partition), validated and not yet written."""

    def __init__(self) -> None:
        self._work: dict[tuple[str, int], PartitionWork] = {}
        # A commit of this unit failed: the next one writes everything again.
        self.failed_commits = 0

    def _of(self, key: tuple[str, int]) -> PartitionWork:
        work = self._work.get(key)
        if work is None:
            work = self._work[key] = PartitionWork()
        return work

    def touch(self, key: tuple[str, int]) -> None:
        """The partition has validated records: its state is taken at the next commit."""
        self._of(key)

    def cover(self, key: tuple[str, int], next_offset: int) -> None:
        """Every record of the partition before `next_offset` is validated into this unit:
        once it is written, that offset may be committed."""
        self._of(key).offset = next_offset

    def uncover(self, key: tuple[str, int]) -> None:
        """The partition is read again from elsewhere (a seek): its pending work commits no
        offset until records are taken again."""
        work = self._work.get(key)
        if work is not None:
            work.offset = None

    def add_incident(self, key: tuple[str, int], incident: Incident) -> None:
        self._of(key).incidents.append(incident)

    def add_incidents(self, key: tuple[str, int], incidents: Iterable[Incident]) -> None:
        self._of(key).incidents.extend(incidents)

    def incidents(self, key: tuple[str, int]) -> list[Incident]:
        """The partition's pending incidents (empty when none)."""
        work = self._work.get(key)
        return [] if work is None else work.incidents

    def drop(self, key: tuple[str, int]) -> None:
        """Forget the partition's pending work (validated against a log that is gone)."""
        self._work.pop(key, None)

    @property
    def partitions(self) -> list[tuple[str, int]]:
        """The partitions with pending work, sorted."""
        return sorted(self._work)

    def __bool__(self) -> bool:
        return bool(self._work)

    def split(self, partitions: Iterable[tuple[str, int]]) -> UnitOfWork:
        """A unit of `partitions`' pending work, taken out of this one."""
        unit = UnitOfWork()
        unit.failed_commits = self.failed_commits
        for key in partitions:
            work = self._work.pop(key, None)
            unit._work[key] = work if work is not None else PartitionWork()
        return unit

    async def gather(self, live: LiveValidation, audit: AuditWrites | None, observations_topic: str) -> None:
        """Take into the unit what validation holds for its partitions: from `live` the key
        ledger entries and state writes (partition state first, then its producers), from
        `audit` the route partitions' observations and the observations partitions' traces.
        The event loop runs between slices of the producer states encoded (/health answers
        while 200,000 new producers' states are)."""
        turns = loop_turns()
        for key in self.partitions:
            await turns.pause_if_due()
            work = self._work[key]
            topic, partition = key
            if audit is not None:
                if topic == observations_topic:
                    work.traces.extend(audit.take_changes(partition))
                    continue
                work.observations.extend(audit.take_observations(topic, partition))
            work.ledger.extend(live.take_ledger_writes(topic, partition))
            slices = live.take_writes_in_slices(topic, partition)
            while True:
                try:
                    next(slices)
                except StopIteration as done:
                    writes = done.value
                    break
                await turns.pause_if_due()
            if writes is not None:
                work.state.extend(writes.in_order())
                work.has_state = True

    async def commit(self, sink: StateSink, timeout_s: float | None = None) -> Committed:
        """Write the unit through `sink` in the crash protocol's steps (module docstring); the
        unit is empty afterwards, and what it wrote names the offsets that may commit. Past `timeout_s` (CommitTimedOut) or on an exception from
        the sink, the unit keeps every write, and its next commit writes them all again."""
        work = sorted(self._work.items())
        # The offsets as they are now: records covered while the commit runs are not in it.
        offsets = {key: part.offset for key, part in work if part.offset is not None}
        try:
            committed = await asyncio.wait_for(self._write(work, sink, bool(self.failed_commits)), timeout_s)
        except TimeoutError:
            self.failed_commits += 1
            raise CommitTimedOut(f"the commit did not finish within {timeout_s:g} s") from None
        except BaseException:
            self.failed_commits += 1
            raise
        # Only what was taken: a partition added while the commit ran stays pending.
        for key, part in work:
            if self._work.get(key) is part:
                del self._work[key]
        self.failed_commits = 0
        return replace(committed, offsets=offsets)

    @staticmethod
    async def _write(work: list[tuple[tuple[str, int], PartitionWork]], sink: StateSink, again: bool) -> Committed:
        # 1. Ledger entries and observations handed over, their acks awaited in step 2.
        acks: list[Awaitable] = []
        ledger_entries = 0
        for (topic, partition), part in work:
            if part.ledger:
                acks += await sink.send_ledger(topic, partition, part.ledger)
                ledger_entries += len(part.ledger)
        observations = [record for _, part in work for record in part.observations]
        if observations:
            acks += await sink.send_observations(observations)
        # 2. Incidents before the state that accounts for them: a crash between the two
        # re-emits them under the same keys, never loses them.
        incidents = [incident for _, part in work for incident in part.incidents]
        if incidents:
            acks += await sink.send_incidents(incidents)
        await _acknowledged(acks)
        # 3. The state, partition by partition.
        state_writes = 0
        table_acks: list[Awaitable] = []
        turns = loop_turns()
        for (topic, partition), part in work:
            await turns.pause_if_due()
            if part.has_state:
                table_acks += await sink.write_state(topic, partition, part.state, again=again)
                state_writes += 1
        # 4. The open traces; both tables' changelogs acknowledged before the offsets commit.
        for (_topic, partition), part in work:
            if part.traces:
                table_acks += await sink.write_traces(partition, part.traces, again=again)
                state_writes += 1
        await _acknowledged(table_acks)
        # 5. Released: the source offsets may commit.
        await sink.release()
        return Committed(tuple(incidents), ledger_entries, state_writes)


async def _acknowledged(acks: list[Awaitable]) -> None:
    """Wait for every acknowledgement; shielded, so a commit given up (its bound passed)
    leaves the producer's own futures alone."""
    await asyncio.gather(*(asyncio.shield(ack) for ack in acks))
