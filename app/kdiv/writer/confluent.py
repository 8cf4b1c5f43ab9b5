"""ConfluentDivWriter: records stamped with DIV metadata, sent through confluent_kafka's Producer.

The same records as `DivWriter` (aiokafka) writes, stamped by the same core
(`kdiv.writer.stamping`): what differs is librdkafka's way of sending them.

- It queues, batches and retries inside the client. Records of one partition reach the log in
  the order they were handed to `produce` only with `enable.idempotence` (up to 5 requests in
  flight, retried in order, no retry written twice), so `start()` turns it on; without it, the
  writer needs `max.in.flight.requests.per.connection=1`, or a retry could reorder seqs.
- Delivery reports come back through `poll()`/`flush()`, in the calling thread. A record whose
  delivery fails is never silent: a caller's `on_delivery` gets the error (librdkafka's
  `(err, msg)`); a record without one (every control record, a data record sent without a
  callback) is kept, and the next `flush()` or `close()` raises `DeliveryFailed` naming them.
  `produce_and_wait` raises it for its own record.
- `produce` raises BufferError when the client's queue is full: the writer serves delivery
  reports and tries again until `queue_full_timeout_s`, then raises with the record's DIV state
  rolled back, so the next record takes its seq and no validator sees a gap. A record the client
  refuses at once (KafkaException: too large, no such partition) is rolled back the same way.

A lock makes the stamping of a record and its hand-off one step, so the order in the client's
queue is seq order even when threads share the writer. Transactions are `DivWriter`'s only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

try:
    from confluent_kafka import KafkaError, KafkaException, Message, Producer, SerializingProducer
except ImportError as missing:  # the base install is aiokafka's writer only
    raise ImportError("kdiv.writer.confluent needs confluent-kafka: pip install 'kdiv[confluent]'") from missing

from kdiv.clock import wall_clock_ms
from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.div.stamper import DISABLED, OutgoingRecord, StamperCheckpoint
from kdiv.div.wire import ChecksumType, Kind
from kdiv.trace.sampling import Sampler, SamplingSpec
from kdiv.writer.stamping import StampingCore

DeliveryCallback = Callable[[KafkaError | None, Message], None]

# What `start()` gives librdkafka unless told otherwise: every record acknowledged by all
# in-sync replicas, in order and once per partition under retries; the partitioner of keyed
# records the writer itself uses (the Java client's), for anything else sent through it.
DEFAULT_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "partitioner": "murmur2_random",
}


def producer_settings(
    bootstrap_servers: str, *, security: KafkaSecurity = PLAINTEXT, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A writer's Producer configuration: `DEFAULT_CONFIG`, the cluster's security settings
    (as kdiv's other clients get them), then `extra`."""
    return {**DEFAULT_CONFIG, **security.librdkafka_config(), "bootstrap.servers": bootstrap_servers, **(extra or {})}


# How many failed records a DeliveryFailed names (it counts them all).
_FAILURES_NAMED = 10


@dataclass(frozen=True, slots=True)
class FailedDelivery:
    """One record the broker did not acknowledge, as librdkafka reported it."""

    topic: str
    partition: int
    kind: Kind
    error: KafkaError

    def __str__(self) -> str:
        return f"{self.kind.name} record to {self.topic}/{self.partition}: {self.error.str()}"


class DeliveryFailed(Exception):
    """Records were not delivered (librdkafka's delivery reports said so)."""

    def __init__(self, failures: list[FailedDelivery]) -> None:
        self.failures = failures
        named = "; ".join(str(failure) for failure in failures[:_FAILURES_NAMED])
        more = f" (and {len(failures) - _FAILURES_NAMED} more)" if len(failures) > _FAILURES_NAMED else ""
        super().__init__(f"{len(failures)} record(s) not delivered: {named}{more}")


class ConfluentDivWriter:
    """Sends records stamped with DIV metadata through a `confluent_kafka.Producer`, and the
    segment and push control records around them. One writer is one producer GUID."""

    def __init__(
        self,
        producer: Producer,
        *,
        checksum_type: ChecksumType = ChecksumType.ADHASH,
        max_records_per_segment: int = DISABLED,
        max_segment_age_ms: int = 5 * 60 * 1000,
        clock_ms: Callable[[], int] = wall_clock_ms,
        guid: bytes | None = None,
        tracing: Sampler | SamplingSpec | str | None = None,
        owns_producer: bool = False,
        metadata_timeout_s: float = 10.0,
        metadata_max_age_ms: int = 5 * 60 * 1000,
        queue_full_timeout_s: float = 10.0,
    ) -> None:
        # The CRC covers the exact bytes on the wire, so the producer must not serialize.
        if isinstance(producer, SerializingProducer):
            raise ValueError("ConfluentDivWriter needs a Producer without serializers: pass bytes")
        self.producer = producer
        self.core = StampingCore(
            guid,
            checksum_type=checksum_type,
            max_records_per_segment=max_records_per_segment,
            max_segment_age_ms=max_segment_age_ms,
            clock_ms=clock_ms,
            tracing=tracing,
        )
        self.metadata_timeout_s = metadata_timeout_s
        self.metadata_max_age_ms = metadata_max_age_ms
        self.queue_full_timeout_s = queue_full_timeout_s
        self._owns_producer = owns_producer
        # Reentrant: delivery callbacks run inside poll(), which the writer calls under the
        # lock when the queue is full, and a callback may send again.
        self._lock = threading.RLock()
        self._partitions: dict[str, tuple[int, list[int]]] = {}
        self._failures: list[FailedDelivery] = []
        self._closed = False

    @classmethod
    def start(
        cls,
        bootstrap_servers: str,
        *,
        security: KafkaSecurity = PLAINTEXT,
        producer_config: dict[str, Any] | None = None,
        **writer_options: Any,
    ) -> ConfluentDivWriter:
        """A writer with a Producer of its own (`DEFAULT_CONFIG`, the cluster's `security`, then
        `producer_config`); `close()` flushes it."""
        config = producer_settings(bootstrap_servers, security=security, extra=producer_config)
        if not _truthy(config.get("enable.idempotence")):
            in_flight = int(config.get("max.in.flight.requests.per.connection", config.get("max.in.flight", 1)))
            config.setdefault("max.in.flight.requests.per.connection", in_flight)
            if in_flight != 1:
                raise ValueError(
                    "without enable.idempotence, max.in.flight.requests.per.connection must be 1: "
                    f"with {in_flight}, a retried batch could land after the next one and its seqs out of order"
                )
        return cls(Producer(config), owns_producer=True, **writer_options)

    @property
    def guid(self) -> bytes:
        """This producer's GUID, as validators report it."""
        return self.core.guid

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions from the cluster's metadata (kept `metadata_max_age_ms`);
        LookupError when the topic is unknown or the metadata does not come in time."""
        now = self.core.clock_ms()
        known = self._partitions.get(topic)
        if known is not None and now - known[0] <= self.metadata_max_age_ms:
            return known[1]
        try:
            metadata = self.producer.list_topics(topic, timeout=self.metadata_timeout_s)
        except KafkaException as failed:
            raise LookupError(
                f"topic {topic!r}: no metadata within {self.metadata_timeout_s:g} s: {failed.args[0]}"
            ) from failed
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            why = found.error.str() if found is not None and found.error is not None else "no partitions"
            raise LookupError(f"topic {topic!r} has no partitions the producer can see ({why})")
        partitions = sorted(found.partitions)
        self._partitions[topic] = (now, partitions)
        return partitions

    def partition_for(self, topic: str, key: bytes | None) -> int:
        """Kafka's murmur2 partition for a key (librdkafka's `murmur2_random`, the Java
        client's), round robin without one: decided before stamping."""
        return self.core.partition_for(topic, key, self.partitions(topic))

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] = (),
        on_delivery: DeliveryCallback | None = None,
    ) -> int:
        """Stamp one record and hand it (after its START_OF_SEGMENT when one opens) to the
        producer; its partition. `on_delivery(err, msg)` is called from `poll`/`flush` when the
        broker acknowledged it (`err` None) or it failed; without one, a failure is raised by
        the next `flush`."""
        self._check_open()
        with self._lock:
            if partition is None:
                partition = self.partition_for(topic, key)
            before = self.core.stamper.partition_checkpoint(topic, partition)
            records = self.core.data(topic, partition, key, value, headers)
            self._hand_off(topic, partition, records, on_delivery, before)
        return partition

    def produce_and_wait(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] = (),
        timeout_s: float = 30.0,
    ) -> Message:
        """`produce`, then serve delivery reports until this record's: its Message
        (partition, offset). DeliveryFailed if it failed; TimeoutError if no report came
        within `timeout_s` (the record may still be delivered later)."""
        reports: list[tuple[KafkaError | None, Message]] = []
        partition = self.produce(
            topic,
            value,
            key,
            partition=partition,
            headers=headers,
            on_delivery=lambda err, msg: reports.append((err, msg)),
        )
        deadline = time.monotonic() + timeout_s
        while not reports:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"record to {topic}: no delivery report within {timeout_s:g} s")
            self.producer.poll(min(left, 0.5))
        ((err, msg),) = reports
        if err is not None:
            raise DeliveryFailed([FailedDelivery(topic, partition, Kind.DATA, err)])
        return msg

    def start_push(self, topic: str) -> None:
        """START_OF_PUSH on every partition of the topic."""
        self._broadcast(topic, Kind.START_OF_PUSH)

    def end_push(self, topic: str) -> None:
        """END_OF_PUSH on every partition, then close every segment of the topic as final."""
        self._broadcast(topic, Kind.END_OF_PUSH)
        self.end_segments(topic, final=True)

    def end_segment(self, topic: str, partition: int, final: bool = True) -> None:
        """END_OF_SEGMENT with the segment's checksum; the next record opens a new segment."""
        with self._lock:
            before = self.core.stamper.partition_checkpoint(topic, partition)
            self._hand_off(topic, partition, self.core.end_segment(topic, partition, final), None, before)

    def end_segments(self, topic: str | None = None, *, final: bool = True) -> None:
        """End every open segment (of one topic, or of all)."""
        with self._lock:
            for tp_topic, partition in self.core.open_partitions(topic):
                self.end_segment(tp_topic, partition, final)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports (callbacks run here); how many were served."""
        return self.producer.poll(timeout_s)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every record handed over so far is acknowledged or failed: TimeoutError
        if some are still queued after `timeout_s`, DeliveryFailed if records without a
        callback of their own failed (each is raised once)."""
        left = self.producer.flush(timeout_s)
        if left:
            raise TimeoutError(f"{left} record(s) still unacknowledged after {timeout_s:g} s")
        self._raise_failures()

    def close(self, timeout_s: float = 30.0) -> None:
        """End every open segment as final, then `flush` (raising what it raises); a producer
        of the writer's own (`start()`) is then closed, once nothing is left in its queue."""
        if self._closed:
            return
        self.end_segments(final=True)
        self._closed = True
        try:
            self.flush(timeout_s)
        finally:
            # Only an empty queue: Producer.close() would wait, unbounded, for what is left.
            # (A release without Producer.close() frees the producer when it is dropped.)
            if self._owns_producer and len(self.producer) == 0 and hasattr(self.producer, "close"):
                self.producer.close()

    def __enter__(self) -> ConfluentDivWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _broadcast(self, topic: str, kind: Kind) -> None:
        self._check_open()
        with self._lock:
            for partition in self.partitions(topic):
                before = self.core.stamper.partition_checkpoint(topic, partition)
                self._hand_off(topic, partition, self.core.push_marker(topic, partition, kind), None, before)

    def _hand_off(
        self,
        topic: str,
        partition: int,
        records: list[OutgoingRecord],
        on_delivery: DeliveryCallback | None,
        before: StamperCheckpoint,
    ) -> None:
        """Produce the records in order (the caller holds the lock and stamped them just now,
        from the partition's state `before`).

        The data record's report goes to `on_delivery` when given; every other report (and a
        data record's without one) goes to the writer's own, which keeps failures."""
        for index, record in enumerate(records):
            callback = on_delivery if on_delivery is not None and record.kind == Kind.DATA else self._reported(record)
            try:
                self._produce_when_room(record, callback)
            except (BufferError, KafkaException) as refused:
                if index == 0:
                    # Nothing of this stamping reached the client: take it back, so the next
                    # record takes its seq and no validator sees a gap.
                    self.core.stamper.rollback_partition(topic, partition, before)
                    outcome = "nothing was sent"
                else:
                    # Its segment's first records are queued: the rest's seqs stay taken (MISSING).
                    outcome = f"{len(records) - index} stamped record(s) not sent"
                if isinstance(refused, BufferError):
                    raise BufferError(
                        f"{topic}/{partition}: the producer's queue stayed full for {self.queue_full_timeout_s:g} s; "
                        + outcome
                    ) from None
                # librdkafka's own refusal (a record too large, an unknown partition, a fatal
                # error), raised as it is, saying what the writer did.
                refused.add_note(f"kdiv: {record.kind.name} record to {topic}/{partition} refused; {outcome}")
                raise

    def _produce_when_room(self, record: OutgoingRecord, callback: DeliveryCallback) -> None:
        deadline = None  # taken at the first refusal: the common case pays no clock read
        while True:
            try:
                self.producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=list(record.headers),
                    on_delivery=callback,
                )
                return
            except BufferError:
                if deadline is None:
                    deadline = time.monotonic() + self.queue_full_timeout_s
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                # Deliveries make room; their callbacks run here.
                self.producer.poll(min(left, 0.1))

    def _reported(self, record: OutgoingRecord) -> DeliveryCallback:
        def reported(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self._failures.append(FailedDelivery(record.topic, record.partition, record.kind, err))

        return reported

    def _raise_failures(self) -> None:
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryFailed(failures)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ConfluentDivWriter is closed")


def _truthy(value: object) -> bool:
    return value is True or str(value).lower() in ("true", "1")
