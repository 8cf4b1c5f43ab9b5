"""Apache Kafka's command-line tools (kdiv.maven's kafka-tools bundle) run as Java processes,
with kdiv's producer interceptor (kdiv.maven.interceptor) on their classpath."""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import IO

from kdiv.maven import KAFKA_TOOLS, java_executable
from kdiv.maven.interceptor import INTERCEPTOR_CLASS, interceptor_jar

CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
# Bounds a tool's run; a run past it fails the caller (subprocess.TimeoutExpired).
TOOL_TIMEOUT_S = 180.0


def tool_command(main_class: str, *args: str, interceptor: bool = True) -> list[str]:
    """`java -cp <tools jars[, interceptor jar]> main_class args`."""
    jars = [str(jar) for jar in KAFKA_TOOLS.jars()]
    if interceptor:
        jars.append(str(interceptor_jar()))
    java = java_executable("Apache Kafka's tools", "these tests cannot run")
    return [java, "-Xmx256m", "-cp", os.pathsep.join(jars), main_class, *args]


def run_tool(
    main_class: str, *args: str, stdin: str = "", interceptor: bool = True, timeout: float = TOOL_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run a tool to its end; its output captured. CalledProcessError names its stderr's tail."""
    result = subprocess.run(
        tool_command(main_class, *args, interceptor=interceptor),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"{main_class} exited {result.returncode}: {result.stderr[-3000:]}")
    return result


def interceptor_properties() -> dict[str, str]:
    """The producer properties that put kdiv's interceptor on a producer."""
    return {"interceptor.classes": INTERCEPTOR_CLASS}


class ConsoleProducerProcess:
    """A console producer kept running, fed lines on its stdin: one producer (one GUID) that
    goes on writing across what a test does between its lines. Its stderr goes to a file, so
    a chatty producer never blocks on a full pipe; a context manager, so its JVM is always
    stopped (killed if it did not end by itself)."""

    def __init__(self, bootstrap: str, topic: str, **properties: str) -> None:
        args = ["--bootstrap-server", bootstrap, "--topic", topic]
        for name, value in {**interceptor_properties(), **properties}.items():
            args += ["--producer-property", f"{name}={value}"]
        self.command = tool_command(CONSOLE_PRODUCER, *args)
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr: IO[bytes] | None = None

    def __enter__(self) -> ConsoleProducerProcess:
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.stderr
        )
        return self

    def send(self, lines: list[str]) -> None:
        """Hand the producer `lines` (it sends each as a record as soon as it reads it)."""
        assert self.process is not None and self.process.stdin is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the console producer exited {self.process.returncode}: {self.stderr_tail()}")
        self.process.stdin.write("".join(line + "\n" for line in lines).encode())
        self.process.stdin.flush()

    def close(self, timeout: float = TOOL_TIMEOUT_S) -> None:
        """End of input: the producer flushes what it holds and exits, within `timeout`."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.close()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired as late:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(
                f"the console producer did not end within {timeout:.0f} s: {self.stderr_tail()}"
            ) from late
        if code != 0:
            raise AssertionError(f"the console producer exited {code}: {self.stderr_tail()}")

    def stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-3000:]

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self.stderr is not None:
            self.stderr.close()
