"""`kdiv demo`: a writer that keeps producing and injects every fault class on a schedule.

Faults are injected between the writer and the broker, the way real pipelines break: a
stamped record that never arrives (loss), an acknowledged record sent again (duplicate), a
value changed after stamping (corruption), two records swapped (reordering), a segment whose
START_OF_SEGMENT is lost (unregistered producer), a loss inside a push (a fatal fault
that fails the push), a record sent after its segment's END_OF_SEGMENT (data after segment
end), a header that cannot be read (malformed), and a record with no header (untracked).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.div.stamper import OutgoingRecord
from kdiv.div.wire import HEADER_NAME, DivHeader, Kind, decode, encode, record_crc
from kdiv.kafka.produce import new_producer
from kdiv.writer import DivWriter

log = logging.getLogger("kdiv.demo")

FAULTS = (
    "loss",
    "duplicate",
    "corruption",
    "reordering",
    "unregistered",
    "push-failure",
    "data-after-end",
    "malformed",
    "untracked",
)


def admin_client(bootstrap: str, security: KafkaSecurity = PLAINTEXT) -> AIOKafkaAdminClient:
    """The demo's admin client, not started."""
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-demo", **security.aiokafka_kwargs())


async def ensure_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    security: KafkaSecurity = PLAINTEXT,
    replication_factor: int = 1,
    config: dict[str, str] | None = None,
) -> None:
    admin = admin_client(bootstrap, security)
    await admin.start()
    try:
        response = await admin.create_topics(
            [
                NewTopic(
                    topic, num_partitions=partitions, replication_factor=replication_factor, topic_configs=config or {}
                )
            ]
        )
        for name, code, *rest in response.topic_errors:
            if code and for_code(code) is not TopicAlreadyExistsError:
                raise for_code(code)(f"creating demo topic {name}: {rest[0] if rest else ''}")
    finally:
        await admin.close()


class FaultyPipeline:
    """A DivWriter plus the means to break what it writes."""

    def __init__(self, writer: DivWriter, topic: str, keys: int | None = None) -> None:
        self.writer = writer
        self.topic = topic
        # None: a new key per record; else keys drawn from this many (a compacted topic's
        # records update keys, and the latest per key is what compaction keeps).
        self.keys = keys
        self.last_sent: OutgoingRecord | None = None
        self._counter = itertools.count()

    def _next(self, partition: int) -> list[OutgoingRecord]:
        n = next(self._counter)
        key = b"key-%d" % (n if self.keys is None else random.randrange(self.keys))
        return self.writer.stamper.data(
            self.topic,
            partition,
            key,
            b"value-%d-" % n + random.randbytes(24),
            self.writer.clock_ms(),
        )

    async def _put(self, records: list[OutgoingRecord]) -> None:
        for r in records:
            await self.writer.producer.send_and_wait(
                r.topic, r.value, r.key, partition=r.partition, headers=list(r.headers)
            )
            if r.kind == Kind.DATA:
                self.last_sent = r

    async def healthy(self, partition: int) -> None:
        await self._put(self._next(partition))

    async def inject(self, fault: str, partition: int) -> None:
        if fault == "loss":
            self._next(partition)  # stamped, never sent
        elif fault == "duplicate" and self.last_sent is not None:
            await self._put([self.last_sent])
        elif fault == "corruption":
            *control, victim = self._next(partition)
            await self._put(control)
            await self.writer.producer.send_and_wait(
                victim.topic,
                b"tampered" + (victim.value or b""),
                victim.key,
                partition=partition,
                headers=list(victim.headers),
            )
        elif fault == "reordering":
            first, second = self._next(partition), self._next(partition)
            await self._put(second + first if len(first) == 1 else first[:-1] + second + first[-1:])
        elif fault == "unregistered":
            await self._put(self.writer.stamper.end_segment(self.topic, partition, False, self.writer.clock_ms()))
            _lost_start, data = self._next(partition)
            await self._put([data])  # the new segment's START_OF_SEGMENT is lost
        elif fault == "push-failure":
            await self.writer.start_push(self.topic)
            await self.healthy(partition)
            self._next(partition)  # lost inside the push: fatal
            await self.healthy(partition)
            await self.writer.end_push(self.topic)
        elif fault == "data-after-end":
            # In a segment of its own, started with its START_OF_SEGMENT: only a registered
            # segment's END_OF_SEGMENT finalises a checksum that late data then contradicts
            # (the open one may be an unregistered segment a fault left).
            await self._put(self.writer.stamper.end_segment(self.topic, partition, False, self.writer.clock_ms()))
            await self.healthy(partition)
            (end,) = self.writer.stamper.end_segment(self.topic, partition, False, self.writer.clock_ms())
            await self._put([end])
            ended = decode(dict(end.headers)[HEADER_NAME])
            key, value = b"late", b"after the end of its segment"
            late = DivHeader(
                Kind.DATA,
                ended.guid,
                ended.segment,
                ended.seq + 1,
                self.writer.clock_ms(),
                record_crc(Kind.DATA, key, value),
            )
            await self.writer.producer.send_and_wait(
                self.topic, value, key, partition=partition, headers=[(HEADER_NAME, encode(late))]
            )
        elif fault == "malformed":
            await self.writer.producer.send_and_wait(
                self.topic, b"value", b"key", partition=partition, headers=[(HEADER_NAME, b"\x01truncated")]
            )
        elif fault == "untracked":
            await self.writer.producer.send_and_wait(self.topic, b"not stamped", b"key", partition=partition)
        log.warning("injected %s on %s/%d", fault, self.topic, partition)


async def run_demo(
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    fault_every_s: float,
    duration_s: float,
    security: KafkaSecurity = PLAINTEXT,
    replication_factor: int = 1,
    writers: int = 3,
    restart_every_s: float = 60.0,
    compacted_topic: str | None = None,
) -> None:
    """Write `topic` (and `compacted_topic`, a compacted one with a small key space, when
    given) from `writers` producers at `rate` records/s in all, inject the next fault class
    every `fault_every_s`, and restart one producer every `restart_every_s` (0: never): a
    restarted producer is a new GUID, as a service instance restarting is."""
    await ensure_topic(bootstrap, topic, partitions, security, replication_factor)
    if compacted_topic:
        config = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}
        await ensure_topic(bootstrap, compacted_topic, partitions, security, replication_factor, config)
    producer = new_producer(bootstrap, security=security)
    await producer.start()

    def pipeline(target: str, keys: int | None = None) -> FaultyPipeline:
        return FaultyPipeline(DivWriter(producer, max_records_per_segment=500), target, keys)

    pipelines = [pipeline(topic) for _ in range(max(writers, 1))]
    compacted = pipeline(compacted_topic, keys=200) if compacted_topic else None
    loop = asyncio.get_running_loop()
    started = loop.time()
    next_fault = started + fault_every_s
    next_restart = started + restart_every_s if restart_every_s else float("inf")
    faults = itertools.cycle(FAULTS)
    try:
        for n in itertools.count():
            now = loop.time()
            if duration_s and now - started >= duration_s:
                break
            if now >= next_restart:
                victim = random.randrange(len(pipelines))
                await pipelines[victim].writer.close()  # END_OF_SEGMENTs: a clean stop
                pipelines[victim] = pipeline(topic)
                log.warning("restarted writer %d: new producer %s", victim, pipelines[victim].writer.guid.hex())
                next_restart = now + restart_every_s
            if now >= next_fault:
                await random.choice(pipelines).inject(next(faults), random.randrange(partitions))
                next_fault = now + fault_every_s
            else:
                await pipelines[n % len(pipelines)].healthy(n % partitions)
                if compacted is not None and n % 4 == 0:
                    await compacted.healthy((n // 4) % partitions)
            await asyncio.sleep(1 / rate)
    finally:
        for p in [*pipelines, *([compacted] if compacted else [])]:
            await p.writer.close()
        await producer.stop()
