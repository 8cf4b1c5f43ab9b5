"""kdiv's Kafka Streams hop (java/streams-hop, built by `kdiv fetch-jars`) as a subprocess of a
test: started, SIGKILLed, restarted on the same state directory, stopped; its output in a file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from kdiv.dev.lifetime import dies_with_this_process
from kdiv.maven import java_executable
from kdiv.maven.project import STREAMS_HOP

MAIN_CLASS = "dev.kdiv.streams.StreamsHop"
RUNNING_LINE = "state RUNNING"


class StreamsHopProcess:
    """One instance of the application; each `start` is a new JVM on the same state directory."""

    def __init__(
        self,
        bootstrap: str,
        application_id: str,
        source: str,
        destination: str,
        workdir: Path,
        *,
        guarantee: str,
        drop_keys: tuple[str, ...] = (),
        properties: dict[str, str] | None = None,
    ) -> None:
        self.application_id = application_id
        self.log_path = workdir / f"{application_id}.log"
        classpath = os.pathsep.join(str(jar) for jar in STREAMS_HOP.classpath())
        java = java_executable("the Kafka Streams hop", "these tests cannot run")
        self.command = [java, "-Xmx256m", "-cp", classpath, MAIN_CLASS]
        self.command += ["--bootstrap", bootstrap, "--application-id", application_id]
        self.command += ["--source", source, "--destination", destination, "--processing-guarantee", guarantee]
        self.command += ["--state-dir", str(workdir / f"{application_id}-state")]
        if drop_keys:
            self.command += ["--drop-keys", ",".join(drop_keys)]
        for name, value in (properties or {}).items():
            self.command += ["--property", f"{name}={value}"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> StreamsHopProcess:
        assert not self.alive, f"{self.application_id} is already running"
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_this_process(),
            )
        return self

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def wait_running(self, timeout: float = 60.0) -> None:
        """Until this run says RUNNING (its first rebalance done); AssertionError past `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                if RUNNING_LINE.encode() in log.read():
                    return
            assert self.alive, f"{self.application_id} exited {self.proc and self.proc.returncode}:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"{self.application_id} not RUNNING in {timeout} s:\n{self.log_tail()}"
            await asyncio.sleep(0.2)

    def sigkill(self) -> None:
        assert self.alive, f"{self.application_id} died before it was killed:\n{self.log_tail()}"
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 40.0) -> int | None:
        """SIGTERM (Kafka Streams closes, committing); SIGKILL if it has not exited within `timeout`."""
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
