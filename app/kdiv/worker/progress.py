"""The worker's progress, measured against the true log ends: per partition the validated
offset, the log end read from the broker (ListOffsets), the lag, the age of the oldest record
not yet validated, and whether the partition is `stalled` (docs/worker.md#liveness).

Pure: the offsets and times are handed in (`kdiv.worker.logends` reads the log ends,
the batch path reports what it committed); nothing here reads a clock or the broker.

The oldest unvalidated record's age comes from the log ends' history: the record at the
validated offset v was appended after the last read that saw the log end at or before v
(its age is at most the time since that read: an upper bound, by one poll when the reads
come every poll). Only the reads that moved the end are kept, each with the time it was last
seen unmoved, and only from the one before v on, so the history stays short while the worker
keeps up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from kdiv.clock import iso_utc

Key = tuple[str, int]

# Log end readings kept per partition at most; past it every other one is dropped (the
# first, the one the age is read from, stays), so the age stays an upper bound.
MAX_READINGS = 256


@dataclass(slots=True)
class _Partition:
    # The next offset to validate: every record before it is validated and committed.
    validated: int | None = None
    # The furthest validated offset: only passing it is progress (a seek back and a re-read
    # of validated records is not). Lowered with a log end below it (the log was truncated).
    best: int | None = None
    # When `best` last moved (or the partition was assigned).
    moved_at_ms: int = 0
    log_start: int | None = None
    log_end: int | None = None
    # (time last read, log end) of the reads that moved the log end, in order.
    readings: deque[tuple[int, int]] = field(default_factory=deque)
    stalled_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One partition's progress at a moment, as the views and metrics show it."""

    topic: str
    partition: int
    validated: int | None
    log_end: int | None
    # Records past the validated offset up to the true log end (None: not measured yet).
    lag: int | None
    # Age of the oldest record not yet validated, at most (0: none; None: not measured).
    lag_age_ms: int | None
    stalled_since_ms: int | None

    @property
    def stalled(self) -> bool:
        return self.stalled_since_ms is not None


@dataclass(frozen=True, slots=True)
class StallChange:
    """A partition began or ended a stall: one log line each."""

    key: Key
    began: bool
    since_ms: int
    lag: int | None


@dataclass(frozen=True, slots=True)
class Liveness:
    """Whether the worker makes progress, for /health, the dashboard and the metrics."""

    stalled: tuple[PartitionProgress, ...]
    # The log ends could not be read for the stall bound: progress is not measured.
    blind: bool
    blind_since_ms: int | None
    log_ends_error: str | None
    commit_failing_since_ms: int | None
    commit_attempts: int
    commit_error: str | None
    commit_failing_ms: int
    stall_ms: int
    # A restore of the tables whose remaining changelog records have not moved for the
    # stall bound: since when, and how many are left (None: none stalled).
    restore_stalled_since_ms: int | None = None
    restore_remaining: int | None = None

    @property
    def is_stalled(self) -> bool:
        return (
            bool(self.stalled)
            or self.blind
            or self.commit_failing_ms >= self.stall_ms
            or self.restore_stalled_since_ms is not None
        )

    def reasons(self) -> list[str]:
        """One line per reason, naming where and since when (ISO 8601 UTC)."""
        lines = [
            f"validation stalled on {p.topic}[{p.partition}] since {iso_utc(p.stalled_since_ms)}: "
            f"{p.lag} records not validated"
            for p in self.stalled
        ]
        if self.commit_failing_ms >= self.stall_ms:
            lines.append(
                f"commits failing since {iso_utc(self.commit_failing_since_ms)} "
                f"({self.commit_attempts} attempts): {self.commit_error}"
            )
        if self.blind:
            lines.append(f"progress unknown since {iso_utc(self.blind_since_ms)}: {self.log_ends_error}")
        if self.restore_stalled_since_ms is not None:
            lines.append(
                f"restoring the tables stalled since {iso_utc(self.restore_stalled_since_ms)}: "
                f"{self.restore_remaining} changelog records left"
            )
        return lines


class Progress:
    """Per assigned partition: validated offset against the true log end; a partition with
    records not validated and no progress for `stall_ms` is stalled."""

    def __init__(self, stall_ms: int) -> None:
        self.stall_ms = stall_ms
        self._parts: dict[Key, _Partition] = {}
        # Partitions no longer assigned, and since when: kept for the stall bound.
        self._gone: dict[Key, tuple[_Partition, int]] = {}
        # When measuring began, when the log ends were last read, and the last read's error.
        self.started_ms: int | None = None
        self.log_ends_read_at_ms: int | None = None
        self.log_ends_error: str | None = None
        # While the tables are restored: (changelog records left, since when that count).
        self._restore: tuple[int, int] | None = None
        # When the worker last validated past a partition's furthest offset, any partition.
        self.progressed_at_ms: int | None = None

    # -- what the worker reports ------------------------------------------------------------

    def assign(self, keys: set[Key] | list[Key], now_ms: int) -> None:
        """The partitions assigned now: new ones are measured from `now_ms`, gone ones
        forgotten. A partition assigned again within the stall bound of going (a rebalance,
        a group that rejoins again and again) goes on with its own clock: a rebalance is no
        progress."""
        if self.started_ms is None:
            self.started_ms = now_ms
        wanted = set(keys)
        for key in list(self._parts):
            if key not in wanted:
                self._gone[key] = (self._parts.pop(key), now_ms)
        for key in wanted:
            if key not in self._parts:
                gone = self._gone.pop(key, None)
                recent = gone is not None and now_ms - gone[1] < self.stall_ms
                self._parts[key] = gone[0] if gone is not None and recent else _Partition(moved_at_ms=now_ms)
        for key, (_, since) in list(self._gone.items()):
            if now_ms - since >= self.stall_ms:
                del self._gone[key]

    def hold(self, now_ms: int) -> None:
        """No progress is expected now (tables being restored): the stall clock starts again."""
        for part in self._parts.values():
            part.moved_at_ms = now_ms

    def restoring(self, remaining: int | None, now_ms: int) -> None:
        """The tables are being restored with `remaining` changelog records left (None: they
        are not): validation waits, so its stall clock starts again; the restore has a clock
        of its own, which any change of `remaining` starts again."""
        if remaining is None:
            self._restore = None
            return
        self.hold(now_ms)
        if self._restore is None or self._restore[0] != remaining:
            self._restore = (remaining, now_ms)

    def restore_stalled(self, now_ms: int) -> tuple[int, int] | None:
        """(since when, changelog records left) of a restore that has not moved for the stall
        bound; None while it moves, or when no restore runs."""
        if self._restore is None:
            return None
        remaining, since = self._restore
        return (since, remaining) if now_ms - since >= self.stall_ms else None

    def validated(self, key: Key, next_offset: int, now_ms: int) -> None:
        """Every record of `key` before `next_offset` is validated and committed. An offset
        below the last one is where the partition is read again from (a rewind, a seek back to
        the committed offset after a rebalance), and no progress: a worker that rejoins its
        group again and again validates nothing new."""
        part = self._parts.get(key)
        if part is None:
            return
        part.validated = next_offset
        if part.best is None or next_offset > part.best:
            part.best = next_offset
            part.moved_at_ms = now_ms
            self.progressed_at_ms = now_ms
            self._drop_readings_before(part)

    def starts_at(self, key: Key, offset: int | None, now_ms: int) -> None:
        """Where a partition with nothing validated yet starts (its committed offset, or
        None: from its log start)."""
        part = self._parts.get(key)
        if part is not None and part.validated is None and offset is not None:
            part.validated = part.best = offset
            part.moved_at_ms = now_ms

    def log_ends(self, ends: dict[Key, tuple[int, int]], now_ms: int) -> None:
        """The true (log start, log end) of partitions, read at `now_ms`."""
        self.log_ends_read_at_ms = now_ms
        self.log_ends_error = None
        for key, (start, end) in ends.items():
            part = self._parts.get(key)
            if part is None:
                continue
            part.log_start = start
            if part.readings and part.readings[-1][1] == end:
                # The same end seen again, all validated: what comes after it was appended after
                # this read, not the first one that saw it (a log that stood still, then grew).
                # Records not validated below it stay dated by the first read that saw them.
                validated = self._effective(part)
                if validated is not None and end <= validated:
                    part.readings[-1] = (now_ms, end)
            elif part.log_end is None or end != part.log_end:
                part.readings.append((now_ms, end))
                if len(part.readings) > MAX_READINGS:
                    kept = list(part.readings)
                    part.readings = deque([kept[0], *kept[1:-1:2], kept[-1]])
            part.log_end = end
            if part.best is not None and end < part.best:
                part.best = end  # truncated below what was validated: re-validating it is progress
            self._drop_readings_before(part)

    def log_ends_failed(self, error: str, now_ms: int) -> None:
        """Reading the log ends failed (the broker did not answer within its bound)."""
        self.log_ends_error = error

    def only_markers_before_end(self, key: Key, now_ms: int) -> None:
        """What lies between the validated offset and the log end holds no record a consumer
        reads (transaction markers, aborted records): the partition is caught up."""
        part = self._parts.get(key)
        if part is not None and part.log_end is not None:
            self.validated(key, part.log_end, now_ms)

    # -- what is measured -------------------------------------------------------------------

    def _effective(self, part: _Partition) -> int | None:
        """The validated offset, or the log start when records before it were deleted."""
        if part.validated is None:
            return part.log_start
        if part.log_start is not None and part.log_start > part.validated:
            return part.log_start
        return part.validated

    def _drop_readings_before(self, part: _Partition) -> None:
        # Keep the last reading at or before the validated offset: the record after it was
        # appended after that reading.
        v = self._effective(part)
        readings = part.readings
        if v is None:
            return
        while len(readings) > 1 and readings[1][1] <= v:
            readings.popleft()

    def _lag(self, part: _Partition) -> tuple[int | None, int | None]:
        """(records not validated, the time after which the oldest of them was appended: the
        last read that saw the log end at or before it; None when not measured)."""
        v = self._effective(part)
        if v is None or part.log_end is None:
            return None, None
        lag = max(part.log_end - v, 0)
        if lag == 0:
            return 0, None
        readings = part.readings
        appended_after = readings[0][0] if readings else None
        for at, end in readings:
            if end > v:
                break
            appended_after = at
        return lag, appended_after

    def judge(self, now_ms: int, en_route: Collection[Key] = ()) -> list[StallChange]:
        """Mark partitions stalled or not at `now_ms`; the partitions that changed.

        `en_route`: partitions whose records are on their way to the worker (taken and not yet
        written, fetched and waiting, or asked for in fetches their leader answered within the
        stall bound). While the worker makes progress elsewhere such a partition is behind,
        not stalled: it waits its turn in a queue that moves (a burst over 1,000 partitions
        kept some waiting longer than the stall bound, their fetches answered with others'
        records). A partition whose leader does not answer (frozen), or any partition of a
        worker that makes no progress at all, is stalled."""
        busy = self.progressed_at_ms is not None and now_ms - self.progressed_at_ms < self.stall_ms
        queued = frozenset(en_route) if busy else frozenset()
        changes = []
        for key, part in sorted(self._parts.items()):
            lag, appended_after = self._lag(part)
            stalled_since = None
            if lag and key not in queued:
                # Stalled from when both held: a backlog, and no progress since. The backlog
                # is dated by the last read before it was seen, so one seen only after the
                # log ends were unreadable for a while counts from before that.
                since = max(part.moved_at_ms, appended_after if appended_after is not None else now_ms)
                if now_ms - since >= self.stall_ms:
                    stalled_since = since
            if stalled_since is not None and part.stalled_since_ms is None:
                changes.append(StallChange(key, True, stalled_since, lag))
                part.stalled_since_ms = stalled_since
            elif stalled_since is None and part.stalled_since_ms is not None:
                changes.append(StallChange(key, False, part.stalled_since_ms, lag))
                part.stalled_since_ms = None
        return changes

    def measured_blind(self, now_ms: int) -> bool:
        """True when the log ends were not read for `stall_ms` (the broker does not answer, or
        not in time): progress is unknown."""
        last = self.log_ends_read_at_ms if self.log_ends_read_at_ms is not None else self.started_ms
        return last is not None and now_ms - last >= self.stall_ms

    @property
    def blind_since_ms(self) -> int | None:
        """Since when the log ends are unread (the last read, or the start)."""
        return self.log_ends_read_at_ms if self.log_ends_read_at_ms is not None else self.started_ms

    def _measured(self, key: Key, part: _Partition, now_ms: int) -> PartitionProgress:
        lag, appended_after = self._lag(part)
        age = None if lag is None else 0 if lag == 0 or appended_after is None else max(now_ms - appended_after, 0)
        return PartitionProgress(key[0], key[1], part.validated, part.log_end, lag, age, part.stalled_since_ms)

    def snapshot(self, now_ms: int) -> list[PartitionProgress]:
        """Every assigned partition's progress, sorted."""
        return [self._measured(key, part, now_ms) for key, part in sorted(self._parts.items())]

    def stalled(self, now_ms: int) -> list[PartitionProgress]:
        """The stalled partitions' progress, sorted (`judge` marks them): a health check asks
        for these alone, and measuring every partition cost it most of its time."""
        return [
            self._measured(key, part, now_ms)
            for key, part in sorted(self._parts.items())
            if part.stalled_since_ms is not None
        ]

    def of(self, key: Key, now_ms: int) -> PartitionProgress | None:
        """One partition's progress (None: not assigned here)."""
        part = self._parts.get(key)
        return None if part is None else self._measured(key, part, now_ms)

    def suspects(self, min_idle_ms: int, now_ms: int) -> list[tuple[Key, int, int]]:
        """Partitions whose small backlog has not moved for `min_idle_ms`: (key, validated,
        log end), to look whether it holds any record at all (`only_markers_before_end`)."""
        out = []
        for key, part in sorted(self._parts.items()):
            v = self._effective(part)
            if v is None or part.log_end is None or part.log_end <= v:
                continue
            if now_ms - part.moved_at_ms >= min_idle_ms:
                out.append((key, v, part.log_end))
        return out
