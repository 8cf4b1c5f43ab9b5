"""The development Schema Registry as a child process (`kdiv registry`), for tests and benchmarks."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from kdiv.dev.lifetime import dies_with_this_process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DevRegistryProcess:
    def __init__(
        self, bootstrap: str, topic: str = "_schemas", port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        # The registry's environment (KDIV_SECURITY_PROTOCOL and the like); default: ours.
        self.env = env
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> DevRegistryProcess:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kdiv.cli",
                "registry",
                "--bootstrap",
                self.bootstrap,
                "--port",
                str(self.port),
                "--topic",
                self.topic,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
            preexec_fn=dies_with_this_process(),
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.process.stderr.read().decode()[-2000:] if self.process.stderr else ""
                raise RuntimeError(f"dev registry exited {self.process.returncode}: {output}")
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=1):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"dev registry on {self.url} did not answer within {timeout_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> DevRegistryProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
