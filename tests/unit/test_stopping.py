"""A stop that overruns its bound ends the process; one that does not is left alone."""

from __future__ import annotations

import threading
import time

from kdiv.worker.stopping import exit_when_stop_overruns


def test_a_stop_that_overruns_exits_after_the_bound_with_status_0():
    stopping = threading.Event()
    exited: list[tuple[int, float]] = []
    done = threading.Event()

    def exit_now(status: int) -> None:
        exited.append((status, time.monotonic()))
        done.set()

    exit_when_stop_overruns(stopping.is_set, 0.5, exit_now)
    time.sleep(0.5)
    assert not exited  # not stopping: nothing happens
    began = time.monotonic()
    stopping.set()
    assert done.wait(10)
    status, at = exited[0]
    assert status == 0 and at - began >= 0.5


def test_the_watch_is_a_daemon_thread_that_never_holds_the_process():
    thread = exit_when_stop_overruns(lambda: False, 0.1, lambda status: None)
    assert thread.daemon and thread.is_alive()
