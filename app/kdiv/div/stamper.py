"""Producer-side DIV bookkeeping (Venice's VeniceWriter segment management), with no I/O.

A stamper turns "send this record to topic/partition" into the exact records to put on the
wire: START_OF_SEGMENT before a segment's first record, END_OF_SEGMENT with the ADHASH on
rollover (by record count or segment age) and on close, sequence numbers and the `div`
header. The DivWriter sends what it returns, in order; tests and `kdiv check` fixtures use it
directly to make streams.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from kdiv.div.wire import (
    HEADER_NAME,
    ChecksumType,
    DivHeader,
    Kind,
    adhash_add,
    control_key,
    encode,
    record_crc,
)

DISABLED = -1
# Leave room below 2^32 so the END_OF_SEGMENT always has a sequence number.
MAX_SEQ = (1 << 32) - 2
# The value of control records: empty, never null, so a compacted topic does not treat them
# as tombstones and delete them.
CONTROL_VALUE = b""


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """A record ready to send: the producer's bytes plus its `div` header."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    kind: Kind


class _WriterSegment:
    __slots__ = ("checksum", "data_records", "ended", "next_seq", "number", "started_at_ms")

    def __init__(self, number: int, now_ms: int) -> None:
        self.number = number
        self.next_seq = 0
        self.checksum = 0
        self.started_at_ms = now_ms
        self.data_records = 0
        self.ended = False


@dataclass(frozen=True, slots=True)
class StamperCheckpoint:
    """A stamper's segments as they were, to roll back to (a transaction's start)."""

    segments: dict[tuple[str, int], tuple[int, int, int, int, int, bool]]


class DivStamper:
    """The producer side of DIV, without I/O: segments, sequence numbers and checksums per partition."""

    def __init__(
        self,
        guid: bytes | None = None,
        *,
        checksum_type: ChecksumType = ChecksumType.ADHASH,
        max_records_per_segment: int = DISABLED,
        max_segment_age_ms: int = 5 * 60 * 1000,
    ) -> None:
        if guid is not None and len(guid) != 16:
            raise ValueError(f"producer GUID must be 16 bytes, got {len(guid)}")
        if max_records_per_segment != DISABLED and not 0 < max_records_per_segment <= MAX_SEQ - 1:
            raise ValueError(f"max_records_per_segment must be in 1..{MAX_SEQ - 1} or {DISABLED}")
        self.guid = guid if guid is not None else uuid.uuid4().bytes
        self.checksum_type = ChecksumType(checksum_type)
        self.max_records_per_segment = max_records_per_segment
        self.max_segment_age_ms = max_segment_age_ms  # <= 0 disables time-based rollover
        self._segments: dict[tuple[str, int], _WriterSegment] = {}

    def data(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        now_ms: int,
        headers: tuple[tuple[str, bytes | None], ...] = (),
    ) -> list[OutgoingRecord]:
        """A data record stamped for its partition, preceded by START_OF_SEGMENT when one opens."""
        if any(name == HEADER_NAME for name, _ in headers):
            raise ValueError(f"record for {topic}/{partition} already carries a '{HEADER_NAME}' header")
        out: list[OutgoingRecord] = []
        segment = self._segment_for_write(topic, partition, now_ms, out)
        segment.data_records += 1
        out.append(self._stamp(topic, partition, segment, Kind.DATA, key, value, now_ms, headers))
        return out

    def control(self, topic: str, partition: int, kind: Kind, now_ms: int) -> list[OutgoingRecord]:
        """START_OF_PUSH or END_OF_PUSH, inside the partition's current segment."""
        if kind not in (Kind.START_OF_PUSH, Kind.END_OF_PUSH):
            raise ValueError(f"{kind.name} is not a push marker")
        out: list[OutgoingRecord] = []
        segment = self._segment_for_write(topic, partition, now_ms, out)
        out.append(self._stamp_control(topic, partition, segment, kind, now_ms))
        return out

    def end_segment(self, topic: str, partition: int, final: bool, now_ms: int) -> list[OutgoingRecord]:
        """END_OF_SEGMENT for the partition's open segment; nothing if none is open."""
        segment = self._segments.get((topic, partition))
        if segment is None or segment.ended or segment.next_seq == 0:
            return []
        record = self._stamp_control(topic, partition, segment, Kind.END_OF_SEGMENT, now_ms, final=final)
        # Ended even if the send later fails, as in Venice: the next write opens a new segment.
        segment.ended = True
        return [record]

    def checkpoint(self) -> StamperCheckpoint:
        """Every partition's segment, seq and checksum now."""
        return StamperCheckpoint({tp: _saved(s) for tp, s in self._segments.items()})

    def rollback(self, checkpoint: StamperCheckpoint) -> None:
        """Back to `checkpoint`: what was stamped since was never written (an aborted
        transaction), so the next records take its seqs again and no validator reading
        committed records sees a gap."""
        self._segments = {tp: _restored(saved) for tp, saved in checkpoint.segments.items()}

    def partition_checkpoint(self, topic: str, partition: int) -> StamperCheckpoint:
        """One partition's segment, seq and checksum now (cheap: for one record's hand-off)."""
        segment = self._segments.get((topic, partition))
        return StamperCheckpoint({} if segment is None else {(topic, partition): _saved(segment)})

    def rollback_partition(self, topic: str, partition: int, checkpoint: StamperCheckpoint) -> None:
        """Back to `checkpoint` (a `partition_checkpoint`) for this partition only: the records
        stamped since never reached the client (it refused them), so their seqs are taken again."""
        saved = checkpoint.segments.get((topic, partition))
        if saved is None:
            self._segments.pop((topic, partition), None)
        else:
            self._segments[(topic, partition)] = _restored(saved)

    def open_partitions(self, topic: str | None = None) -> list[tuple[str, int]]:
        """(topic, partition) pairs whose segment is open (of one topic, or all)."""
        return [tp for tp, s in self._segments.items() if not s.ended and (topic is None or tp[0] == topic)]

    def _segment_for_write(self, topic: str, partition: int, now_ms: int, out: list[OutgoingRecord]) -> _WriterSegment:
        tp = (topic, partition)
        segment = self._segments.get(tp)
        if segment is not None and not segment.ended and self._due_for_rollover(segment, now_ms):
            out.extend(self.end_segment(topic, partition, False, now_ms))
        if segment is None or segment.ended:
            segment = self._segments[tp] = _WriterSegment(0 if segment is None else segment.number + 1, now_ms)
            out.append(self._stamp_control(topic, partition, segment, Kind.START_OF_SEGMENT, now_ms))
        return segment

    def _due_for_rollover(self, segment: _WriterSegment, now_ms: int) -> bool:
        if segment.next_seq >= MAX_SEQ:
            return True
        if self.max_records_per_segment != DISABLED and segment.data_records >= self.max_records_per_segment:
            return True
        return self.max_segment_age_ms > 0 and now_ms - segment.started_at_ms > self.max_segment_age_ms

    def _stamp_control(
        self, topic: str, partition: int, segment: _WriterSegment, kind: Kind, now_ms: int, final: bool = False
    ) -> OutgoingRecord:
        key = control_key(self.guid, segment.number, segment.next_seq)
        return self._stamp(topic, partition, segment, kind, key, CONTROL_VALUE, now_ms, (), final)

    def _stamp(
        self,
        topic: str,
        partition: int,
        segment: _WriterSegment,
        kind: Kind,
        key: bytes | None,
        value: bytes | None,
        now_ms: int,
        headers: tuple[tuple[str, bytes | None], ...],
        final: bool = False,
    ) -> OutgoingRecord:
        crc = record_crc(kind, key, value)
        seq = segment.next_seq
        segment.next_seq += 1
        if kind == Kind.END_OF_SEGMENT:
            header = DivHeader(
                kind,
                self.guid,
                segment.number,
                seq,
                now_ms,
                crc,
                segment_checksum=segment.checksum if self.checksum_type == ChecksumType.ADHASH else 0,
                final_segment=final,
            )
        else:
            segment.checksum = adhash_add(segment.checksum, crc)
            header = DivHeader(
                kind,
                self.guid,
                segment.number,
                seq,
                now_ms,
                crc,
                checksum_type=self.checksum_type if kind == Kind.START_OF_SEGMENT else None,
            )
        return OutgoingRecord(topic, partition, key, value, headers + ((HEADER_NAME, encode(header)),), kind)


def _saved(segment: _WriterSegment) -> tuple[int, int, int, int, int, bool]:
    return (
        segment.number,
        segment.next_seq,
        segment.checksum,
        segment.started_at_ms,
        segment.data_records,
        segment.ended,
    )


def _restored(saved: tuple[int, int, int, int, int, bool]) -> _WriterSegment:
    number, next_seq, checksum, started_at_ms, data_records, ended = saved
    segment = _WriterSegment(number, started_at_ms)
    segment.next_seq, segment.checksum, segment.data_records, segment.ended = next_seq, checksum, data_records, ended
    return segment
