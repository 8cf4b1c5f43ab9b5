"""`kdiv reconcile-loop`: the development stack's nightly reconciliation, through broker outages.

Runs a command (`kdiv reconcile ...`) a while after start, then at every interval. Before each
run it asks the broker for its metadata: while the broker does not answer, it waits with
backoff, saying so once when the outage starts and once when it ends, and runs as soon as the
broker is back. A run that fails (exit status 2) is tried again after `retry_after_s`; a run
longer than `run_timeout_s` is killed and counts as failed.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Sequence

from kdiv.clock import iso_utc
from kdiv.dev.outage import Backoff
from kdiv.dev.ports import live_brokers

log = logging.getLogger("kdiv.reconcile-loop")

FAILED = 2  # kdiv's exit status for a failure (not a finding)
_KILL_AFTER_TERM_S = 10.0


def broker_answers(bootstrap: str) -> bool:
    """True when a broker of `bootstrap` (PLAINTEXT) answers a metadata request."""
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        if host and port.isdigit() and live_brokers(host.strip("[]"), int(port)):
            return True
    return False


def run_bounded(command: Sequence[str], timeout_s: float) -> int:
    """Run `command` (in this process group: honcho's SIGTERM reaches it too); its exit
    status, or FAILED when it ran past `timeout_s` and was stopped."""
    process = subprocess.Popen(list(command))
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("reconcile-loop: the run took over %.0f s: stopped", timeout_s)
        process.terminate()
        try:
            process.wait(_KILL_AFTER_TERM_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return FAILED


class NightlyLoop:
    """The loop's decisions; `broker_up`, `run`, `sleep` and `clock` are injected (tests)."""

    def __init__(
        self,
        *,
        broker_up: Callable[[], bool],
        run: Callable[[], int],
        every_s: float,
        retry_after_s: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
    ) -> None:
        self.broker_up, self.run, self.sleep, self.clock = broker_up, run, sleep, clock
        self.every_s, self.retry_after_s = every_s, retry_after_s
        self.backoff = backoff or Backoff(first_s=1.0, max_s=30.0)
        self.unreachable_since: float | None = None

    def step(self) -> float:
        """Run once if the broker answers; the seconds to wait before the next step."""
        if not self.broker_up():
            if self.unreachable_since is None:
                self.unreachable_since = self.clock()
                log.warning(
                    "reconcile-loop: broker unreachable since %s, retrying with backoff",
                    iso_utc(int(self.unreachable_since * 1000)),
                )
            return self.backoff.next()
        if self.unreachable_since is not None:
            log.warning(
                "reconcile-loop: broker reachable again after %.0f s unreachable; reconciling",
                self.clock() - self.unreachable_since,
            )
            self.unreachable_since = None
            self.backoff.reset()
        code = self.run()
        if code == FAILED:
            log.warning("reconcile-loop: the run failed (exit status %d); next try in %.0f s", code, self.retry_after_s)
            return self.retry_after_s
        return self.every_s

    def forever(self, first_after_s: float) -> None:
        self.sleep(first_after_s)
        while True:
            self.sleep(self.step())
