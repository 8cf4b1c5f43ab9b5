"""Writing Faust tables outside a stream: the partition a write belongs to, named explicitly.

Faust's Table and its RocksDB store take the partition of a write (changelog partition and
store) from the stream's current event (`faust.streams._current_event`). The worker writes
after validating whole fetched batches, without events, so it sets a stand-in carrying only
what they read of it: the source message's topic, partition and timestamp.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from faust.streams import _current_event
from faust.types import TP


class _Message:
    __slots__ = ("offset", "partition", "timestamp", "topic", "tp")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.tp = TP(topic, partition)
        self.offset = -1
        self.timestamp = None


class _PartitionEvent:
    __slots__ = ("__weakref__", "message")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _Message(topic, partition)


@contextmanager
def writing_in_partition(topic: str, partition: int) -> Iterator[None]:
    """Table writes inside go to the changelog and store partition of (topic, partition)."""
    event = _PartitionEvent(topic, partition)  # held here: Faust keeps only a weak reference
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _current_event.reset(token)
