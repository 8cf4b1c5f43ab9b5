"""Riding out a broker outage in the development stack's processes.

A broker that stops answering (a long GC pause, a SIGSTOP, a restart) makes a write time
out after aiokafka's request timeout. The dev stack's writers treat that as an outage, not
a reason to exit (an exit would make honcho stop the whole stack): `BrokerOutage` says once
when it starts and once when it ends, and `Backoff` spaces the attempts in between.
`probe` asks a client's broker for its metadata, within a bound, to tell when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from kdiv.clock import iso_utc
from kdiv.kafka.failures import BrokerRefused, failure_text, refusals_explained

# A metadata request the broker does not answer within this is a broker still away.
PROBE_TIMEOUT_S = 5.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0

T = TypeVar("T")


def is_outage(failure: BaseException) -> bool:
    """True for a failure a broker that is away, slow or restarting causes (worth a retry);
    False for one that retrying cannot mend (a refused topic, bad credentials)."""
    if isinstance(failure, BrokerRefused) and failure.by_policy:
        return False  # the broker answered: credentials or certificates refused
    if isinstance(failure, (TimeoutError, ConnectionError, KafkaTimeoutError, KafkaConnectionError)):
        return True
    return isinstance(failure, KafkaError) and bool(getattr(failure, "retriable", False))


class Backoff:
    """Delays that double from `first_s` up to `max_s`; `reset` after a success."""

    def __init__(self, first_s: float = FIRST_DELAY_S, max_s: float = MAX_DELAY_S) -> None:
        self.first_s, self.max_s = first_s, max_s
        self._next = first_s

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.first_s

    async def sleep(self) -> None:
        await asyncio.sleep(self.next())


class BrokerOutage:
    """One line when an outage starts, one when it ends, none in between.

    `clock` gives wall-clock seconds (injected for the tests)."""

    def __init__(self, who: str, logger: logging.Logger, clock: Callable[[], float] = time.time) -> None:
        self.who = who
        self.logger = logger
        self.clock = clock
        self.since: float | None = None
        self.failures = 0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, failure: BaseException) -> None:
        self.failures += 1
        if self.since is None:
            self.since = self.clock()
            self.logger.warning(
                "%s: broker unreachable since %s (%s), retrying with backoff",
                self.who,
                iso_utc(int(self.since * 1000)),
                failure_text(failure),
            )

    def ended(self) -> None:
        if self.since is None:
            return
        now = self.clock()
        self.logger.warning(
            "%s: broker reachable again at %s, after %.0f s unreachable (%d failed attempts); resuming",
            self.who,
            iso_utc(int(now * 1000)),
            now - self.since,
            self.failures,
        )
        self.since = None
        self.failures = 0


async def probe(client: AIOKafkaClient, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise unless the client's brokers answer a metadata request within `timeout_s`."""
    await asyncio.wait_for(client.fetch_all_metadata(), timeout_s)


async def wait_until_back(client: AIOKafkaClient, outage: BrokerOutage, backoff: Backoff) -> None:
    """Probe with `backoff` until the broker answers (the outage's end is said by its first
    successful write, not here: a metadata answer alone does not prove writes work)."""
    while True:
        await backoff.sleep()
        try:
            await probe(client)
            return
        except Exception as failed:
            if not is_outage(failed):
                raise
            outage.failed(failed)


async def retry(attempt: Callable[[], Awaitable[T]], outage: BrokerOutage, backoff: Backoff) -> T:
    """`attempt()` until it succeeds, through an outage (a failure `is_outage` refuses is raised:
    a broker that refuses the credentials or certificates, told by `refusals_explained`)."""
    while True:
        try:
            with refusals_explained():
                result = await attempt()
        except Exception as failed:
            if not is_outage(failed):
                raise
            outage.failed(failed)
            await backoff.sleep()
            continue
        outage.ended()
        backoff.reset()
        return result
