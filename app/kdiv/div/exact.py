"""Exact sequence accounting beside Venice's rule, per producer of a partition.

Venice judges a record by its producer's last accepted seq alone, which is coarse for an
auditor: a reordered record reads MISSING then DUPLICATE, a re-send with other bytes reads
DUPLICATE (which consumers skip), and inside a push one lost record is reported again by
every later record of the producer. Beside the tracker's state, per producer:
- recent CRCs: a ring of the last `window` seqs of the current segment with their CRCs, so a
  seq seen again is told DUPLICATE (same CRC) from DIVERGENT (other bytes);
- a `GapLog`: the gaps reported MISSING (the latest `MAX_GAPS`), what of them arrived late
  and where, and the highest seq seen, so a record in a gap is LATE, and the records judged
  after a gap inside a push count towards that one gap.

Pure: no I/O.
"""

from __future__ import annotations

import enum
import struct
import sys
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

# Gaps kept per producer (older ones are forgotten: their late records read as Venice's).
MAX_GAPS = 8
# Runs of late arrivals kept per gap (further arrivals are counted, not placed).
MAX_ARRIVED_RUNS = 16
# A gap's `holes` when it was not weighed as compaction's, and when its holes were not known.
NOT_WEIGHED = -1
UNTOLD_HOLES = -2
_SEQ_BITS = 0xFFFFFFFF


def new_recent(window: int) -> list[int] | None:
    """An empty ring for `window` seqs (None when the window is off). A list: it is written
    for every record, and a list's item is set faster than an array's."""
    return [0] * window if window > 0 else None


def ring_bytes(recent: list[int]) -> bytes:
    """The ring as little-endian uint64 slots (its packed and saved form)."""
    ring = array("Q", recent)
    if sys.byteorder != "little":
        ring.byteswap()
    return ring.tobytes()


def ring_of(raw: bytes | memoryview) -> list[int]:
    """The ring `ring_bytes` wrote."""
    ring = array("Q")
    ring.frombytes(raw)
    if sys.byteorder != "little":
        ring.byteswap()
    return ring.tolist()


def remember(recent: list[int], seq: int, crc: int) -> None:
    """Note that `seq` was seen with `crc`."""
    recent[seq % len(recent)] = (((seq + 1) & _SEQ_BITS) << 32) | crc


def recall(recent: list[int] | None, seq: int) -> int | None:
    """The CRC `seq` was seen with, or None when the ring no longer (or never) held it."""
    if not recent:
        return None
    slot = recent[seq % len(recent)]
    return slot & _SEQ_BITS if slot >> 32 == (seq + 1) & _SEQ_BITS else None


@dataclass(slots=True)
class Gap:
    """Seqs `first`..`last` of a segment, reported MISSING by the record at `found_offset`."""

    segment: int
    first: int
    last: int
    found_offset: int
    found_seq: int
    # Later records of the producer judged MISSING because of this gap alone (inside a push,
    # Venice's state stays before the gap, so each one is reported again).
    judged: int = 0
    last_judged_offset: int = -1
    # [first seq, last seq, first offset, last offset] of records that arrived late, runs of
    # contiguous seqs merged; `arrived_unplaced` counts arrivals past MAX_ARRIVED_RUNS runs.
    arrived: list[list[int]] = field(default_factory=list)
    arrived_unplaced: int = 0
    fatal: bool = False  # found inside a push
    # In a compacted topic, what the log's offset holes said when the gap was weighed as
    # compaction's (`kdiv.div.compaction`): the holes between the producer's records, fewer
    # than the seqs missing; UNTOLD_HOLES: not known; NOT_WEIGHED: not weighed.
    holes: int = -1

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    @property
    def arrived_count(self) -> int:
        return sum(hi - lo + 1 for lo, hi, _, _ in self.arrived) + self.arrived_unplaced

    @property
    def resolved(self) -> bool:
        """True once every record of the gap has arrived."""
        return self.arrived_count >= self.size

    def covers(self, segment: int, seq: int) -> bool:
        """True when `seq` of `segment` is in the gap and has not arrived."""
        if segment != self.segment or not self.first <= seq <= self.last:
            return False
        return not any(lo <= seq <= hi for lo, hi, _, _ in self.arrived)

    def arrive(self, seq: int, offset: int) -> None:
        """Note that `seq` arrived late at `offset`."""
        for run in self.arrived:
            if run[1] + 1 == seq:
                run[1], run[3] = seq, offset
                return
            if run[0] - 1 == seq:
                run[0], run[2] = seq, offset
                return
        if len(self.arrived) < MAX_ARRIVED_RUNS:
            self.arrived.append([seq, seq, offset, offset])
        else:
            self.arrived_unplaced += 1

    def report(self) -> GapReport:
        return GapReport(
            self.segment,
            self.first,
            self.last,
            self.found_offset,
            self.found_seq,
            self.judged,
            self.last_judged_offset,
            tuple((lo, hi, first, last) for lo, hi, first, last in self.arrived),
            self.arrived_count,
            self.fatal,
            self.holes,
        )


class GapReport(NamedTuple):
    """A gap as it stood when a record was judged: what its incident says."""

    segment: int
    first: int
    last: int
    found_offset: int
    found_seq: int
    judged: int
    last_judged_offset: int
    arrived: tuple[tuple[int, int, int, int], ...]  # (first seq, last seq, first offset, last offset)
    arrived_count: int
    fatal: bool
    holes: int = NOT_WEIGHED

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    @property
    def resolved(self) -> bool:
        return self.arrived_count >= self.size

    def describe(self) -> str:
        """The gap in one sentence, as its incident shows it."""
        n = self.size
        text = (
            f"seq {self.first}..{self.last} of segment {self.segment} missing ({n} record{'s' if n != 1 else ''}), "
            f"found at offset {self.found_offset} by seq {self.found_seq}"
        )
        if self.judged:
            text += (
                f"; {self.judged} later record{'s' if self.judged != 1 else ''} of the producer judged after it "
                f"inside the push (each MISSING by Venice's rule), the last at offset {self.last_judged_offset}"
            )
        if self.arrived_count:
            where = ", ".join(
                f"seq {lo} at offset {first}" if lo == hi else f"seq {lo}..{hi} at offsets {first}..{last}"
                for lo, hi, first, last in self.arrived
            )
            state = "all arrived late" if self.resolved else f"{self.arrived_count} of {n} arrived late"
            text += f"; {state}: {where}" if where else f"; {state}"
        if self.holes == UNTOLD_HOLES:
            text += (
                "; compaction or loss, which cannot be told: the offset holes between the producer's records "
                "are not known"
            )
        elif self.holes >= 0:
            text += (
                f"; not compaction: the log has {self.holes} offset hole{'s' if self.holes != 1 else ''} between "
                f"the producer's records, fewer than the records missing (compaction leaves a hole for each "
                f"record it removes)"
            )
        return text


@dataclass(slots=True)
class GapLog:
    """A producer's gaps reported MISSING, and the furthest (segment, seq) it was seen at when
    that is past Venice's state (inside a push, after a fault) or in it."""

    segment: int
    high: int
    gaps: list[Gap] = field(default_factory=list)

    def find(self, segment: int, seq: int) -> Gap | None:
        """The gap that `seq` of `segment` is missing from, or None."""
        for gap in self.gaps:
            if gap.covers(segment, seq):
                return gap
        return None

    def latest(self, segment: int) -> Gap | None:
        """The last gap reported in `segment`."""
        for gap in reversed(self.gaps):
            if gap.segment == segment:
                return gap
        return None

    def add(self, gap: Gap) -> None:
        self.gaps.append(gap)
        if len(self.gaps) > MAX_GAPS:
            del self.gaps[0]

    def see(self, segment: int, seq: int) -> None:
        """Raise the furthest (segment, seq) seen (a later segment starts over)."""
        if segment != self.segment:
            if segment > self.segment:
                self.segment, self.high = segment, seq
            return
        if seq > self.high:
            self.high = seq

    # -- packed form, for idle producers (`kdiv.div.segment.Segment.pack`) ---------------------

    def pack(self) -> bytes:
        parts = [_LOG.pack(self.segment, self.high, len(self.gaps))]
        for g in self.gaps:
            parts.append(
                _GAP.pack(
                    g.segment,
                    g.first,
                    g.last,
                    g.found_offset,
                    g.found_seq,
                    g.judged,
                    g.last_judged_offset,
                    g.arrived_unplaced,
                    g.holes,
                    g.fatal,
                    len(g.arrived),
                )
            )
            parts.extend(_RUN.pack(*run) for run in g.arrived)
        return b"".join(parts)

    @staticmethod
    def unpack(packed: bytes | memoryview) -> GapLog:
        segment, high, count = _LOG.unpack_from(packed)
        log = GapLog(segment, high)
        at = _LOG.size
        for _ in range(count):
            seg, first, last, found_offset, found_seq, judged, last_judged, unplaced, holes, fatal, runs = (
                _GAP.unpack_from(packed, at)
            )
            at += _GAP.size
            arrived = []
            for _ in range(runs):
                arrived.append(list(_RUN.unpack_from(packed, at)))
                at += _RUN.size
            log.gaps.append(
                Gap(
                    seg,
                    first,
                    last,
                    found_offset,
                    found_seq,
                    judged,
                    last_judged,
                    arrived,
                    unplaced,
                    bool(fatal),
                    holes,
                )
            )
        return log


_LOG = struct.Struct("<qqB")
_GAP = struct.Struct("<qqqqqqqqq?B")
_RUN = struct.Struct("<qqqq")


class Seen(enum.Enum):
    """Where a record's seq stands against what its producer sent so far."""

    NEXT = "next"  # the seq after the highest seen
    AHEAD = "ahead"  # past the next: the seqs between are not here
    LATE = "late"  # in a gap reported MISSING, not arrived before
    AGAIN = "again"  # seen before, its CRC in the ring
    PAST = "past"  # at or below the highest seen, but not in the ring nor in a known gap
    OTHER_SEGMENT = "other segment"  # not the producer's current segment


class Look(NamedTuple):
    """A record's seq against its producer's state before the record is judged."""

    seen: Seen
    high: int  # the highest seq of the segment seen before it
    gap: Gap | None = None  # for LATE
    crc_then: int | None = None  # for AGAIN
    venice_high: int = -1  # the producer's seq by Venice's state (below `high` inside a push, after a gap)


def look(state: ProducerState, segment: int, seq: int) -> Look:
    """Where `seq` of `segment` stands against `state` (the producer's, before the record)."""
    gaps = state.gaps
    if segment != state.segment_number:
        gap = gaps.find(segment, seq) if gaps is not None and segment < state.segment_number else None
        return Look(Seen.LATE, -1, gap) if gap is not None else Look(Seen.OTHER_SEGMENT, -1)
    high = state.sequence_number
    if gaps is not None and gaps.segment == segment and gaps.high > high:
        high = gaps.high
    venice_high = state.sequence_number
    if seq == high + 1:
        return Look(Seen.NEXT, high, venice_high=venice_high)
    if seq > high + 1:
        return Look(Seen.AHEAD, high, venice_high=venice_high)
    gap = gaps.find(segment, seq) if gaps is not None else None
    if gap is not None:
        return Look(Seen.LATE, high, gap, venice_high=venice_high)
    crc_then = recall(state.recent, seq)
    if crc_then is not None:
        return Look(Seen.AGAIN, high, crc_then=crc_then, venice_high=venice_high)
    return Look(Seen.PAST, high, venice_high=venice_high)


class ProducerState(Protocol):
    """What this module reads and keeps of a producer's state (`kdiv.div.segment.Segment`)."""

    segment_number: int
    sequence_number: int
    recent: list[int] | None
    gaps: GapLog | None


def furthest_seen(state: ProducerState) -> tuple[int, int]:
    """The furthest (segment, seq) of the producer seen: Venice's state, or past it."""
    venice = (state.segment_number, state.sequence_number)
    gaps = state.gaps
    return max(venice, (gaps.segment, gaps.high)) if gaps is not None else venice
