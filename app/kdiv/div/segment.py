"""Consumer-side state of one producer's current segment in one partition (Venice's Segment)."""

from __future__ import annotations

import enum
import struct
from typing import TYPE_CHECKING

from kdiv.div.exact import GapLog, ring_bytes, ring_of
from kdiv.div.faults import DataAfterSegmentEnded
from kdiv.div.wire import ChecksumType, adhash_add

if TYPE_CHECKING:
    from kdiv.div.producer_states import ProducerStates


class SegmentStatus(enum.IntEnum):
    """Where a producer's segment is in its life, as Venice tracks it."""

    NOT_STARTED = 0
    IN_PROGRESS = 1
    END_OF_INTERMEDIATE_SEGMENT = 2
    END_OF_FINAL_SEGMENT = 3

    @property
    def is_terminal(self) -> bool:
        """True once the segment has ended."""
        return self >= SegmentStatus.END_OF_INTERMEDIATE_SEGMENT


# A segment at rest in memory (`Segment.pack`): segment, seq, checksum, last offset, last
# producer timestamp, first seen timestamp, partition holes, checksum type, flags; then the
# ring and gaps. About 68 bytes for a one-record producer where a Segment object with its
# int fields and ring takes about 400: most of a million producer states are idle producers.
_PACKED = struct.Struct("<qqQqqqqBB")
_PACKED_TS = struct.Struct("<q")
_PACKED_TS_AT = 32
_PACKED_OFFSET_AT = 24
_PACKED_FLAGS_AT = 57
_CHECKSUM_CODES = frozenset(c.value for c in ChecksumType)
_FLAG_NAMES = ("checksum_finalized", "registered", "started", "ended", "final_segment", "new_segment")
_HAS_CHECKSUM = 1 << len(_FLAG_NAMES)
_STARTED, _ENDED, _FINAL = (1 << _FLAG_NAMES.index(name) for name in ("started", "ended", "final_segment"))
# After the fixed part, when the exact accounting is on: the ring (`_pack_ring`) and the gap
# log (`kdiv.div.exact`), if any.
_RING_SLOTS = struct.Struct("<H")  # the slot count; _NEAR marks the near form
_NEAR = 0x8000
_NEAR_SLOT = struct.Struct("<IB")  # CRC, how far the slot's seq is below the producer's
_SEQ_BITS = 0xFFFFFFFF


def _pack_ring(recent: list[int], seq: int, whole: bool) -> bytes:
    """The ring of recent CRCs in few bytes: a bitmap of the slots in use, then per slot in
    use its CRC and, in one byte, how far its seq is below the producer's `seq`, when every
    one is at most 255 below (as in any producer that sends in order). Else, or when `whole`
    (a producer with gaps: rare, and its seqs may be far apart), every slot as it is."""
    slots = len(recent)
    if not whole and slots < _NEAR:
        base = (seq + 1) & _SEQ_BITS
        bitmap = 0
        near = []
        for i, slot in enumerate(recent):
            if slot:
                below = (base - (slot >> 32)) & _SEQ_BITS
                if below > 0xFF:
                    break
                bitmap |= 1 << i
                near.append(_NEAR_SLOT.pack(slot & _SEQ_BITS, below))
        else:
            head = _RING_SLOTS.pack(_NEAR | slots) + bitmap.to_bytes((slots + 7) // 8, "little")
            return head + b"".join(near)
    return _RING_SLOTS.pack(slots) + ring_bytes(recent)


def _unpack_ring(packed: bytes, at: int, seq: int) -> tuple[list[int] | None, int]:
    """The ring `_pack_ring` wrote at `at` (None for no slots), and where it ends."""
    (slots,) = _RING_SLOTS.unpack_from(packed, at)
    at += _RING_SLOTS.size
    if not slots & _NEAR:
        return (ring_of(packed[at : at + 8 * slots]) if slots else None), at + 8 * slots
    slots &= ~_NEAR
    recent = [0] * slots
    bitmap = packed[at : at + (slots + 7) // 8]
    at += len(bitmap)
    base = (seq + 1) & _SEQ_BITS
    for i in range(slots):
        if bitmap[i >> 3] & (1 << (i & 7)):
            crc, below = _NEAR_SLOT.unpack_from(packed, at)
            at += _NEAR_SLOT.size
            recent[i] = (((base - below) & _SEQ_BITS) << 32) | crc
    return (recent if slots else None), at


class Segment:
    """Mutable, slot-only: one exists per live (partition, producer) and is touched per record.

    Idle ones are kept packed (`pack`, `unpack`) by the partition's tracker."""

    __slots__ = (
        "checksum",
        "checksum_finalized",
        "checksum_type",
        "ended",
        "final_segment",
        "first_seen_ts",
        "gaps",
        "last_offset",
        "last_producer_ts",
        "new_segment",
        "partition_holes",
        "recent",
        "registered",
        "segment_number",
        "sequence_number",
        "started",
    )

    def __init__(
        self, segment_number: int, sequence_number: int, checksum_type: ChecksumType, recent: list[int] | None = None
    ) -> None:
        self.segment_number = segment_number
        self.checksum_type = checksum_type
        # Running ADHASH; None for NONE, which never finalises and so never rejects late data.
        self.checksum: int | None = 0 if checksum_type == ChecksumType.ADHASH else None
        self.checksum_finalized = False
        self.sequence_number = sequence_number
        self.registered = False
        self.started = sequence_number > 0
        self.ended = False
        self.final_segment = False
        # True until the first record of this segment object has been fully validated: a
        # segment created mid-stream may then repeat its first sequence number without it
        # being a duplicate.
        self.new_segment = True
        self.last_offset = -1
        self.last_producer_ts = -1
        # The producer timestamp of the first record of this producer in the partition,
        # carried from segment to segment (-1: not known, e.g. state saved before it was kept).
        self.first_seen_ts = -1
        # The partition's offset holes counted up to this producer's last record
        # (`kdiv.div.validator.PartitionValidation.holes`; -1: not known): the evidence a gap
        # after that record needs to be excused as compaction.
        self.partition_holes = -1
        # The exact accounting's (`kdiv.div.exact`): recent seqs with their CRCs, and the
        # producer's gaps (carried from segment to segment). None when off or never needed.
        self.recent = recent
        self.gaps: GapLog | None = None

    @property
    def status(self) -> SegmentStatus:
        """The segment's status, derived from its flags."""
        if not self.started:
            return SegmentStatus.NOT_STARTED
        if self.ended:
            return (
                SegmentStatus.END_OF_FINAL_SEGMENT if self.final_segment else SegmentStatus.END_OF_INTERMEDIATE_SEGMENT
            )
        return SegmentStatus.IN_PROGRESS

    def add_to_checksum(self, crc: int) -> None:
        """Fold a record's CRC32 into the segment's running checksum (ADHASH)."""
        if self.checksum is None:
            return
        if self.checksum_finalized:
            raise DataAfterSegmentEnded(
                f"record in segment {self.segment_number} after its END_OF_SEGMENT finalised the checksum"
            )
        self.checksum = adhash_add(self.checksum, crc)

    def final_checksum(self) -> int | None:
        """Finalise (from now on further data raises DataAfterSegmentEnded) and return the checksum."""
        self.checksum_finalized = True
        return self.checksum

    def end(self, final: bool) -> None:
        """Mark the segment ended by its END_OF_SEGMENT; `final` when the producer ended for good."""
        self.ended = True
        self.final_segment = final

    def pack(self) -> bytes:
        """This state in 58 bytes (and 5 per recent seq in use, and the gaps, when the exact
        accounting keeps them); `Segment.unpack` gives it back equal."""
        # The bits of _FLAG_NAMES, in its order.
        flags = (
            (0 if self.checksum is None else _HAS_CHECKSUM)
            | bool(self.checksum_finalized)
            | bool(self.registered) << 1
            | bool(self.started) << 2
            | bool(self.ended) << 3
            | bool(self.final_segment) << 4
            | bool(self.new_segment) << 5
        )
        fixed = _PACKED.pack(
            self.segment_number,
            self.sequence_number,
            self.checksum or 0,
            self.last_offset,
            self.last_producer_ts,
            self.first_seen_ts,
            self.partition_holes,
            self.checksum_type,
            flags,
        )
        recent, gaps = self.recent, self.gaps
        if recent is None and gaps is None:
            return fixed
        if recent is None:
            ring = _RING_SLOTS.pack(0)
        else:
            ring = _pack_ring(recent, self.sequence_number, whole=gaps is not None)
        return b"".join((fixed, ring, b"" if gaps is None else gaps.pack()))

    @staticmethod
    def is_packed(packed: bytes) -> bool:
        """Whether `packed` is a state `pack` could have made: read back from a store or a
        changelog, it is untrusted. The fixed part and the ring are checked in place (a
        takeover loads a million); a gap log, rare, by unpacking it."""
        size = len(packed)
        fixed = _PACKED.size
        if size < fixed or packed[_PACKED_FLAGS_AT - 1] not in _CHECKSUM_CODES:
            return False
        if packed[_PACKED_FLAGS_AT] >= _HAS_CHECKSUM << 1:
            return False
        if size == fixed:
            return True
        if size < fixed + _RING_SLOTS.size:
            return False
        (slots,) = _RING_SLOTS.unpack_from(packed, fixed)
        at = fixed + _RING_SLOTS.size
        if slots & _NEAR:
            slots &= ~_NEAR
            width = (slots + 7) // 8
            used = int.from_bytes(packed[at : at + width], "little") & ((1 << slots) - 1)
            at += width + used.bit_count() * _NEAR_SLOT.size
        else:
            at += 8 * slots
        if at >= size:
            return at == size
        try:
            Segment.unpack(packed)
        except Exception:  # noqa: BLE001 - struct, enum and index errors of garbled bytes alike
            return False
        return True

    @staticmethod
    def unpack(packed: bytes) -> Segment:
        """The Segment `pack` made `packed` from."""
        (
            segment_number,
            sequence_number,
            checksum,
            last_offset,
            last_producer_ts,
            first_seen_ts,
            partition_holes,
            checksum_type,
            flags,
        ) = _PACKED.unpack_from(packed)
        s = Segment.__new__(Segment)
        s.segment_number = segment_number
        s.sequence_number = sequence_number
        s.checksum = checksum if flags & _HAS_CHECKSUM else None
        s.checksum_type = ChecksumType(checksum_type)
        s.last_offset = last_offset
        s.last_producer_ts = last_producer_ts
        s.first_seen_ts = first_seen_ts
        s.partition_holes = partition_holes
        for bit, name in enumerate(_FLAG_NAMES):
            setattr(s, name, bool(flags & (1 << bit)))
        s.recent = None
        s.gaps = None
        if len(packed) > _PACKED.size:
            s.recent, at = _unpack_ring(packed, _PACKED.size, sequence_number)
            if len(packed) > at:
                s.gaps = GapLog.unpack(memoryview(packed)[at:])
        return s

    def copy(self) -> Segment:
        """An independent copy (state saved aside and restored by the replay logic)."""
        clone = Segment.__new__(Segment)
        for name in Segment.__slots__:
            setattr(clone, name, getattr(self, name))
        if self.recent is not None:
            clone.recent = list(self.recent)
        if self.gaps is not None:
            clone.gaps = GapLog.unpack(self.gaps.pack())
        return clone

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in Segment.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in Segment.__slots__)
        return f"Segment({fields})"


def as_segment(state: Segment | bytes) -> Segment:
    """A tracker's entry as a Segment (a packed one unpacked, not stored back)."""
    return Segment.unpack(state) if isinstance(state, bytes) else state


def last_producer_ts(state: Segment | bytes) -> int:
    """A tracker entry's last producer timestamp, without unpacking a packed one."""
    if isinstance(state, bytes):
        return _PACKED_TS.unpack_from(state, _PACKED_TS_AT)[0]
    return state.last_producer_ts


def latest_producer_ts(states: ProducerStates, at_most: int | None = None) -> int:
    """The latest last producer timestamp of a partition's producers (-1: none); with
    `at_most`, the latest of those not past it."""
    packed = states.packed_field(_PACKED_TS, _PACKED_TS_AT)
    active = (s.last_producer_ts for s in states.active.values())
    if at_most is None:
        return max(max(packed, default=-1), max(active, default=-1))
    return max(
        max((t for t in packed if t <= at_most), default=-1), max((t for t in active if t <= at_most), default=-1)
    )


def last_producer_times(states: ProducerStates) -> list[tuple[int, bytes]]:
    """(last producer timestamp, GUID) of each of a partition's producers."""
    active = [(s.last_producer_ts, guid) for guid, s in states.active.items()]
    return active + states.packed_field_by_guid(_PACKED_TS, _PACKED_TS_AT)


def last_offsets(states: ProducerStates) -> list[tuple[int, bytes]]:
    """(last offset, GUID) of each of a partition's producers."""
    active = [(s.last_offset, guid) for guid, s in states.active.items()]
    return active + states.packed_field_by_guid(_PACKED_TS, _PACKED_OFFSET_AT)


def last_offset(state: Segment | bytes) -> int:
    """A tracker entry's last offset, without unpacking a packed one."""
    if isinstance(state, bytes):
        return _PACKED_TS.unpack_from(state, _PACKED_OFFSET_AT)[0]
    return state.last_offset


def status_of(state: Segment | bytes) -> SegmentStatus:
    """A tracker entry's segment status, without unpacking a packed one."""
    if not isinstance(state, bytes):
        return state.status
    flags = state[_PACKED_FLAGS_AT]
    if not flags & _STARTED:
        return SegmentStatus.NOT_STARTED
    if flags & _ENDED:
        return SegmentStatus.END_OF_FINAL_SEGMENT if flags & _FINAL else SegmentStatus.END_OF_INTERMEDIATE_SEGMENT
    return SegmentStatus.IN_PROGRESS
