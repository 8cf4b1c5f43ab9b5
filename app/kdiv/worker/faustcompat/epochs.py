"""Leader epochs (KIP-320), which aiokafka 0.14 neither exposes nor asks for.

Every record batch carries the leader epoch it was written in (PartitionLeaderEpoch, bytes
12..15 of the batch), and a partition's leader answers OffsetForLeaderEpoch: where a given
epoch ends in its log. Together they tell a truncated log from a leader that merely
changed: after a failover, the epoch of the last record a consumer read ends, on the new
leader, before the consumer's position only if records the consumer read are gone.

aiokafka's C batch reader keeps the epoch to itself and its consumer never sends the
request. So `EpochTrackingRecords` stands in for aiokafka's `MemoryRecords` in the worker's
fetcher (`kdiv.worker.faustcompat.parsed`): the same batches, and beside them the epoch of
the last one, read from the raw bytes. The parsed records path hands each partition's records over
as `EpochedRecords`, a list that also names each batch's first offset and epoch; and
`end_offsets_for_epochs` asks the leaders, on the consumer's own client.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import aiokafka.errors as errors
from aiokafka import TopicPartition
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Int64, Schema, String
from aiokafka.record.memory_records import MemoryRecords

# A batch's length (after its first 12 bytes) and partition leader epoch, at its byte 8.
_LENGTH_AND_EPOCH = struct.Struct(">ii")
_MAGIC_AT = 16
# Magic 2 (Kafka 0.11+) batches carry the epoch; older message sets do not.
_EPOCH_MAGIC = 2
NO_EPOCH = -1
# OffsetForLeaderEpoch from a consumer, not a follower.
_CONSUMER_REPLICA_ID = -1
# "No current leader epoch": the leader answers without fencing the request.
_ANY_CURRENT_EPOCH = -1


class EpochTrackingRecords:
    """aiokafka's `MemoryRecords` over one fetched partition's bytes, also keeping the leader
    epoch of the batch `next_batch` returned last (`batch_epoch`, NO_EPOCH for old formats)."""

    __slots__ = ("_data", "_next", "_records", "batch_epoch")

    def __init__(self, data: bytes) -> None:
        self._records = MemoryRecords(data)
        self._data = data
        self._next = 0
        self.batch_epoch = NO_EPOCH

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is not None:
            # aiokafka returns whole batches in order, so they start where the last ended.
            position = self._next
            length, epoch = _LENGTH_AND_EPOCH.unpack_from(self._data, position + 8)
            self.batch_epoch = epoch if self._data[position + _MAGIC_AT] >= _EPOCH_MAGIC else NO_EPOCH
            self._next = position + 12 + length
        return batch


class EpochedRecords(list):
    """One partition's parsed records, with (first offset, leader epoch) of each batch they
    came in, in offset order; and the offset their fetch was made at and the position it
    left (past control batches and compacted or aborted records), None when not known."""

    __slots__ = ("epochs", "fetched_from", "fetched_to")

    def __init__(
        self,
        records: Iterable[Any],
        epochs: list[tuple[int, int]],
        fetched_from: int | None = None,
        fetched_to: int | None = None,
    ) -> None:
        super().__init__(records)
        self.epochs = epochs
        self.fetched_from = fetched_from
        self.fetched_to = fetched_to


def batch_leader_epochs(records: Sequence[Any]) -> list[tuple[int, int]]:
    """(first offset, leader epoch) of each batch of `records`; empty when not known."""
    return getattr(records, "epochs", [])


def fetched_span(records: Sequence[Any]) -> tuple[int | None, int | None]:
    """The offset the fetch of `records` was made at, and the position it left; (None, None)
    when not known (records not handed over by the parsed path, or cut since)."""
    return getattr(records, "fetched_from", None), getattr(records, "fetched_to", None)


def records_from(records: Sequence[Any], offset: int) -> Sequence[Any]:
    """`records` from `offset` on, keeping their batches' epochs."""
    kept = [record for record in records if record.offset >= offset]
    epochs = batch_leader_epochs(records)
    if not epochs or not kept:
        return kept
    first = kept[0].offset
    # The batch holding the first record kept, and those after it.
    start = max((i for i, (base, _) in enumerate(epochs) if base <= first), default=0)
    return EpochedRecords(kept, epochs[start:])


# -- OffsetForLeaderEpoch v3 ------------------------------------------------------------------


class _OffsetForLeaderEpochResponse_v3(Response):
    API_KEY = 23
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader_epoch", Int32),
                        ("end_offset", Int64),
                    ),
                ),
            ),
        ),
    )


class _OffsetForLeaderEpochRequest_v3(RequestStruct):
    API_KEY = 23
    API_VERSION = 3
    RESPONSE_TYPE = _OffsetForLeaderEpochResponse_v3
    SCHEMA = Schema(
        ("replica_id", Int32),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("partition", Int32),
                        ("current_leader_epoch", Int32),
                        ("leader_epoch", Int32),
                    ),
                ),
            ),
        ),
    )


class OffsetForLeaderEpochRequest(Request[_OffsetForLeaderEpochRequest_v3]):
    """Where each partition's given leader epoch ends in its leader's log (v3, Kafka 2.3+)."""

    API_KEY = 23

    def __init__(self, epochs: Mapping[TopicPartition, int]) -> None:
        by_topic: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for tp, epoch in sorted(epochs.items()):
            by_topic[tp.topic].append((tp.partition, _ANY_CURRENT_EPOCH, epoch))
        self._topics = sorted(by_topic.items())

    def build(self, request_struct_class: type[_OffsetForLeaderEpochRequest_v3]) -> _OffsetForLeaderEpochRequest_v3:
        return request_struct_class(_CONSUMER_REPLICA_ID, self._topics)


class EpochsUnsupported(RuntimeError):
    """The broker does not answer OffsetForLeaderEpoch v3."""


async def end_offsets_for_epochs(
    client: Any, epochs: Mapping[TopicPartition, int]
) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition, (epoch, end offset) of the largest epoch up to the given one in its
    leader's log: the offset after its last record there, or the start of the next epoch.
    A KafkaError when a leader is unknown or refuses; EpochsUnsupported for old brokers."""
    by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
    for tp, epoch in epochs.items():
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            client.force_metadata_update()
            raise errors.LeaderNotAvailableError(f"no leader known for {tp.topic}[{tp.partition}]")
        by_leader[leader][tp] = epoch
    found: dict[TopicPartition, tuple[int, int]] = {}
    for leader, asked in by_leader.items():
        try:
            response = await client.send(leader, OffsetForLeaderEpochRequest(asked))
        except (NotImplementedError, errors.IncompatibleBrokerVersion) as old:
            raise EpochsUnsupported(f"node {leader} does not answer OffsetForLeaderEpoch v3: {old}") from None
        for topic, partitions in response.topics:
            for error_code, partition, epoch, end_offset in partitions:
                tp = TopicPartition(topic, partition)
                if error_code:
                    error = errors.for_code(error_code)
                    if error.invalid_metadata:
                        client.force_metadata_update()
                    raise error(f"OffsetForLeaderEpoch of {topic}[{partition}] on node {leader}")
                found[tp] = (epoch, end_offset)
    return found
