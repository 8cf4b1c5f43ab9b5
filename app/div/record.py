"""The consumed-record shape the validator reads: what any Kafka client gives, minus the client."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int  # broker (log-append or create) time, ms since epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"
