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
import contextlib
import itertools
import logging
import random
from contextlib import aclosing

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.structs import RecordMetadata

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.dev.outage import Backoff, BrokerOutage, is_outage, retry, wait_until_back
from kdiv.div.ledger import PACKED_SIZE, KeyValidation, at_rest_crc, ledger_key, pack_key_validation
from kdiv.div.stamper import OutgoingRecord
from kdiv.div.wire import HEADER_NAME, DivHeader, Kind, decode, encode, record_crc
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.produce import started_producer
from kdiv.kafka.topics import TopicCreationError, create_topic
from kdiv.state.framing import schema_id_of
from kdiv.state.tables import ledger_changelog_topic_name
from kdiv.state.values import StateValues
from kdiv.writer import DivWriter

log = logging.getLogger("kdiv.demo")

# At the end, each writer's END_OF_SEGMENTs get this long; a broker away leaves them open.
_CLOSE_TIMEOUT_S = 10.0

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
    "divergent",
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
        topic_spec = NewTopic(
            topic, num_partitions=partitions, replication_factor=replication_factor, topic_configs=config or {}
        )
        try:
            await create_topic(admin, topic_spec)
        except TopicCreationError as refused:
            raise TopicCreationError(f"demo topic: {refused}") from None
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
            self.writer.with_trace(self.topic),
        )

    async def send(self, records: list[OutgoingRecord]) -> RecordMetadata | None:
        """Send `records` in order; the last one's metadata."""
        sent = None
        for r in records:
            sent = await self.writer.producer.send_and_wait(
                r.topic, r.value, r.key, partition=r.partition, headers=list(r.headers)
            )
        return sent

    async def _put(self, records: list[OutgoingRecord]) -> None:
        await self.send(records)
        data = [r for r in records if r.kind == Kind.DATA]
        if data:
            self.last_sent = data[-1]

    async def healthy(self, partition: int) -> None:
        await self._put(self._next(partition))

    async def inject(self, fault: str, partition: int) -> None:
        if fault == "loss":
            self._next(partition)  # stamped, never sent
        elif fault == "duplicate" and self.last_sent is not None:
            await self._put([self.last_sent])
        elif fault == "divergent" and self.last_sent is not None:
            # The last record's producer, segment and seq, with other bytes and their CRC:
            # what a producer that rewrites a record it already sent would send.
            sent = self.last_sent
            value = b"rewritten " + (sent.value or b"")
            header = decode(dict(sent.headers)[HEADER_NAME])._replace(crc=record_crc(Kind.DATA, sent.key, value))
            await self.writer.producer.send_and_wait(
                sent.topic, value, sent.key, partition=sent.partition, headers=[(HEADER_NAME, encode(header))]
            )
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


AT_REST_FAULTS = ("LOST", "DIVERGED", "UNVALIDATED")


# The demo's compacted topic: compacted a minute after a write, and deletable (DeleteRecords
# needs "delete" in the policy), with no deletion by age.
COMPACTED_TOPIC_CONFIG = {"cleanup.policy": "compact,delete", "retention.ms": "-1", "min.compaction.lag.ms": "60000"}


class AtRestFaults:
    """Findings for the nightly reconciliation on the compacted topic.

    LOST comes from the broker itself: a key written once, validated, then removed from the
    log by DeleteRecords (an operator's or a tool's), with every record before it, so the
    keys whose latest record was there are LOST too. A single broker cannot rewrite a
    record in place, so DIVERGED and UNVALIDATED are made in the worker's key ledger, as a
    store restored wrongly would disagree with the topic. Each uses a key of its own,
    written once, so the worker's later entries never overwrite it."""

    def __init__(
        self, bootstrap: str, pipeline: FaultyPipeline, app_id: str, partitions: int, security: KafkaSecurity
    ) -> None:
        self.bootstrap = bootstrap
        self.pipeline = pipeline
        self.app_id = app_id
        self.security = security
        self.ledger_topic = ledger_changelog_topic_name(app_id, partitions)
        self._values: StateValues | None = None
        self._counter = itertools.count()
        # partition -> the log start offset LOST's DeleteRecords set last.
        self.deleted_before: dict[int, int] = {}
        # Set when a finding was cut short (an outage): a record it stamped may or may not
        # have landed, so the compacted topic's writer is retired (see run_demo).
        self.interrupted = False

    async def inject(self, finding: str, partition: int, wait_s: float = 60.0) -> bool:
        """Make `finding` for one key of `partition`; False when the worker has written no
        ledger entry yet (nothing to imitate) or did not validate the key's record in time."""
        topic = self.pipeline.topic
        producer = self.pipeline.writer.producer
        values = await self._ledger_values()
        if values is None:
            return False
        n = next(self._counter)
        if finding == "LOST":
            return await self._delete_through(b"at-rest-lost-%d" % n, partition, wait_s)
        key, value_bytes = b"at-rest-%s-%d" % (finding.lower().encode(), n), b"kept at rest"
        stamped = self.pipeline.writer.stamper.data(topic, partition, key, value_bytes, self.pipeline.writer.clock_ms())
        sent = await self.pipeline.send(stamped)
        assert sent is not None
        if not await self._validated(partition, sent.offset, wait_s):
            return False
        value: bytes | None = None  # UNVALIDATED: the ledger lost the entry of a record below the validated offset
        if finding == "DIVERGED":  # the ledger's bytes at that offset differ from the topic's
            header = decode(dict(stamped[-1].headers)[HEADER_NAME])
            crc = at_rest_crc(key, value_bytes)
            entry = KeyValidation(
                sent.offset, sent.timestamp, crc ^ 0xFFFFFFFF, False, header.guid, header.segment, header.seq
            )
            value = values.encode_packed_key_validation(pack_key_validation(entry))
        await producer.send_and_wait(self.ledger_topic, value, ledger_key(topic, partition, key), partition=partition)
        log.warning("injected at-rest %s on %s/%d (key %s)", finding, topic, partition, key.decode())
        return True

    async def _delete_through(self, key: bytes, partition: int, wait_s: float) -> bool:
        """Write `key` once, wait until the worker validated it, then DeleteRecords up to and
        including it."""
        topic = self.pipeline.topic
        stamped = self.pipeline.writer.stamper.data(
            topic, partition, key, b"deleted at rest", self.pipeline.writer.clock_ms()
        )
        sent = await self.pipeline.send(stamped)
        assert sent is not None
        if not await self._validated(partition, sent.offset, wait_s):
            return False
        admin = admin_client(self.bootstrap, self.security)
        await admin.start()
        try:
            tp = TopicPartition(topic, partition)
            await admin.delete_records({tp: RecordsToDelete(before_offset=sent.offset + 1)})
        finally:
            await admin.close()
        self.deleted_before[partition] = sent.offset + 1
        log.warning(
            "at rest: DeleteRecords on %s/%d before offset %d (key %s)", topic, partition, sent.offset + 1, key.decode()
        )
        return True

    async def _ledger_values(self) -> StateValues | None:
        """The worker's ledger value encoding (the state schema id it registered), read
        from an entry it wrote."""
        if self._values is not None:
            return self._values
        try:
            snapshot = read_snapshot(self.bootstrap, self.ledger_topic, security=self.security)
            async with aclosing(snapshot) as records:  # type: ignore[type-var]
                async for record in records:
                    schema_id = schema_id_of(record.value)
                    if schema_id is None or record.value is None:
                        continue
                    values = StateValues(schema_id)
                    if values.encode_packed_key_validation(record.value[-PACKED_SIZE:]) == record.value:
                        self._values = values
                        return values
        except LookupError:
            return None  # the worker has not made its ledger topic yet
        return None

    async def _validated(self, partition: int, offset: int, wait_s: float) -> bool:
        """True once the worker's group has committed past `offset` of the partition."""
        admin = admin_client(self.bootstrap, self.security)
        await admin.start()
        try:
            tp = TopicPartition(self.pipeline.topic, partition)
            deadline = asyncio.get_running_loop().time() + wait_s
            while asyncio.get_running_loop().time() < deadline:
                committed = await admin.list_consumer_group_offsets(self.app_id, partitions=[tp])
                if tp in committed and committed[tp].offset > offset:
                    return True
                await asyncio.sleep(0.5)
            return False
        finally:
            await admin.close()


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
    at_rest_every_s: float = 0.0,
    app_id: str = "kdiv",
    tracing: str | None = None,
) -> None:
    """Write `topic` (and `compacted_topic`, a compacted one with a small key space, when
    given) from `writers` producers at `rate` records/s in all, inject the next fault class
    every `fault_every_s`, and restart one producer every `restart_every_s` (0: never): a
    restarted producer is a new GUID, as a service instance restarting is. With a compacted
    topic and `at_rest_every_s`, the next at-rest finding (`AtRestFaults`) of worker `app_id`
    is made that often, in the background. `tracing`: the writers' trace sampling (e.g.
    "kdiv-demo=0.2"), for the pipeline audit."""
    outage = BrokerOutage("kdiv demo", log)
    backoff = Backoff()
    await retry(lambda: ensure_topic(bootstrap, topic, partitions, security, replication_factor), outage, backoff)
    if compacted_topic:
        config = dict(COMPACTED_TOPIC_CONFIG)
        await retry(
            lambda: ensure_topic(bootstrap, compacted_topic, partitions, security, replication_factor, config),
            outage,
            backoff,
        )

    producer = await retry(lambda: started_producer(bootstrap, security=security), outage, backoff)

    def pipeline(target: str, keys: int | None = None) -> FaultyPipeline:
        return FaultyPipeline(DivWriter(producer, max_records_per_segment=500, tracing=tracing), target, keys)

    pipelines = [pipeline(topic) for _ in range(max(writers, 1))]
    compacted = pipeline(compacted_topic, keys=200) if compacted_topic else None
    at_rest = (
        AtRestFaults(bootstrap, compacted, app_id, partitions, security) if compacted and at_rest_every_s else None
    )
    findings = itertools.cycle(AT_REST_FAULTS)
    background: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()
    started = loop.time()
    next_at_rest = started + at_rest_every_s if at_rest else float("inf")
    next_fault = started + fault_every_s
    next_restart = started + restart_every_s if restart_every_s else float("inf")
    faults = itertools.cycle(FAULTS)

    def replace(crashed: FaultyPipeline) -> None:
        """A writer whose write timed out is a crashed producer: that write may or may not
        have landed, so its GUID writes nothing more (its segment stays open, as a crash
        leaves it) and a new producer takes its place."""
        nonlocal compacted
        if crashed is compacted:
            assert compacted_topic is not None
            compacted = replacement = pipeline(compacted_topic, keys=200)
            if at_rest is not None:
                at_rest.pipeline = compacted
        else:
            index = pipelines.index(crashed)
            pipelines[index] = replacement = pipeline(topic)
        log.warning(
            "a write of producer %s timed out and may or may not have landed: that producer is treated as "
            "crashed, new producer %s",
            crashed.writer.guid.hex(),
            replacement.writer.guid.hex(),
        )

    try:
        for n in itertools.count():
            now = loop.time()
            if duration_s and now - started >= duration_s:
                break
            acting: FaultyPipeline | None = None
            if at_rest is not None and at_rest.interrupted and compacted is not None:
                at_rest.interrupted = False
                replace(compacted)
            try:
                if now >= next_restart:
                    victim = random.randrange(len(pipelines))
                    acting = pipelines[victim]
                    next_restart = now + restart_every_s
                    await acting.writer.close()  # END_OF_SEGMENTs: a clean stop
                    pipelines[victim] = pipeline(topic)
                    log.warning("restarted writer %d: new producer %s", victim, pipelines[victim].writer.guid.hex())
                if at_rest is not None and now >= next_at_rest:
                    task = asyncio.create_task(_at_rest_finding(at_rest, next(findings), random.randrange(partitions)))
                    background.add(task)
                    task.add_done_callback(background.discard)
                    next_at_rest = now + at_rest_every_s
                if now >= next_fault:
                    acting = random.choice(pipelines)
                    next_fault = now + fault_every_s
                    await acting.inject(next(faults), random.randrange(partitions))
                else:
                    acting = pipelines[n % len(pipelines)]
                    await acting.healthy(n % partitions)
                    if compacted is not None and n % 4 == 0:
                        acting = compacted
                        await compacted.healthy((n // 4) % partitions)
            except Exception as failed:
                if not is_outage(failed):
                    raise
                outage.failed(failed)
                # An at-rest finding half made is not logged as made; none is made meanwhile.
                for task in list(background):
                    task.cancel()
                if acting is not None:
                    replace(acting)
                await wait_until_back(producer.client, outage, backoff)
                continue
            outage.ended()
            backoff.reset()
            await asyncio.sleep(1 / rate)
    finally:
        for task in list(background):
            task.cancel()
        for p in [*pipelines, *([compacted] if compacted else [])]:
            with contextlib.suppress(Exception):  # a broker away at the end: segments stay open
                await asyncio.wait_for(p.writer.close(), _CLOSE_TIMEOUT_S)
        await producer.stop()


async def _at_rest_finding(at_rest: AtRestFaults, finding: str, partition: int) -> None:
    """One at-rest finding, in the background; one the broker's outage interrupts is not made
    (the main loop says the outage)."""
    try:
        await at_rest.inject(finding, partition)
    except asyncio.CancelledError:
        at_rest.interrupted = True
        raise
    except Exception as failed:
        if not is_outage(failed):
            raise
        at_rest.interrupted = True
        log.info("at-rest %s on partition %d not made: the broker did not answer", finding, partition)
