"""DivWriter: an aiokafka producer that stamps every record with DIV metadata.

The partition of each record must be known before it is stamped (segments and sequence
numbers are per partition), so the writer picks it itself, as `kdiv.writer.stamping` does for
every kdiv writer: Kafka's default murmur2 partitioner for keyed records, as the Java client
and aiokafka do, and round robin for records without a key.

Per-partition locks make the order on the wire equal sequence order: a record's DIV update
and its hand-off to the producer's accumulator happen under the partition's lock, and
aiokafka keeps one batch in flight per partition, so retries cannot reorder.

Transactions: `async with writer.transaction():` wraps the producer's transaction (the
producer needs a `transactional_id`). When it aborts, the stamper rolls back to where the
transaction began, so the next records take the aborted seqs again: a validator reading
committed records (kdiv workers read read_committed) sees no gap, and no false MISSING.

Tracing (the pipeline audit): with `tracing` (a `kdiv.trace.sampling` spec such as
"orders=0.01,*=0"), a sampled share of each topic's records carries a trace header with a new
trace id; a record that already carries one (a processor forwarding it) keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from aiokafka import AIOKafkaProducer

from kdiv.clock import wall_clock_ms
from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.div.stamper import DISABLED, DivStamper, OutgoingRecord
from kdiv.div.wire import ChecksumType, Kind
from kdiv.kafka.failures import refusals_explained
from kdiv.kafka.produce import new_producer, track_topic
from kdiv.trace.sampling import Sampler, SamplingSpec
from kdiv.writer.stamping import StampingCore


class DivWriter:
    """Sends records stamped with DIV metadata, and the segment and push control records around them.

    One writer is one producer GUID: its segments and sequence numbers are what validators
    downstream check, so every record of the producer must go through it.
    """

    def __init__(
        self,
        producer: AIOKafkaProducer,
        *,
        checksum_type: ChecksumType = ChecksumType.ADHASH,
        max_records_per_segment: int = DISABLED,
        max_segment_age_ms: int = 5 * 60 * 1000,
        clock_ms: Callable[[], int] = wall_clock_ms,
        guid: bytes | None = None,
        owns_producer: bool = False,
        tracing: Sampler | SamplingSpec | str | None = None,
    ) -> None:
        # The CRC covers the exact bytes on the wire, so the producer must not re-serialize.
        if getattr(producer, "_key_serializer", None) or getattr(producer, "_value_serializer", None):
            raise ValueError("DivWriter needs a producer without key/value serializers: pass bytes")
        self.producer = producer
        # Traced records (the pipeline audit): a sampled share per topic gets a trace header.
        self.core = StampingCore(
            guid,
            checksum_type=checksum_type,
            max_records_per_segment=max_records_per_segment,
            max_segment_age_ms=max_segment_age_ms,
            clock_ms=clock_ms,
            tracing=tracing,
        )
        self._owns_producer = owns_producer
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._closed = False
        # Set by the first transaction: from then on every write must be inside one, the
        # END_OF_SEGMENTs at close included.
        self._transactional = False

    @classmethod
    async def start(
        cls,
        bootstrap_servers: str,
        *,
        security: KafkaSecurity = PLAINTEXT,
        producer_options: dict | None = None,
        **writer_options,
    ) -> DivWriter:
        """A writer with a producer of its own, started; `close()` stops it."""
        producer = new_producer(bootstrap_servers, security=security, **(producer_options or {}))
        try:
            # A refused connection raises BrokerRefused naming why (credentials, TLS).
            with refusals_explained(bootstrap_servers):
                await producer.start()
        except BaseException:
            await producer.stop()
            raise
        return cls(producer, owns_producer=True, **writer_options)

    @property
    def guid(self) -> bytes:
        """This producer's GUID, as validators report it."""
        return self.core.guid

    @property
    def stamper(self) -> DivStamper:
        return self.core.stamper

    @property
    def clock_ms(self) -> Callable[[], int]:
        return self.core.clock_ms

    @property
    def tracing(self) -> Sampler | None:
        return self.core.tracing

    async def partitions(self, topic: str) -> list[int]:
        """The topic's partitions as the producer's metadata knows them; LookupError if none."""
        await track_topic(self.producer, topic)
        found = await self.producer.partitions_for(topic)
        if not found:
            raise LookupError(f"topic {topic!r} has no partitions the producer can see")
        return sorted(found)

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        """Kafka's murmur2 partition for a key, round robin without one (decided before stamping)."""
        return self.core.partition_for(topic, key, await self.partitions(topic))

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] = (),
    ) -> asyncio.Future:
        """Stamp and enqueue one record; the returned future resolves to its RecordMetadata."""
        self._check_open()
        if partition is None:
            partition = await self.partition_for(topic, key)
        async with self._lock(topic, partition):
            future = await self._enqueue(self.core.data(topic, partition, key, value, headers))
        assert future is not None, "a data record is always among the records sent"
        return future

    def with_trace(
        self, topic: str, headers: Iterable[tuple[str, bytes | None]] = ()
    ) -> tuple[tuple[str, bytes | None], ...]:
        """`headers`, plus a trace header when the sampling picks this record of `topic`."""
        return self.core.with_trace(topic, headers)

    async def send_and_wait(self, topic: str, value: bytes | None, key: bytes | None = None, **kwargs):
        """`send`, then wait until the broker has acknowledged the record."""
        return await (await self.send(topic, value, key, **kwargs))

    async def start_push(self, topic: str) -> None:
        """START_OF_PUSH on every partition of the topic."""
        await self._broadcast(topic, Kind.START_OF_PUSH)

    async def end_push(self, topic: str) -> None:
        """END_OF_PUSH on every partition, then close every segment of the topic as final."""
        await self._broadcast(topic, Kind.END_OF_PUSH)
        await self.end_segments(topic, final=True)

    async def end_segment(self, topic: str, partition: int, final: bool = True) -> None:
        """END_OF_SEGMENT with the segment's checksum; the next record opens a new segment."""
        async with self._lock(topic, partition):
            await self._enqueue(self.core.end_segment(topic, partition, final))

    async def end_segments(self, topic: str | None = None, *, final: bool = True) -> None:
        """End every open segment (of one topic, or of all)."""
        for tp_topic, partition in self.core.open_partitions(topic):
            await self.end_segment(tp_topic, partition, final)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[DivWriter]:
        """One producer transaction: committed when the block ends, aborted when it raises.

        An abort (or a failed commit) rolls the DIV state back to the transaction's start.
        """
        self._check_open()
        self._transactional = True
        checkpoint = self.stamper.checkpoint()
        try:
            async with self.producer.transaction():
                yield self
        except BaseException:
            self.stamper.rollback(checkpoint)
            raise

    async def flush(self) -> None:
        """Wait until every record sent so far is acknowledged."""
        await self.producer.flush()

    async def close(self) -> None:
        """End every open segment as final, wait until everything is acknowledged, then stop."""
        if self._closed:
            return
        if self._transactional:
            async with self.transaction():
                await self.end_segments(final=True)
        else:
            await self.end_segments(final=True)
        await self.producer.flush()
        self._closed = True
        if self._owns_producer:
            await self.producer.stop()

    async def __aenter__(self) -> DivWriter:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def _broadcast(self, topic: str, kind: Kind) -> None:
        self._check_open()
        futures = []
        for partition in await self.partitions(topic):
            async with self._lock(topic, partition):
                futures.append(await self._enqueue(self.core.push_marker(topic, partition, kind)))
        await asyncio.gather(*(future for future in futures if future is not None))

    async def _enqueue(self, records: list[OutgoingRecord]) -> asyncio.Future | None:
        """Hand the records to the producer in order; one future for all of them.

        It resolves to the last record's metadata, or raises the first failure, so a lost
        control record is never silent.
        """
        futures = [
            await self.producer.send(
                record.topic,
                value=record.value,
                key=record.key,
                partition=record.partition,
                headers=list(record.headers),
            )
            for record in records
        ]
        if not futures:
            return None
        if len(futures) == 1:
            return futures[0]
        return asyncio.ensure_future(_last_result(futures))

    def _lock(self, topic: str, partition: int) -> asyncio.Lock:
        lock = self._locks.get((topic, partition))
        if lock is None:
            lock = self._locks[(topic, partition)] = asyncio.Lock()
        return lock

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("DivWriter is closed")


async def _last_result(futures: list[asyncio.Future]):
    results = await asyncio.gather(*futures)
    return results[-1]
