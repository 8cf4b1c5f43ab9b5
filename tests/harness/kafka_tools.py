"""Apache Kafka's command-line tools (kdiv.maven's kafka-tools bundle) run as Java processes,
with kdiv's producer interceptor (kdiv.maven.interceptor) on their classpath."""

from __future__ import annotations

import os
import subprocess

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
