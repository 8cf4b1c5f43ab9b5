"""The consumed-record shape the validator reads: what any Kafka client gives, minus the client."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """A consumed record as the validator reads it; any client's record with these fields will do."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # broker (log-append or create) time, ms since epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())

    @property
    def where(self) -> str:
        """topic/partition@offset, for messages."""
        return f"{self.topic}/{self.partition}@{self.offset}"


class FetchedRecord(Protocol):
    """A record as a client fetched it from one partition: its topic and partition are the
    batch's. aiokafka's parsed records have this shape before it copies them into a
    ConsumerRecord, which the worker's batch path skips (`validate_run`)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


def consumed(topic: str, partition: int, record: FetchedRecord) -> ConsumedRecord:
    """A fetched record of `topic`[`partition`] as a ConsumedRecord."""
    return ConsumedRecord(
        topic, partition, record.offset, record.timestamp, record.key, record.value, tuple(record.headers)
    )
