"""A pipeline processor with the bugs a pipeline audit must catch, for the tests and the demo.

It consumes `source` in consumer group `group` and writes each record to `sink` with the
trace header forwarded (`kdiv.trace.propagate.forward`) and DIV stamps of its own (DIV is per
hop), in batches: a batch is written, then its offsets are committed. Its faults:
- "drop": when partitions are revoked it commits the offsets of the records it has buffered
  and never writes them (zio-kafka's bug: a rebalance loses the buffer, the offsets say done);
- "duplicate": every `duplicate_every`-th batch is written twice before it is committed;
- `stall(seconds)`: it stops consuming without leaving its group, then resumes: a slow
  processor, whose records are late, not lost.
What it dropped and duplicated is kept, by source partition and offset, for the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.dev.demo import ensure_topic
from kdiv.dev.outage import Backoff, BrokerOutage, is_outage, retry
from kdiv.div.wire import Kind, readable_div_header
from kdiv.trace.propagate import forward
from kdiv.writer import DivWriter

log = logging.getLogger(__name__)

# A processor leaving gives its writer's END_OF_SEGMENTs this long.
_CLOSE_TIMEOUT_S = 10.0

FAULTS = ("none", "drop", "duplicate")


@dataclass
class ProcessorLedger:
    """Source records (partition, offset): how often each was written, which were dropped.

    A batch written and then not committed (a rebalance took the partition first) is read
    and written again by the next owner: a duplicate too, so counts, not flags, say which
    records were duplicated."""

    writes: Counter[tuple[int, int]] = field(default_factory=Counter)
    dropped: set[tuple[int, int]] = field(default_factory=set)
    # Written when the broker went away: they may or may not have landed (then written again).
    uncertain: set[tuple[int, int]] = field(default_factory=set)

    @staticmethod
    def merged(ledgers: Iterable[ProcessorLedger]) -> ProcessorLedger:
        """One ledger for a group's instances."""
        total = ProcessorLedger()
        for ledger in ledgers:
            total.writes.update(ledger.writes)
            total.dropped |= ledger.dropped
            total.uncertain |= ledger.uncertain
        return total

    @property
    def duplicated(self) -> set[tuple[int, int]]:
        return {at for at, count in self.writes.items() if count > 1}

    @property
    def lost(self) -> set[tuple[int, int]]:
        """Dropped and never written by any instance."""
        return {at for at in self.dropped if not self.writes[at]}


class FaultyProcessor:
    """source -> sink in batches, with one of FAULTS (see the module doc)."""

    def __init__(
        self,
        bootstrap: str,
        source: str,
        sink: str,
        group: str,
        *,
        fault: str = "none",
        batch_size: int = 100,
        linger_s: float = 0.5,
        duplicate_every: int = 5,
        security: KafkaSecurity = PLAINTEXT,
        name: str = "processor",
        outage: BrokerOutage | None = None,
    ) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {', '.join(FAULTS)}")
        self.bootstrap, self.source, self.sink, self.group = bootstrap, source, sink, group
        self.fault, self.batch_size, self.linger_s = fault, batch_size, linger_s
        self.duplicate_every = duplicate_every
        self.security = security
        self.name = name
        self.ledger = ProcessorLedger()
        self._buffer: list[ConsumerRecord] = []
        self._batches = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._writer: DivWriter | None = None
        self._task: asyncio.Task | None = None
        self._resume = asyncio.Event()
        self._resume.set()
        self._lock = asyncio.Lock()  # one of: a flush, a revocation
        self._stopped = False
        # Shared by a group's instances, so an outage is said once, not once per instance.
        self.outage = outage or BrokerOutage(name, log)
        self._backoff = Backoff()

    async def start(self) -> None:
        self._writer = await DivWriter.start(self.bootstrap, security=self.security)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id=self.name,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            **self.security.aiokafka_kwargs(),
        )
        self._consumer.subscribe([self.source], listener=_Revocation(self))
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-loop")

    async def stop(self) -> None:
        """Leave the group cleanly: what is buffered is written (or dropped) at the revocation."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()  # revokes: the fault applies to the buffer
        if self._writer is not None:
            try:
                await asyncio.wait_for(self._writer.close(), _CLOSE_TIMEOUT_S)
            except Exception as failed:
                if not is_outage(failed):
                    raise
                await self._abandon_writer()

    async def stall(self, seconds: float) -> None:
        """Stop taking records for `seconds` while staying in the group, then go on."""
        self._resume.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._resume.set()

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        loop = asyncio.get_running_loop()
        since = loop.time()
        while True:
            await self._resume.wait()
            try:
                fetched = await consumer.getmany(timeout_ms=100, max_records=self.batch_size)
                for records in fetched.values():
                    # The upstream writer's DIV control records are its bookkeeping, not data.
                    self._buffer.extend(r for r in records if not _is_div_control(r))
                if self._buffer and (len(self._buffer) >= self.batch_size or loop.time() - since >= self.linger_s):
                    async with self._lock:
                        await self._flush()
                    since = loop.time()
                    self.outage.ended()
                    self._backoff.reset()
            except Exception as failed:
                if not is_outage(failed):
                    raise
                self.outage.failed(failed)
                await self._backoff.sleep()

    async def _flush(self) -> None:
        """Write the buffer to the sink, then commit its offsets. A write the broker did not
        acknowledge is written again, with a new writer: the old one's records may or may not
        have landed, so its GUID writes nothing more (as a crashed processor's)."""
        batch, self._buffer = self._buffer, []
        if not batch:
            return
        self._batches += 1
        try:
            await self._write(batch)
        except Exception as failed:
            if not is_outage(failed):
                raise
            self.outage.failed(failed)
            self.ledger.uncertain.update((r.partition, r.offset) for r in batch)
            await self._rewrite(batch)
        if self.fault == "duplicate" and self._batches % self.duplicate_every == 0:
            await self._write(batch)
        try:
            await self._commit(batch)
        except KafkaError as failed:
            # The next owner reads the batch again: a duplicate the ledger's counts show.
            log.warning("%s: commit failed (%s); the batch will be processed again", self.name, failed)

    async def _rewrite(self, batch: list[ConsumerRecord]) -> None:
        """Write `batch` with a new writer once the broker is back."""
        while True:
            await self._abandon_writer()
            await self._backoff.sleep()
            try:
                self._writer = await DivWriter.start(self.bootstrap, security=self.security)
                await self._write(batch)
                return
            except Exception as failed:
                if not is_outage(failed):
                    raise
                self.outage.failed(failed)

    async def _abandon_writer(self) -> None:
        """Stop the writer without its END_OF_SEGMENTs: its segments stay open, as a crash leaves them."""
        abandoned, self._writer = self._writer, None
        if abandoned is not None:
            with contextlib.suppress(Exception):  # what it still holds failed with it
                await asyncio.wait_for(abandoned.producer.stop(), _CLOSE_TIMEOUT_S)

    async def _write(self, batch: list[ConsumerRecord]) -> None:
        writer = self._writer
        assert writer is not None
        sent = [await writer.send(self.sink, r.value, r.key, headers=forward(r.headers)) for r in batch]
        await writer.flush()
        # flush() waits without raising: a record the broker did not acknowledge fails its future.
        for outcome in await asyncio.gather(*sent, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        self.ledger.writes.update((r.partition, r.offset) for r in batch)

    async def _commit(self, batch: list[ConsumerRecord]) -> None:
        consumer = self._consumer
        assert consumer is not None
        ends: dict[TopicPartition, int] = {}
        for r in batch:
            tp = TopicPartition(r.topic, r.partition)
            ends[tp] = max(ends.get(tp, 0), r.offset + 1)
        await consumer.commit(ends)

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        """At a rebalance: the buffer is written and committed, or, with "drop", committed only."""
        async with self._lock:
            if self.fault == "drop":
                lost, self._buffer = self._buffer, []
                if lost:
                    try:
                        await self._commit(lost)
                    except KafkaError as failed:
                        # Not committed: the next owner reads them again, so nothing is lost.
                        log.warning("%s: commit at revocation failed (%s); buffer not lost", self.name, failed)
                        return
                    self.ledger.dropped.update((r.partition, r.offset) for r in lost)
                    log.warning("%s dropped %d buffered records at a rebalance", self.name, len(lost))
            else:
                await self._flush()


def _is_div_control(record: ConsumerRecord) -> bool:
    header = readable_div_header(record.headers)
    return header is not None and header.kind != Kind.DATA


class _Revocation(ConsumerRebalanceListener):
    def __init__(self, processor: FaultyProcessor) -> None:
        self.processor = processor

    async def on_partitions_revoked(self, revoked) -> None:
        await self.processor.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        pass


async def run_processors(
    bootstrap: str,
    source: str,
    sink: str,
    group: str,
    *,
    fault: str = "none",
    instances: int = 2,
    restart_every_s: float = 60.0,
    duration_s: float = 0.0,
    partitions: int = 4,
    security: KafkaSecurity = PLAINTEXT,
    replication_factor: int = 1,
    batch_size: int = 100,
    linger_s: float = 0.5,
) -> ProcessorLedger:
    """`instances` processors of one group, source -> sink; every `restart_every_s` (0: never)
    the oldest leaves and a new one joins: the rebalances at which "drop" loses its buffer.
    Runs `duration_s` (0: until cancelled); what all of them did, merged. Through a broker
    outage they keep retrying (said once when it starts, once when it ends)."""
    outage = BrokerOutage(f"kdiv processor {group}", log)
    backoff = Backoff()
    await retry(lambda: ensure_topic(bootstrap, sink, partitions, security, replication_factor), outage, backoff)
    running: list[FaultyProcessor] = []
    done: list[FaultyProcessor] = []
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def join(number: int) -> None:
        async def started() -> FaultyProcessor:
            processor = FaultyProcessor(
                bootstrap,
                source,
                sink,
                group,
                fault=fault,
                batch_size=batch_size,
                linger_s=linger_s,
                security=security,
                name=f"{group}-{number}",
                outage=outage,
            )
            try:
                await processor.start()
            except BaseException:
                await processor.stop()
                raise
            return processor

        running.append(await retry(started, outage, backoff))

    try:
        for number in range(max(instances, 1)):
            await join(number)
        for number in itertools.count(len(running)):
            wait = restart_every_s or float("inf")
            if duration_s:
                wait = min(wait, started + duration_s - loop.time())
            if wait == float("inf"):
                await asyncio.Event().wait()
            await asyncio.sleep(max(wait, 0.0))
            if duration_s and loop.time() - started >= duration_s:
                break
            leaving = running.pop(0)
            try:
                await leaving.stop()
            except Exception as failed:
                if not is_outage(failed):
                    raise
                outage.failed(failed)  # it is gone all the same
            done.append(leaving)
            await join(number)
            total = ProcessorLedger.merged(p.ledger for p in (*done, *running))
            log.info(
                "%s: %s restarted; so far %d records written, %d dropped, %d duplicated",
                group,
                leaving.name,
                sum(total.writes.values()),
                len(total.lost),
                len(total.duplicated),
            )
    finally:
        for processor in running:
            await processor.stop()
        done.extend(running)
    return ProcessorLedger.merged(p.ledger for p in done)
