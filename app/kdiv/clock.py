"""The wall clock, in the milliseconds Kafka timestamps use; injected wherever time matters."""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# The times a view or report renders as a date: from the epoch to the end of year 9999 (what
# Python's datetime holds). A producer clock gone wrong, or one writing microseconds, gives
# numbers past it; they are shown as numbers, never parsed as dates.
LAST_RENDERABLE_MS = 253_402_300_799_999


def renderable_ms(ms: object) -> bool:
    """True when `ms` is an int in 0..LAST_RENDERABLE_MS (booleans are not times)."""
    return isinstance(ms, int) and not isinstance(ms, bool) and 0 <= ms <= LAST_RENDERABLE_MS
