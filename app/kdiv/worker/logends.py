"""Reading the true log ends of the assigned partitions, on a connection of its own, and
judging the worker's progress against them (`kdiv.worker.progress`).

The worker's own consumer knows only the high watermark of its last fetch, and a worker whose
fetches or commits wait says nothing through it: the log ends are read here, with ListOffsets
on a separate consumer, each read bounded by KDIV_BROKER_TIMEOUT_S. A stall is logged once when
it begins and once when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from kdiv.clock import iso_utc
from kdiv.config.settings import Settings
from kdiv.kafka.consume import standalone_consumer
from kdiv.kafka.tansu import end_offsets
from kdiv.worker.progress import Key, Progress

log = logging.getLogger("kdiv.worker")

# Errors of a broker that does not answer, or not in time: measured as "unknown", retried.
UNREACHABLE = (KafkaError, TimeoutError, OSError)
JUDGE_EVERY_S = 1.0


class LogEnds:
    """Every `progress_poll_s`: the assigned partitions, their true log starts and ends, and
    the stalls that began or ended."""

    def __init__(
        self,
        settings: Settings,
        progress: Progress,
        assigned: Callable[[], list[Key]],
        committed: Callable[[Key], int | None],
        clock: Callable[[], int],
        tansu: bool = False,
        paused: Callable[[], bool] = lambda: False,
        restoring: Callable[[], int | None] = lambda: None,
        en_route: Callable[[], Collection[Key]] = frozenset,
    ) -> None:
        self.settings = settings
        self.progress = progress
        self.assigned = assigned
        self.committed = committed
        self.clock = clock
        self.tansu = tansu
        # True while no progress is expected (the state's schema not registered yet).
        self.paused = paused
        # The changelog records left to restore, while the tables are restored (else None).
        self.restoring = restoring
        # The partitions whose records are on their way to the worker (`Progress.judge`).
        self.en_route = en_route
        self._consumer: AIOKafkaConsumer | None = None
        self._blind_logged = False

    async def run_forever(self) -> None:
        """Read the log ends, and judge the progress every second, until cancelled (the app's
        stop). Judging does not wait for a read: a read that hangs (the broker frozen) until
        its bound still leaves the stall said within KDIV_STALL_S."""
        judging = asyncio.ensure_future(self._judge_forever())
        try:
            while True:
                await asyncio.sleep(self.settings.progress_poll_s)
                await self.poll_once()
        finally:
            judging.cancel()
            await self.close()

    async def _judge_forever(self) -> None:
        while True:
            await asyncio.sleep(JUDGE_EVERY_S)
            self.judge()

    async def close(self) -> None:
        await self._drop_consumer()

    async def poll_once(self) -> None:
        """One measurement: log ends read, suspects looked at, stalls judged and logged."""
        now = self.clock()
        keys = self.assigned()
        progress = self.progress
        progress.assign(keys, now)
        for key in keys:
            progress.starts_at(key, self.committed(key), now)
        progress.restoring(self.restoring(), now)
        if self.paused():
            progress.hold(now)
        timeout = self.settings.broker_timeout_s
        try:
            consumer = await self._started()
            tps = [TopicPartition(topic, partition) for topic, partition in keys]
            ends = await asyncio.wait_for(end_offsets(consumer, tps, tansu=self.tansu), timeout) if tps else {}
            starts = await asyncio.wait_for(consumer.beginning_offsets(tps), timeout) if tps else {}
            progress.log_ends({(tp.topic, tp.partition): (starts.get(tp, 0), end) for tp, end in ends.items()}, now)
            for key, validated, end in progress.suspects(int(2 * self.settings.progress_poll_s * 1000), now):
                if await self._holds_no_record(consumer, key, validated, end):
                    progress.only_markers_before_end(key, now)
        except UNREACHABLE as error:
            progress.log_ends_failed(_describe(error, timeout), now)
            await self._drop_consumer()
        self.judge()

    def judge(self) -> None:
        """Judge the stalls now; one log line for the stalls begun and one for those ended,
        naming their partitions (a burst over 1,000 partitions stalls them all at once: one
        line, not a thousand)."""
        progress = self.progress
        now = self.clock()
        self._log_blindness(now)
        changes = progress.judge(now, self.en_route())
        began = [c for c in changes if c.began]
        ended = [c for c in changes if not c.began]
        if began:
            since = min(c.since_ms for c in began)
            log.warning(
                "validation stalled on %s since %s: %s records not validated, none validated for %.0f s",
                _named(began),
                iso_utc(since),
                sum(c.lag or 0 for c in began),
                (now - since) / 1000,
            )
        if ended:
            since = min(c.since_ms for c in ended)
            log.warning(
                "validation resumed on %s, stalled since %s (%.0f s)",
                _named(ended),
                iso_utc(since),
                (now - since) / 1000,
            )

    def _log_blindness(self, now: int) -> None:
        progress = self.progress
        if progress.measured_blind(now) and not self._blind_logged:
            self._blind_logged = True
            log.warning(
                "progress unknown: the log ends were last read at %s (%s); retrying",
                iso_utc(progress.blind_since_ms),
                progress.log_ends_error or "no answer yet",
            )
        elif not progress.measured_blind(now) and self._blind_logged:
            self._blind_logged = False
            log.warning("progress measured again: the log ends are read")

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = standalone_consumer(
                self.settings.bootstrap,
                security=self.settings.kafka_security,
                isolation_level="read_committed",
                request_timeout_ms=int(self.settings.broker_timeout_s * 1000),
                max_partition_fetch_bytes=64 * 1024,
            )
            try:
                await asyncio.wait_for(consumer.start(), self.settings.broker_timeout_s)
            except BaseException:
                await self._stop_quietly(consumer)
                raise
            self._consumer = consumer
        return self._consumer

    async def _drop_consumer(self) -> None:
        """Stop the consumer; the next read starts a new connection (after a failed read: a frozen one may never answer)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await self._stop_quietly(consumer)

    async def _stop_quietly(self, consumer: AIOKafkaConsumer) -> None:
        try:
            await asyncio.wait_for(consumer.stop(), self.settings.broker_timeout_s)
        except UNREACHABLE:
            pass  # a connection that does not close is dropped with the consumer

    async def _holds_no_record(self, consumer: AIOKafkaConsumer, key: Key, validated: int, end: int) -> bool:
        """True when [validated, end) holds no record a read_committed consumer reads: only
        transaction markers or aborted records, which no validation will ever move past."""
        tp = TopicPartition(*key)
        consumer.assign([tp])
        consumer.seek(tp, validated)
        timeout = self.settings.broker_timeout_s
        fetched = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=1000, max_records=1), timeout)
        if any(record.offset < end for record in fetched.get(tp, ())):
            return False
        position = await asyncio.wait_for(consumer.position(tp), timeout)
        return position >= end


# Partitions a stall line names at most; the rest are counted.
NAMED_AT_MOST = 20


def _named(changes: list) -> str:
    names = [f"{c.key[0]}[{c.key[1]}]" for c in changes[:NAMED_AT_MOST]]
    more = len(changes) - len(names)
    return ", ".join(names) + (f" and {more} more partitions" if more else "")


def _describe(error: BaseException, timeout: float) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g} s"
    return f"{type(error).__name__}: {error}"[:300]
