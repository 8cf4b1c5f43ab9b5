"""The table writes that save a partition's validation: state keys and encoded values, in the
order the worker's crash protocol writes them (`kdiv.worker.unit`)."""

from __future__ import annotations

from collections.abc import Collection, Generator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from kdiv.div.ledger import ledger_key
from kdiv.div.validator import Checkpoint, PartitionValidation
from kdiv.state.tables import partition_key, producer_key
from kdiv.state.values import StateValues


@dataclass(slots=True)
class StateWrites:
    """Writes for one partition, in order: the partition state first, then its producers."""

    topic: str
    partition: int
    partition_value: bytes
    # (key, value); value None deletes the key (a producer expired by max age or evicted).
    producers: list[tuple[bytes, bytes | None]] = field(default_factory=list)

    def in_order(self) -> list[tuple[bytes, bytes | None]]:
        """(key, value) pairs in the order the crash protocol needs: partition first, then producers."""
        return [(partition_key(self.topic, self.partition), self.partition_value), *self.producers]


T = TypeVar("T")
# Producer states encoded between two pauses of `partition_writes_in_slices` (a few ms).
ENCODE_SLICE = 1_000


def partition_writes(
    values: StateValues,
    topic: str,
    partition: int,
    part: PartitionValidation,
    checkpoint: Checkpoint,
    changed: Collection[bytes],
    evicted: Collection[bytes],
) -> StateWrites:
    """The partition state, the `changed` producers still tracked, and deletions of those
    evicted (`evicted`, when not seen again since) or expired (`checkpoint.expired`)."""
    return run_slices(partition_writes_in_slices(values, topic, partition, part, checkpoint, changed, evicted))


def partition_writes_in_slices(
    values: StateValues,
    topic: str,
    partition: int,
    part: PartitionValidation,
    checkpoint: Checkpoint,
    changed: Collection[bytes],
    evicted: Collection[bytes],
) -> Generator[None, None, StateWrites]:
    """`partition_writes`, pausing (a bare `yield`) after every `ENCODE_SLICE` producers
    encoded: an asynchronous caller lets its event loop run there, so that the writes of
    200,000 new producers never hold it for long. Returns the writes."""
    writes = StateWrites(topic, partition, values.encode(part))
    append = writes.producers.append
    for n, guid in enumerate(sorted(changed), 1):
        segment = checkpoint.upserts.get(guid)
        if segment is not None:
            # Written packed: a packed state as it is, no object made for it.
            packed = segment if isinstance(segment, bytes) else segment.pack()
            append((producer_key(topic, partition, guid), values.encode_packed_producer(packed)))
        elif guid in evicted:
            append((producer_key(topic, partition, guid), None))
        if not n % ENCODE_SLICE:
            yield
    for guid in checkpoint.expired:
        append((producer_key(topic, partition, guid), None))
    return writes


def run_slices(slices: Generator[None, None, T]) -> T:
    """What a generator of slices (`partition_writes_in_slices`) returns, run without pausing."""
    while True:
        try:
            next(slices)
        except StopIteration as done:
            return done.value


def ledger_writes(
    values: StateValues, topic: str, partition: int, entries: Mapping[bytes, bytes | None]
) -> list[tuple[bytes, bytes]]:
    """Key ledger records of one partition from its packed entries per record key; None (a
    DIV control record, no user data) writes nothing."""
    encode = values.encode_packed_key_validation
    prefix = ledger_key(topic, partition, b"")
    return [(prefix + key, encode(packed)) for key, packed in entries.items() if packed is not None]
