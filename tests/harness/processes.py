"""Worker processes for the tests: started, SIGKILLed, stopped, their logs read."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kdiv.dev.lifetime import dies_with_this_process

REPO = Path(__file__).resolve().parents[2]

# kdiv.worker.incident_log's lines: an incident ("CLASS (severity) at topic[p]@offset producer
# ..."), or the end of a producer's run of them ("N CLASS incidents at topic[p] offsets a..b").
INCIDENT_LINE = re.compile(
    r"\b[A-Z_]+ \((fatal|warning)\) at \S+\[\d+\]@\d+ producer |\b\d+ [A-Z_]+ incidents at \S+\[\d+\] offsets "
)


FAUST = str(Path(sys.executable).with_name("faust"))


READY_LINE = "[^Worker]: Ready"


_START_MARK = "=== kdiv-test: start #"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_registry_url() -> str | None:
    return None


# Where workers find the Schema Registry they use unless given one: conftest points it at
# the session's, which starts when it is first asked for.
registry_url_source: Callable[[], str | None] = no_registry_url


class WorkerProcess:
    """One `faust -A kdiv.worker.main worker` subprocess; its log accumulates across restarts."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        topics: Iterable[str],
        app_id: str,
        workdir: Path,
        web_port: int | None = None,
        session_timeout_s: float = 3.0,
        heartbeat_interval_s: float = 0.3,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.topics = tuple(topics)
        self.app_id = app_id
        self.data_dir = Path(workdir) / name / "data"
        self.log_path = Path(workdir) / f"{name}.log"
        self.web_port = web_port
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0
        self._log_offset = 0  # where the current run's output starts in the log file

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.web_port}" if self.web_port else None

    def environment(self) -> dict[str, str]:
        # Nothing KDIV_* from the caller's environment, except the broker flavour override.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KDIV_") or k == "KDIV_BROKER_FLAVOR"}
        env.update(
            PYTHONUNBUFFERED="1",
            KDIV_BOOTSTRAP=self.bootstrap,
            KDIV_TOPICS=",".join(self.topics),
            KDIV_APP_ID=self.app_id,
            KDIV_DATA_DIR=str(self.data_dir),
            KDIV_SESSION_TIMEOUT_S=str(self.session_timeout_s),
            KDIV_HEARTBEAT_INTERVAL_S=str(self.heartbeat_interval_s),
        )
        # Only asked when needed: asking may start the session's registry.
        registry_url = None if "KDIV_SCHEMA_REGISTRY_URL" in self.extra_env else registry_url_source()
        if registry_url:
            env["KDIV_SCHEMA_REGISTRY_URL"] = registry_url
        if self.web_port:
            env.update(KDIV_WEB_ENABLED="true", KDIV_WEB_PORT=str(self.web_port), KDIV_WEB_HOST="127.0.0.1")
        else:
            env["KDIV_WEB_ENABLED"] = "false"
        env.update(self.extra_env)
        return env

    @property
    def _running(self) -> subprocess.Popen:
        """The process of the current (or last) run."""
        assert self.proc is not None, f"worker {self.name} was never started"
        return self.proc

    def start(self) -> WorkerProcess:
        if self.alive:
            raise RuntimeError(f"worker {self.name} is already running (pid {self.pid})")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n{_START_MARK}{self.starts} at {time.time():.3f} ===\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                [FAUST, "-A", "kdiv.worker.main", "worker", "-l", "info"],
                cwd=REPO,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_this_process(),
            )
        self.started_at = time.monotonic()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def sigkill(self) -> float:
        """SIGKILL the worker and reap it; returns the monotonic time of the kill."""
        if not self.alive:
            raise AssertionError(f"worker {self.name} died before it was killed:\n{self.log_tail()}")
        killed_at = time.monotonic()
        self._running.send_signal(signal.SIGKILL)
        self._running.wait(timeout=10)
        self._note(f"SIGKILL at {time.time():.3f} (ready: {self.ready})")
        return killed_at

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a clean Faust shutdown); SIGKILL if it does not end within `timeout`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def cry(self) -> None:
        """Ask the worker to log the stack of every thread and asyncio task (mode's SIGUSR1)."""
        if self.alive:
            self._note(f"SIGUSR1 at {time.time():.3f}: stacks follow")
            self._running.send_signal(signal.SIGUSR1)

    def restart(self, keep_data: bool = True) -> WorkerProcess:
        """Start again after a kill or stop; without its data dir the state comes from the changelog."""
        if self.alive:
            raise RuntimeError(f"worker {self.name} is still running")
        if not keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self._note(f"restart {'keeping' if keep_data else 'deleting'} the data dir")
        return self.start()

    def _note(self, text: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\n=== kdiv-test: {text} ===\n")

    # -- the log -----------------------------------------------------------------------------

    def log_text(self, current_run_only: bool = False) -> str:
        try:
            with open(self.log_path, "rb") as log:
                if current_run_only:
                    log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return f"--- {self.log_path} (last {lines} lines) ---\n" + "\n".join(self.log_text().splitlines()[-lines:])

    @property
    def ready(self) -> bool:
        """The current run has logged Faust's "Worker: Ready" (recovery done, streams running)."""
        return READY_LINE in self.log_text(current_run_only=True)

    async def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds from the (re)start until the worker is ready."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if not self.alive:
                raise AssertionError(f"worker {self.name} exited with {self._running.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")
            await asyncio.sleep(0.05)
        return time.monotonic() - self.started_at

    def problems(self) -> list[str]:
        """Log lines that show the worker misbehaving (tracebacks, errors, crashes); a fatal
        incident's line is at ERROR too, and is the worker doing its job."""
        return [
            line
            for line in self.log_text().splitlines()
            if ("Traceback" in line or "[ERROR]" in line or "[CRITICAL]" in line) and not INCIDENT_LINE.search(line)
        ]

    def incident_lines(self) -> list[str]:
        """The lines kdiv.worker.incident_log wrote: one per incident, or per run of them."""
        return [line for line in self.log_text().splitlines() if INCIDENT_LINE.search(line)]
