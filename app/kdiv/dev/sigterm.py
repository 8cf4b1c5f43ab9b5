"""How the development stack's processes stop on SIGTERM, and how its servers wait for it.

honcho stops the stack by sending SIGTERM to every process group at once, the broker's
included, and SIGKILL to whatever is still running 5 s later. A goodbye to the broker
(END_OF_SEGMENTs, leaving a consumer group, a last flush) would wait on a broker that is
stopping at the same moment, and end in timeouts and tracebacks. So these processes stop as
a crashed one would, which is what the demo's writers and validators must tell apart anyway:
one line, exit status 0, at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType


def exit_at_sigterm(what: str) -> None:
    """From now on, SIGTERM makes this process say so in one line on stderr and exit 0 at once."""

    def stop(signum: int, frame: FrameType | None) -> None:
        sys.stderr.write(f"{what}: SIGTERM, stopping now\n")
        sys.stderr.flush()
        os._exit(0)  # no cleanup: every goodbye would wait on the broker

    signal.signal(signal.SIGTERM, stop)


def serve_until_signalled(
    start: Callable[[], object],
    announce: Callable[[], None],
    ended: Callable[[], Exception | None],
    stop: Callable[[], None],
) -> None:
    """For a CLI's development server: `start`, `announce`, serve until SIGINT or SIGTERM,
    then `stop` (also when it ended on its own: `ended` returns the error to raise then,
    looked at twice a second). Must run in the main thread, where Python delivers signals."""
    stop_requested = threading.Event()
    previous_handlers = {
        sig: signal.signal(sig, lambda signum, frame: stop_requested.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        start()
        announce()
        while not stop_requested.wait(0.5):
            error = ended()
            if error is not None:
                raise error
    finally:
        stop()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
