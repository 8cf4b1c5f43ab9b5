"""Child processes that die with the process that started them.

A broker, registry or worker started by a test run or a dev command has nobody to stop it once
its owner is gone, and an owner killed outright (SIGKILL, an OOM kill) runs no cleanup. On
Linux the kernel can SIGKILL the child at that moment instead (prctl PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def dies_with_this_process() -> Callable[[], None] | None:
    """The `preexec_fn` for a `subprocess.Popen` whose child the kernel kills when this process
    dies, or None where that cannot be arranged.

    None off Linux, and None off the main thread: the kernel signals the child when the
    *thread* that started it ends, so a child started from a pool thread would be killed as
    soon as that thread finished, long before its owner.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    owner = os.getpid()

    def arm() -> None:
        # Runs in the child between fork and exec.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != owner:
            os._exit(1)  # the owner died before the signal was armed: nobody would stop this child

    return arm
