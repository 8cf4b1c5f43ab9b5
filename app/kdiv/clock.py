"""The wall clock, in the milliseconds Kafka timestamps use; injected wherever time matters."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# The times a view or report renders as a date: from the epoch to the end of year 9999 (what
# Python's datetime holds). A producer clock gone wrong, or one writing microseconds, gives
# numbers past it; they are shown as numbers, never parsed as dates.
LAST_RENDERABLE_MS = 253_402_300_799_999


def renderable_ms(ms: object) -> bool:
    """True when `ms` is an int in 0..LAST_RENDERABLE_MS (booleans are not times)."""
    return isinstance(ms, int) and not isinstance(ms, bool) and 0 <= ms <= LAST_RENDERABLE_MS


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_utc(ms: int | None) -> str | None:
    """ms since the epoch as ISO 8601 UTC ("...Z"); None for none (-1 or less: not known) and
    for a time no date can show (`renderable_ms`), whose raw number a view gives beside it."""
    if not renderable_ms(ms):
        return None
    moment = _EPOCH + timedelta(milliseconds=ms)  # type: ignore[arg-type]
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
