"""The wall clock, in the milliseconds Kafka timestamps use; injected wherever time matters."""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
