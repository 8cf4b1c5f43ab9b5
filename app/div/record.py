"""The consumed-record shape the validator reads: what any Kafka client gives, minus the client."""

from __future__ import annotations

from dataclasses import dataclass, field


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
