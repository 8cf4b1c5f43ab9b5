"""Per-partition DIV state machine: a branch-for-branch port of Venice's PartitionTracker.

Each `_track_*` step mutates state and then may raise, in a fixed order (segment, sequence,
checksum). What a step changed before a later step raises stays changed, exactly as in
Venice: e.g. the sequence number has already advanced when the checksum step raises CORRUPT,
and an unregistered segment is already stored when UNREGISTERED_PRODUCER is raised.

Tolerance is injected, never decided here. Two kinds, as the product defines them:
- `tolerate_segment_jump`: may a jump in segment numbers be accepted? Log compaction never
  explains one (control records have unique keys), so callers pass False except when forcing
  state past a reported fault.
- `tolerate()`: may a sequence gap, an END_OF_SEGMENT checksum mismatch or data after a
  finalised segment be excused? Evaluated lazily, only by branches that need it.

Implicit segments (format version 2, docs/java-producers.md) are kdiv's, not Venice's: a
segment without START_OF_SEGMENT or END_OF_SEGMENT, opened by whichever of its records is seen
first. Unless `implicit_segments` is off (Venice's semantics), that record registers it, so
later gaps are MISSING as in a segment whose START_OF_SEGMENT was seen; off, its records are
judged as Venice judges data without START_OF_SEGMENT.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kdiv.div.exact import new_recent
from kdiv.div.faults import (
    CorruptData,
    DataAfterSegmentEnded,
    DuplicateData,
    ImproperlyStartedSegment,
    MissingData,
)
from kdiv.div.producer_states import ProducerStates
from kdiv.div.producer_times import ProducerTimes
from kdiv.div.segment import Segment
from kdiv.div.wire import ChecksumType, DivHeader, Kind

Tolerate = Callable[[], bool]
_UINT64_MASK = (1 << 64) - 1
# Unpacked producer states (a `Segment` object each, about 510 bytes where a packed one takes
# under 100) across all partitions of a validator past which idle ones are packed between
# records, not only at checkpoints: a burst of new producers holds at most about twice as many
# unpacked. Shared by the partitions (`UnpackedBudget`), each allowed at least `UNPACKED_MIN`:
# a worker of 1,000 partitions with a bound of 1,024 each held a million unpacked (500 MB).
UNPACKED_MAX = 8192
UNPACKED_MIN = 16
_SEQ_BITS = 0xFFFFFFFF


class UnpackedBudget:
    """The unpacked producer states one partition may hold before its idle ones are packed:
    `UNPACKED_MAX` shared by the validator's partitions, at least `UNPACKED_MIN` each."""

    __slots__ = ("per_partition",)

    def __init__(self, partitions: int = 1) -> None:
        self.per_partition = UNPACKED_MAX
        self.shared_by(partitions)

    def shared_by(self, partitions: int) -> None:
        self.per_partition = max(min(UNPACKED_MIN, UNPACKED_MAX), UNPACKED_MAX // max(partitions, 1))


def _never() -> bool:
    return False


class PartitionTracker:
    """Venice's PartitionTracker: per producer of one partition, segment and sequence state and its checks."""

    __slots__ = ("_crowd", "_idle_at_or_below", "budget", "implicit_segments", "segments", "times", "window")

    def __init__(self, window: int = 0, implicit_segments: bool = True, budget: UnpackedBudget | None = None) -> None:
        # Seqs per producer whose CRCs the exact accounting keeps (`kdiv.div.exact`); 0: off.
        self.window = window
        # Does the first record seen of an implicit segment register it (module docstring)?
        self.implicit_segments = implicit_segments
        # A producer idle since the last checkpoint is kept packed, with no object of its
        # own (`ProducerStates`): a million producer states fit in a fraction of the memory.
        # Read entries with `segment`, or `as_segment` when only looking.
        self.segments = ProducerStates()
        # The highest last offset of the unpacked producers at the last `pack_idle`: offsets
        # only grow, so one still at or below it has not moved since (no mark per producer).
        self._idle_at_or_below = -1
        # Unpacked producers past which `pack_crowded` packs the idle ones: the budget's share,
        # or twice those left unpacked (still moving) by the last pass, whichever is more.
        self.budget = UnpackedBudget() if budget is None else budget
        self._crowd = 0
        # What checkpoints ask of the producers' timestamps, kept between them.
        self.times = ProducerTimes()

    def segment(self, guid: bytes) -> Segment | None:
        """The producer's state, unpacked for use (and kept unpacked until it is idle again)."""
        segments = self.segments
        s = segments.active.get(guid)
        if s is None:
            packed = segments.take_packed(guid)
            if packed is None:
                return None
            s = segments.active[guid] = Segment.unpack(packed)
        return s

    def install(self, producers: Mapping[bytes, Segment | bytes]) -> None:
        """Replace the state with saved producers, kept packed until used."""
        self.segments = ProducerStates()
        self.segments.put_packed((g, s if isinstance(s, bytes) else s.pack()) for g, s in producers.items())
        self._idle_at_or_below = -1
        self._crowd = 0
        self.times.forget()

    def evict(self, guids: list[bytes]) -> None:
        """Forget these producers: one seen again is a producer never seen before."""
        self.segments.remove_many(guids)
        self.times.removed(guids)

    def pack_idle(self) -> None:
        """Pack every producer whose state has not moved since the previous call."""
        active = self.segments.active
        moved_past = high = self._idle_at_or_below
        idle: list[bytes] = []
        for guid, s in active.items():
            offset = s.last_offset
            if offset <= moved_past:
                idle.append(guid)
            elif offset > high:
                high = offset
        self._idle_at_or_below = high
        pop = active.pop
        self.segments.put_packed([(guid, pop(guid).pack()) for guid in idle])
        if len(idle) > len(active):
            # A dict keeps its table when entries leave: the copy is sized to what is left.
            self.segments.active = active = dict(active)
        # Twice what is left: a crowd that keeps moving is looked at less and less often.
        self._crowd = 2 * len(active)

    def rewound(self, first_offset: int) -> None:
        """The partition's log was rewound to `first_offset` (offsets from there on come
        again): what `pack_idle` takes for not moved is what lies before it."""
        self._idle_at_or_below = min(self._idle_at_or_below, first_offset - 1)
        self.times.forget()

    def pack_crowded(self) -> None:
        """Between records: with more than `UNPACKED_MAX` producers unpacked (a burst of new
        producers), pack those idle since the last such pass, as a checkpoint would. What is
        packed and what is not changes no verdict; it bounds the memory of unpacked states."""
        unpacked = len(self.segments.active)
        if unpacked > self._crowd and unpacked > self.budget.per_partition:
            self.pack_idle()

    def accept_in_order(
        self,
        guid: bytes,
        segment: int,
        seq: int,
        producer_ts: int,
        header_crc: int,
        crc: int,
        offset: int,
        partition_holes: int = -1,
    ) -> bool:
        """The common case in one step: an intact DATA record with the next seq of its segment.

        Does exactly what the three steps of `validate` do for such a record, from the header
        fields alone (no DivHeader is built), and notes the partition's hole count at it
        (`partition_holes`, -1: not known); returns False, changing nothing, for any other
        record, which must then go through `validate`.
        """
        s = self.segments.active.get(guid)
        if s is None:
            s = self.segment(guid)
        if (
            s is None
            or segment != s.segment_number
            or seq != s.sequence_number + 1
            or not s.started
            or crc != header_crc
            or s.checksum_finalized
            # Seqs past Venice's state were seen (inside a push, after a gap): this one may be late.
            or (s.gaps is not None and s.gaps.segment == segment and s.gaps.high > s.sequence_number)
        ):
            return False
        recent = s.recent
        if recent is not None:
            recent[seq % len(recent)] = (((seq + 1) & _SEQ_BITS) << 32) | crc  # `kdiv.div.exact.remember`
        if s.gaps is not None and s.gaps.segment == segment:
            s.gaps.high = seq
        s.sequence_number = seq
        s.last_producer_ts = producer_ts
        if s.registered and s.checksum is not None:
            s.checksum = (s.checksum + crc) & _UINT64_MASK
        s.last_offset = offset
        s.partition_holes = partition_holes
        s.new_segment = False
        return True

    def validate(
        self,
        header: DivHeader,
        crc: int,
        offset: int,
        eop: bool,
        tolerate: Tolerate = _never,
        tolerate_segment_jump: bool = False,
    ) -> None:
        """Validate one record; raises a DataValidationError subclass on any fault.

        `crc` is the record CRC32 recomputed from the received bytes; `eop` is True when the
        partition is not inside a push.
        """
        prev = self.segment(header.guid)
        segment = self._track_segment(prev, header, eop, tolerate_segment_jump)
        self._track_sequence_number(segment, header, eop, tolerate, prev is not None)
        self._track_checksum(segment, header, crc, eop, tolerate)
        segment.last_offset = offset
        segment.new_segment = False

    # -- segment -----------------------------------------------------------------------------

    def _track_segment(self, prev: Segment | None, h: DivHeader, eop: bool, tolerate_jump: bool) -> Segment:
        incoming = h.segment
        if prev is None:
            if incoming != 0:
                # A producer first seen past segment 0: nothing is stored, so inside a push
                # every later record of it is reported too, as in Venice.
                _handle_unregistered(h, eop, tolerate_any=True)
            return self._initialize_new_segment(h, eop, tolerate_any=True, first_seen_ts=h.producer_ts)
        if incoming == prev.segment_number:
            return prev  # even if ended: the checksum step judges what follows an END_OF_SEGMENT
        if incoming == prev.segment_number + 1 and prev.ended:
            # A clean rollover must open with START_OF_SEGMENT, even after the push.
            return self._initialize_new_segment(h, eop, tolerate_any=False, first_seen_ts=prev.first_seen_ts)
        if (
            incoming == prev.segment_number + 1
            and h.implicit_segment
            and h.seq == 0
            and prev.sequence_number == _SEQ_BITS
            and self.implicit_segments
        ):
            # An implicit segment rolls over when its seqs run out, with no END_OF_SEGMENT.
            return self._initialize_new_segment(h, eop, tolerate_any=True, first_seen_ts=prev.first_seen_ts)
        if incoming > prev.segment_number:
            if tolerate_jump:
                return self._initialize_new_segment(h, eop, tolerate_any=True, first_seen_ts=prev.first_seen_ts)
            if incoming == prev.segment_number + 1:
                raise MissingData(
                    f"segment {incoming} started before segment {prev.segment_number} ended: "
                    f"its END_OF_SEGMENT (after seq {prev.sequence_number}) is missing"
                )
            raise MissingData(
                f"segment {incoming} follows segment {prev.segment_number}: "
                f"segments {prev.segment_number + 1}..{incoming - 1} are missing"
            )
        raise DuplicateData(f"segment {incoming} is older than the current segment {prev.segment_number}")

    def _initialize_new_segment(self, h: DivHeader, eop: bool, tolerate_any: bool, first_seen_ts: int) -> Segment:
        registered = h.kind == Kind.START_OF_SEGMENT
        # A START_OF_SEGMENT header always carries its checksum type.
        checksum_type = h.checksum_type if registered and h.checksum_type is not None else ChecksumType.NONE
        segment = Segment(h.segment, h.seq, checksum_type, new_recent(self.window))
        segment.last_producer_ts = h.producer_ts
        segment.first_seen_ts = first_seen_ts
        # Stored before the possible raise below, so the producer's next record validates
        # against it instead of being reported unregistered again.
        # `validate` read the producer with `segment` first: it is not held packed.
        self.segments.active[h.guid] = segment
        if registered:
            segment.registered = True
        elif h.implicit_segment and self.implicit_segments:
            # Its start is its first record: seq 0 opens it cleanly; a later seq is a
            # producer first seen mid-segment (its earlier records e.g. past retention), judged
            # as any such producer, and its later gaps are MISSING all the same.
            segment.registered = True
            if h.seq != 0:
                _handle_unregistered(h, eop, tolerate_any)
        else:
            _handle_unregistered(h, eop, tolerate_any)
        return segment

    # -- sequence ----------------------------------------------------------------------------

    def _track_sequence_number(self, s: Segment, h: DivHeader, eop: bool, tolerate: Tolerate, had_prev: bool) -> None:
        incoming = h.seq
        previous = s.sequence_number
        if not s.started:  # the START_OF_SEGMENT at seq 0 lands here
            s.started = True
            s.last_producer_ts = h.producer_ts
            return
        if incoming == previous + 1:
            s.sequence_number = incoming
            s.last_producer_ts = h.producer_ts
            return
        if incoming == previous:
            if not s.new_segment:
                raise DuplicateData(f"seq {incoming} of segment {s.segment_number} was already accepted")
            # First record of a segment object created from this very record.
            s.last_producer_ts = h.producer_ts
            return
        if incoming < previous:
            if not had_prev:  # defensive, as in Venice; unreachable for a fresh segment
                s.last_producer_ts = h.producer_ts
                return
            raise DuplicateData(
                f"seq {incoming} of segment {s.segment_number} is at or below the last accepted seq {previous}"
            )
        # A gap. Mid-stream (unregistered) segments after the push may have gaps: their start
        # was never seen, so nothing proves the records in between were ours to see.
        if (eop and not s.registered) or tolerate():
            s.sequence_number = incoming
            s.last_producer_ts = h.producer_ts
            return
        missing = incoming - previous - 1
        raise MissingData(
            f"seq {incoming} follows seq {previous} in segment {s.segment_number}: "
            f"{missing} record{'s' if missing != 1 else ''} missing ({previous + 1}..{incoming - 1})"
        )

    # -- checksum ----------------------------------------------------------------------------

    def _track_checksum(self, s: Segment, h: DivHeader, crc: int, eop: bool, tolerate: Tolerate) -> None:
        kind = h.kind
        # The per-record CRC is checked first, for every DATA record in any segment; a record
        # that fails it is not added to the segment checksum.
        if kind == Kind.DATA and crc != h.crc:
            raise CorruptData(
                f"record CRC32 {crc:08x} computed from key and value differs from {h.crc:08x} in its div header"
            )
        if not s.registered:
            # The segment's start was not seen, so its checksum is unusable.
            if kind == Kind.END_OF_SEGMENT:
                s.end(bool(h.final_segment))
            return
        if kind != Kind.END_OF_SEGMENT:
            try:
                s.add_to_checksum(crc)
            except DataAfterSegmentEnded:
                if not tolerate():
                    raise
            return
        final = s.final_checksum()
        if final is None or final == h.segment_checksum or tolerate():
            s.end(bool(h.final_segment))
            return
        if eop:
            # End the segment first, so that the producer's next START_OF_SEGMENT is not
            # reported MISSING.
            s.end(bool(h.final_segment))
        raise CorruptData(
            f"segment {s.segment_number} ADHASH {final:016x} differs from {h.segment_checksum:016x} "
            f"in its END_OF_SEGMENT: a record of the segment was lost or altered"
        )


def _handle_unregistered(h: DivHeader, eop: bool, tolerate_any: bool) -> None:
    if not eop or not tolerate_any:
        where = "inside a push" if not eop else "after its previous segment ended"
        raise ImproperlyStartedSegment(
            f"segment {h.segment} seq {h.seq} arrived without its START_OF_SEGMENT ({where})"
        )
