"""Builders for DIV streams in tests: hand-made headers and partition logs of writer output."""

from __future__ import annotations

import uuid
from dataclasses import replace

from kdiv.div.record import ConsumedRecord
from kdiv.div.stamper import OutgoingRecord
from kdiv.div.validator import DataIntegrityValidator, ValidationResult
from kdiv.div.wire import (
    HEADER_NAME,
    ChecksumType,
    DivHeader,
    Kind,
    control_key,
    encode,
    record_crc,
)

GUID_A = uuid.UUID("00000000-0000-4000-8000-00000000000a").bytes
GUID_B = uuid.UUID("00000000-0000-4000-8000-00000000000b").bytes
NOW = 1_700_000_000_000


def header(
    kind: Kind,
    segment: int,
    seq: int,
    key: bytes | None,
    value: bytes | None,
    *,
    guid: bytes = GUID_A,
    producer_ts: int = NOW,
    checksum_type: ChecksumType = ChecksumType.ADHASH,
    segment_checksum: int = 0,
    final: bool = False,
) -> bytes:
    return encode(
        DivHeader(
            kind,
            guid,
            segment,
            seq,
            producer_ts,
            record_crc(kind, key, value),
            checksum_type=checksum_type if kind == Kind.START_OF_SEGMENT else None,
            segment_checksum=segment_checksum if kind == Kind.END_OF_SEGMENT else None,
            final_segment=final if kind == Kind.END_OF_SEGMENT else None,
        )
    )


class Log:
    """One topic's records in offset order, as a consumer would see them."""

    def __init__(self, topic: str = "t") -> None:
        self.topic = topic
        self.next_offset: dict[int, int] = {}
        self.records: list[ConsumedRecord] = []

    def add(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes | None], ...],
        partition: int = 0,
        timestamp: int = NOW,
    ) -> ConsumedRecord:
        offset = self.next_offset.get(partition, 0)
        self.next_offset[partition] = offset + 1
        record = ConsumedRecord(self.topic, partition, offset, timestamp, key, value, headers)
        self.records.append(record)
        return record

    def skip(self, count: int = 1, partition: int = 0) -> range:
        """Offsets at which the log holds no record (their records removed by compaction, or a
        transaction marker there): consumers read past them. Returns them."""
        first = self.next_offset.get(partition, 0)
        self.next_offset[partition] = first + count
        return range(first, first + count)

    def add_outgoing(self, outgoing: list[OutgoingRecord], timestamp: int = NOW) -> list[ConsumedRecord]:
        return [self.add(o.key, o.value, o.headers, o.partition, timestamp) for o in outgoing]

    def redeliver(self, record: ConsumedRecord, **changes) -> ConsumedRecord:
        """The same record again at the next offset (a producer retry or a replay)."""
        return self.add(
            changes.get("key", record.key),
            changes.get("value", record.value),
            changes.get("headers", record.headers),
            record.partition,
            changes.get("timestamp", record.timestamp),
        )

    def data(
        self,
        segment: int,
        seq: int,
        key: bytes = b"k",
        value: bytes = b"v",
        *,
        guid: bytes = GUID_A,
        partition: int = 0,
        timestamp: int = NOW,
        producer_ts: int = NOW,
    ) -> ConsumedRecord:
        h = header(Kind.DATA, segment, seq, key, value, guid=guid, producer_ts=producer_ts)
        return self.add(key, value, ((HEADER_NAME, h),), partition, timestamp)

    def control(
        self,
        kind: Kind,
        segment: int,
        seq: int,
        *,
        guid: bytes = GUID_A,
        partition: int = 0,
        timestamp: int = NOW,
        producer_ts: int = NOW,
        **header_fields,
    ) -> ConsumedRecord:
        key = control_key(guid, segment, seq)
        h = header(kind, segment, seq, key, b"", guid=guid, producer_ts=producer_ts, **header_fields)
        return self.add(key, b"", ((HEADER_NAME, h),), partition, timestamp)


def corrupt_value(record: ConsumedRecord) -> ConsumedRecord:
    value = bytearray(record.value or b"\x00")
    value[0] ^= 0xFF
    return replace(record, value=bytes(value))


def verdicts(validator: DataIntegrityValidator, records, now_ms: int = NOW) -> list[str]:
    return [validator.validate(r, now_ms).verdict.value for r in records]


def validate(validator: DataIntegrityValidator, record: ConsumedRecord, now_ms: int = NOW) -> ValidationResult:
    return validator.validate(record, now_ms)
