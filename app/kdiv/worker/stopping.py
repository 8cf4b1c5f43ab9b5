"""A stop that always ends: once the app begins to stop (SIGTERM, or a crash), the process exits
within KDIV_STOP_TIMEOUT_S, broker or not.

Faust's stop waits for its streams, the last commit and the producer's flush, each for as long
as the broker takes, which is for ever when the broker is gone or frozen. A thread of its own
watches for the stop, so a blocked event loop cannot hold it back either. Exiting without the
last commit is safe: what was not committed is read and validated again by the next owner
(the unit of work's crash protocol, docs/worker.md#what-survives-a-crash).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("kdiv.worker")

POLL_S = 0.2


def exit_when_stop_overruns(
    stopping: Callable[[], bool], timeout_s: float, exit_now: Callable[[int], None] = os._exit
) -> threading.Thread:
    """Watch `stopping`; `timeout_s` after it first holds, exit the process (status 0: the stop
    was asked for) with one line. A daemon thread: a stop that finishes in time is not held."""

    def watch() -> None:
        while not stopping():
            time.sleep(POLL_S)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
        log.warning(
            "stop not finished within %g s (KDIV_STOP_TIMEOUT_S): exiting now; what was not committed "
            "is validated again by the next owner",
            timeout_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        exit_now(0)

    thread = threading.Thread(target=watch, name="kdiv-stop-deadline", daemon=True)
    thread.start()
    return thread
