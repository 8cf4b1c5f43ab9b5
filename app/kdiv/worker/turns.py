"""The record path's share of the event loop.

The worker validates, encodes and writes on the event loop that also answers `/health`, the
page and `/metrics`, and runs the producer's sends. Work that does not give the loop a turn
delays every answer by its whole length, and an answer takes a few turns (accept, read,
handle, write): with 100 partitions in a fetch, stretches that were each short (a slice of
one partition's records, one partition's writes) added up to turns of 0.2-0.6 s, and
`/health` answered in up to 1.9 s. So the record path's loops ask one clock per event loop,
`Turns.pause_if_due`, between their steps: the loop gets a turn once the work since its last
one reaches `TURN_S`, whichever loop (validation, encoding, writing) is running then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from weakref import WeakKeyDictionary

# The record path's work between two turns of the event loop at most (give or take one step):
# an answer needing ten turns then waits about 50 ms behind it. At 1,000 partitions 5 ms gave
# /health a median of 59-62 ms against 91-131 ms at 10 ms; the p99 (0.1-0.4 s) and the burst's
# throughput were alike within the noise (each turn of the loop also runs the other tasks).
TURN_S = 0.005


class Turns:
    """Time spent since the event loop last had a turn given by the record path."""

    __slots__ = ("_clock", "_since", "budget_s")

    def __init__(self, budget_s: float = TURN_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = budget_s
        self._clock = clock
        self._since = clock()

    async def pause_if_due(self) -> bool:
        """Give the event loop a turn if the budget is spent; whether it had one."""
        if self._clock() - self._since < self.budget_s:
            return False
        await asyncio.sleep(0)
        self._since = self._clock()
        return True


_of_loop: WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = WeakKeyDictionary()


def loop_turns() -> Turns:
    """The running event loop's `Turns`: one budget whichever part of the worker spends it."""
    loop = asyncio.get_running_loop()
    turns = _of_loop.get(loop)
    if turns is None:
        turns = _of_loop[loop] = Turns(TURN_S)
    return turns
