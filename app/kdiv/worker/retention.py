"""Records deleted from a partition's log before the worker validated them.

Retention (`retention.ms`, `retention.bytes`) and DeleteRecords move a partition's log start
forward. When it passes the offset after the last one the worker validated (the worker lags,
or is down), the consumer resets to the new log start and the records in between are never
read. Compaction and transaction markers leave gaps too, but their fetch starts where the
previous one left off; when a batch's fetch jumped past the next offset to validate, the
worker asks the broker for the log start (`kdiv.worker.service`), and `LiveValidation`
accounts the range as read and reports it once (`Deletion`).

The producers whose records were in that range show it by their next record: a sequence
gap (MISSING), or a segment without its START_OF_SEGMENT (UNREGISTERED_PRODUCER). Which of
them lost records there is only known when their next record comes, so `BehindDeletions`
keeps, per partition, every producer last seen before a deletion until then, and the loss
its next record shows, so that the same loss reported again (the exact semantics' gap
incident as it changes, Venice's MISSING for every later record inside a push) says so too.

Pure: no I/O. Kept in memory only: a worker that restarts after the deletion was saved as
accounted for no longer knows which producers were behind it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kdiv.div.faults import Verdict
from kdiv.div.validator import ValidationResult

# What a producer's next record says when its records before it were deleted: its seqs
# jump (MISSING), or its new segment's START_OF_SEGMENT was among them.
LOSS_VERDICTS = frozenset({Verdict.MISSING, Verdict.UNREGISTERED_PRODUCER})


@dataclass(frozen=True, slots=True)
class Deletion:
    """Offsets `first_offset`..`last_offset` of a partition, deleted from its log (retention,
    DeleteRecords) before the worker validated them: from the first offset it had not
    validated to the one before the log start the broker reported."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    detected_by: str  # "fetch" (records read past a gap) or "log start poll"
    detail: str
    in_push: bool

    @property
    def size(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass(frozen=True, slots=True)
class _Loss:
    """A producer's loss found to lie in a deletion, and how to know it when it is reported again."""

    deletion: Deletion
    segment: int | None
    gap_first: int | None  # the exact semantics' gap, by its first seq
    # Found inside a push: Venice's state stays before the gap, so every later record of the
    # segment is MISSING for it, until one outside the push moves the state past it.
    stuck: bool


class BehindDeletions:
    """Per partition, the producers last seen before a deletion whose next record has not come,
    and the losses found to lie in a deletion."""

    def __init__(self) -> None:
        # Per partition, the producers not seen since each deletion, oldest deletion first: a
        # set per deletion (usually one), which the worker copies into its watch at each flush.
        self._unseen: dict[tuple[str, int], list[tuple[Deletion, set[bytes]]]] = {}
        self._losses: dict[tuple[str, int], dict[bytes, _Loss]] = {}

    def __bool__(self) -> bool:
        """True while any partition has a producer behind a deletion, or a loss found in one."""
        return bool(self._unseen or self._losses)

    def note(self, deletion: Deletion, producers: Iterable[bytes]) -> None:
        """`producers` (every producer of the partition) were last seen before `deletion`;
        one still unseen since an earlier deletion stays behind that one."""
        groups = self._unseen.setdefault((deletion.topic, deletion.partition), [])
        behind = set(producers)
        for _, earlier in groups:
            behind -= earlier
        if behind:
            groups.append((deletion, behind))
        elif not groups:
            del self._unseen[(deletion.topic, deletion.partition)]

    def unseen(self, topic: str, partition: int) -> set[bytes]:
        """The producers of the partition behind a deletion whose next record has not come:
        every record of theirs must be shown to `loss_in` until it has."""
        groups = self._unseen.get((topic, partition))
        if not groups:
            return set()
        watched = groups[0][1].copy()
        for _, guids in groups[1:]:
            watched |= guids
        return watched

    def loss_in(self, result: ValidationResult) -> Deletion | None:
        """The deletion a result's loss lies in, or None. Results come in record order.

        The first record of a producer behind a deletion is such a loss when it is one at all
        (`LOSS_VERDICTS`). Later, the same loss again: a result of the same exact gap, or,
        when it was found inside a push, a MISSING of the same segment while Venice's state
        stays before the gap (the first such MISSING outside the push moves it past)."""
        guid = result.guid
        if guid is None or not (self._unseen or self._losses):
            return None
        tp = (result.record.topic, result.record.partition)
        deletion = self._first_seen(tp, guid)
        if deletion is not None:
            if result.verdict not in LOSS_VERDICTS:
                return None
            gap = result.gap
            self._losses.setdefault(tp, {})[guid] = _Loss(
                deletion, result.segment, None if gap is None else gap.first, result.fatal
            )
            return deletion
        losses = self._losses.get(tp)
        loss = losses.get(guid) if losses is not None else None
        if losses is None or loss is None:
            return None
        gap = result.gap
        if gap is not None:
            return loss.deletion if (gap.segment, gap.first) == (loss.segment, loss.gap_first) else None
        if result.verdict is Verdict.MISSING and loss.stuck and result.segment == loss.segment:
            if not result.fatal:
                losses[guid] = replace(loss, stuck=False)
            return loss.deletion
        return None

    def _first_seen(self, tp: tuple[str, int], guid: bytes) -> Deletion | None:
        """The deletion `guid` was behind if this is its first record since (it is no longer)."""
        groups = self._unseen.get(tp)
        if not groups:
            return None
        for i, (deletion, guids) in enumerate(groups):
            if guid in guids:
                guids.discard(guid)
                if not guids:
                    del groups[i]
                    if not groups:
                        del self._unseen[tp]
                return deletion
        return None

    def forget(self, topic: str, partition: int) -> None:
        """Drop what is known of a partition (revoked, or its log rewound)."""
        self._unseen.pop((topic, partition), None)
        self._losses.pop((topic, partition), None)
