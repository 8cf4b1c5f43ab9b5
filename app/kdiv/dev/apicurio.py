"""Apicurio Registry in a child process: a real Schema Registry speaking Confluent's REST API.

It runs from the distribution `kdiv fetch-jars` unpacked (kdiv.maven's apicurio-registry),
with its default in-memory storage, so each start is an empty registry. Its Confluent API
lives under `/apis/ccompat/v7`; `.url` is that base URL, what KDIV_SCHEMA_REGISTRY_URL takes.

Apicurio's compatibility rule is off unless configured, while Confluent's default is
BACKWARD: the registry is set to BACKWARD once it answers, so it refuses what Confluent's
would. Ids differ in one way kdiv does not rely on: Confluent numbers a schema by its
canonical form, Apicurio by its text, so the same schema written otherwise (other
whitespace, say) is another id when registered under another subject.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from kdiv import maven
from kdiv.dev.lifetime import dies_with_this_process
from kdiv.dev.ports import BrokerError, ensure_port_free, free_port, host_for_address, wait_or_kill
from kdiv.dev.sigterm import serve_until_signalled
from kdiv.maven import APICURIO_REGISTRY, JarsError

CCOMPAT_PATH = "/apis/ccompat/v7"
_READY_POLL_INTERVAL_S = 0.2
_OUTPUT_TAIL_BYTES = 4000
_CONFLUENT_DEFAULT_COMPATIBILITY = "BACKWARD"


class ApicurioError(RuntimeError):
    """Apicurio Registry could not be found or started."""


def java_executable() -> str:
    """The Java runtime the registry runs on; ApicurioError in one line when there is none."""
    try:
        return maven.java_executable("Apicurio Registry", "`kdiv registry` runs kdiv's development registry")
    except maven.JavaMissing as missing:
        raise ApicurioError(str(missing)) from None


class ApicurioRegistry:
    """Apicurio Registry on `host:port` (`port=0`: a free one, chosen at start).

    Use as a context manager, or `start()` and `stop()`.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, heap: str = "256m") -> None:
        self.host = host
        self.port = port
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None
        self._directory: Path | None = None
        self._output: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL."""
        if self.port == 0:
            raise ApicurioError("the registry's port is chosen at start(); start it first")
        return f"http://{host_for_address(self.host)}:{self.port}{CCOMPAT_PATH}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> ApicurioRegistry:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0, *, inherit_output: bool = False) -> ApicurioRegistry:
        """Start the registry and return once it answers, set to BACKWARD compatibility."""
        if self.running:
            raise ApicurioError(f"Apicurio Registry on {self.url} is already started")
        java = java_executable()
        try:
            home = APICURIO_REGISTRY.home()
        except JarsError as missing:
            raise ApicurioError(str(missing)) from None
        runner = home / f"apicurio-registry-app-{APICURIO_REGISTRY.version}-runner.jar"
        if not runner.is_file():
            raise ApicurioError(f"{home} holds no {runner.name}: run `kdiv fetch-jars` again after removing {home}")
        try:
            if self.port == 0:
                self.port = free_port(self.host)
            else:
                ensure_port_free(self.host, self.port)
        except BrokerError as taken:
            raise ApicurioError(str(taken)) from None
        self._directory = Path(tempfile.mkdtemp(prefix="kdiv-apicurio-"))
        if inherit_output:
            output: int | IO[bytes] = sys.stderr.fileno()
        else:
            # A file, not a pipe: nobody drains a pipe while the registry runs.
            self._output = open(self._directory / "registry.log", "ab")  # noqa: SIM115 - open while it runs
            output = self._output
        command = [
            java,
            f"-Xmx{self.heap}",
            "-Djava.awt.headless=true",
            f"-Dquarkus.http.host={self.host}",
            f"-Dquarkus.http.port={self.port}",
            # Like Confluent's: a schema written with other whitespace is found under its
            # subject (register answers its id, no new version) instead of being another.
            "-Dregistry.ccompat.use-canonical-hash=true",
            "-Dquarkus.log.level=WARN",
            "-jar",
            str(runner),
        ]
        try:
            self.process = subprocess.Popen(
                command,
                cwd=self._directory,
                # Its own log level (its audit log writes a line per request at INFO).
                env={**os.environ, "REGISTRY_LOG_LEVEL": "WARN"},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C meant for us must not kill the registry before stop().
                start_new_session=True,
                # Nobody would stop it once we are gone, even killed outright.
                preexec_fn=dies_with_this_process(),
            )
        except OSError as exc:
            self.stop()
            raise ApicurioError(f"cannot run {java}: {exc}") from exc
        try:
            self._wait_until_serving(timeout)
            self._set_compatibility(_CONFLUENT_DEFAULT_COMPATIBILITY)
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)  # no orphan JVM if the caller forgets
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the registry (SIGTERM, then SIGKILL after `timeout`). Idempotent."""
        atexit.unregister(self.stop)
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            wait_or_kill(process, timeout)
        if self._output is not None:
            self._output.close()
            self._output = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def run_forever(self) -> None:
        """For a CLI: start, print the base URL, serve until SIGINT/SIGTERM, stop.

        The URL goes alone to stdout (scripts read it); the registry's log goes to stderr.
        Must run in the main thread, where Python delivers signals.
        """

        def announce() -> None:
            print(self.url, flush=True)
            print(
                f"Apicurio Registry {APICURIO_REGISTRY.version} (in memory, compatibility "
                f"{_CONFLUENT_DEFAULT_COMPATIBILITY}) serving Confluent's API at {self.url}. Ctrl-C to stop.",
                file=sys.stderr,
                flush=True,
            )

        def ended() -> Exception | None:
            if self.running:
                return None
            code = self.process.returncode if self.process is not None else None
            return ApicurioError(f"Apicurio Registry on port {self.port} exited unexpectedly ({code})")

        serve_until_signalled(lambda: self.start(inherit_output=True), announce, ended, self.stop)

    def output_tail(self) -> str:
        if self._directory is None:
            return ""
        try:
            with open(self._directory / "registry.log", "rb") as output:
                size = output.seek(0, os.SEEK_END)
                output.seek(max(0, size - _OUTPUT_TAIL_BYTES))
                return output.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _wait_until_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                code = self.process.returncode if self.process is not None else None
                raise ApicurioError(
                    f"Apicurio Registry exited with code {code} before serving on port {self.port}"
                    + _quoted(self.output_tail())
                )
            try:
                self._request("GET", "/subjects")
                return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or still starting
            if time.monotonic() >= deadline:
                raise ApicurioError(
                    f"Apicurio Registry on {self.url} did not answer within {timeout:.0f} s"
                    + _quoted(self.output_tail())
                )
            time.sleep(_READY_POLL_INTERVAL_S)

    def _set_compatibility(self, level: str) -> None:
        try:
            answer = self._request("PUT", "/config", {"compatibility": level})
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ApicurioError(f"Apicurio Registry on {self.url} did not take compatibility {level}: {exc}") from None
        if not isinstance(answer, dict) or answer.get("compatibility") != level:
            raise ApicurioError(f"Apicurio Registry on {self.url} answered {answer!r} to compatibility {level}")

    def _request(self, method: str, path: str, body: object = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read() or b"null")


def _quoted(tail: str) -> str:
    return f"; its output ends with:\n{tail}" if tail else ""
