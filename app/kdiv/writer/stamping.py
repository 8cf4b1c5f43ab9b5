"""What every kdiv writer does to a record before its Kafka client sees it, with no I/O.

The aiokafka writer (`kdiv.writer.aio`) and the confluent_kafka one (`kdiv.writer.confluent`)
differ only in how they hand records to their client and learn of deliveries; the records
they hand over come from here: the partition a record goes to, its trace header (when the
sampling picks it), and the DIV stamping (`kdiv.div.stamper`: segments, seqs, CRCs, control
records). The clock is injected.

Partitions: a DIV sequence number is per partition, so the partition must be known when the
record is stamped, before the client would pick it. Keyed records go where Kafka's default
partitioner puts them (murmur2, as the Java client, aiokafka and librdkafka's `murmur2_random`
do); records without a key go round robin over the topic's partitions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kdiv.clock import wall_clock_ms
from kdiv.div.stamper import DISABLED, DivStamper, OutgoingRecord
from kdiv.div.wire import ChecksumType, Kind
from kdiv.kafka.partitioner import keyed_partition
from kdiv.trace.header import TRACE_HEADER, encode_trace
from kdiv.trace.sampling import Sampler, SamplingSpec

Headers = Iterable[tuple[str, bytes | None]]


class StampingCore:
    """One producer GUID's records, stamped: partition choice, trace sampling and DIV metadata."""

    def __init__(
        self,
        guid: bytes | None = None,
        *,
        checksum_type: ChecksumType = ChecksumType.ADHASH,
        max_records_per_segment: int = DISABLED,
        max_segment_age_ms: int = 5 * 60 * 1000,
        clock_ms: Callable[[], int] = wall_clock_ms,
        tracing: Sampler | SamplingSpec | str | None = None,
    ) -> None:
        self.stamper = DivStamper(
            guid,
            checksum_type=checksum_type,
            max_records_per_segment=max_records_per_segment,
            max_segment_age_ms=max_segment_age_ms,
        )
        self.clock_ms = clock_ms
        if isinstance(tracing, str):
            tracing = SamplingSpec.parse(tracing)
        self.tracing = Sampler(tracing) if isinstance(tracing, SamplingSpec) else tracing
        # Per topic: how many unkeyed records it has had (the round robin's position).
        self._unkeyed: dict[str, int] = {}

    @property
    def guid(self) -> bytes:
        return self.stamper.guid

    def partition_for(self, topic: str, key: bytes | None, partitions: Sequence[int]) -> int:
        """Kafka's murmur2 partition for a key, the next partition round robin without one.

        `partitions`: the topic's, sorted (as the client's metadata knows them)."""
        if not partitions:
            raise LookupError(f"topic {topic!r} has no partitions")
        if key is not None:
            return keyed_partition(key, partitions)
        turn = self._unkeyed.get(topic, 0)
        self._unkeyed[topic] = turn + 1
        return partitions[turn % len(partitions)]

    def with_trace(self, topic: str, headers: Headers = ()) -> tuple[tuple[str, bytes | None], ...]:
        """`headers`, plus a trace header when the sampling picks this record of `topic`."""
        headers = tuple(headers)
        if self.tracing is not None and not any(name == TRACE_HEADER for name, _ in headers):
            # A record that already carries a trace (a processor forwarding it) keeps it.
            stamp = self.tracing.stamp_for(topic, self.clock_ms())
            if stamp is not None:
                headers += ((TRACE_HEADER, encode_trace(stamp)),)
        return headers

    def data(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> list[OutgoingRecord]:
        """The records to send, in order, for one data record: a START_OF_SEGMENT (or an
        END_OF_SEGMENT and a START_OF_SEGMENT at rollover) when due, then the record, stamped
        (and traced when sampled)."""
        # Checked before any state changes: the CRC covers bytes, and a record refused halfway
        # through stamping would leave a seq taken that nothing carries.
        for name, part in (("key", key), ("value", value)):
            if part is not None and not isinstance(part, bytes | bytearray | memoryview):
                raise TypeError(
                    f"{name} of a record for {topic}/{partition} must be bytes or None, not {type(part).__name__}"
                )
        return self.stamper.data(topic, partition, key, value, self.clock_ms(), self.with_trace(topic, headers))

    def push_marker(self, topic: str, partition: int, kind: Kind) -> list[OutgoingRecord]:
        """START_OF_PUSH or END_OF_PUSH for one partition (after a START_OF_SEGMENT when due)."""
        return self.stamper.control(topic, partition, kind, self.clock_ms())

    def end_segment(self, topic: str, partition: int, final: bool = True) -> list[OutgoingRecord]:
        """END_OF_SEGMENT with the segment's checksum; nothing when no segment is open."""
        return self.stamper.end_segment(topic, partition, final, self.clock_ms())

    def open_partitions(self, topic: str | None = None) -> list[tuple[str, int]]:
        """(topic, partition) pairs with an open segment (of one topic, or all)."""
        return self.stamper.open_partitions(topic)
