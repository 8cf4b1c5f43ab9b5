"""The development stack through a broker outage and at its stop, with real processes.

A real Apache Kafka frozen with SIGSTOP for longer than the clients' request timeout (40 s)
under the dev registry, the demo writer, the changefeed writer and the pipeline hop: each
keeps running, says once that the broker is unreachable and once that it is back, and writes
again after SIGCONT. Then honcho's stop: SIGTERM to each process group, an exit within
honcho's 5 s in a line or two. `kdiv broker` killed outright leaves its directory to the
next start, which removes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.dev.broker import PIDS_FILE, KafkaCluster
from kdiv.dev.nightly import broker_answers
from tests.harness.broker import exact_end_offsets, port_is_bindable
from tests.harness.processes import free_port

# alone: it measures how long the worker or a producer takes under a frozen or killed broker.
pytestmark = [pytest.mark.broker, pytest.mark.alone]

# Longer than aiokafka's request timeout (40 s): the writes in flight time out.
FREEZE_S = 50.0
# honcho SIGKILLs what is still running this long after its SIGTERM.
HONCHO_KILL_WAIT_S = 5.0
UNREACHABLE = "broker unreachable since"
REACHABLE = "broker reachable again"
SCHEMA = json.dumps({"type": "record", "name": "probe", "fields": [{"name": "n", "type": "long"}]})


class StackProcess:
    """One `kdiv ...` command in its own process group (as honcho runs it), output to a file."""

    def __init__(self, name: str, args: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - open while the process runs
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kdiv.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.process.poll() is None

    def terminate_group(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)

    def kill_group(self) -> None:
        if self.running():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()


def _post(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _register(registry: str, subject: str, timeout: float = 60.0) -> tuple[int, dict]:
    return _post(f"{registry}/subjects/{subject}/versions", {"schema": SCHEMA}, timeout)


def _wait_for(what: str, condition, timeout: float, stack: list[StackProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for process in stack:
            assert process.running(), f"{process.name} exited ({process.process.returncode}):\n{process.log()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.5)


def _total(bootstrap: str, topic: str) -> int:
    """Records written to `topic` so far; 0 before it exists (asked without creating it: a
    consumer's metadata request would have the broker create it with one partition)."""

    async def total() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            if topic not in await admin.list_topics():
                return 0
        finally:
            await admin.close()
        return sum((await exact_end_offsets(bootstrap, topic)).values())

    return asyncio.run(total())


def test_the_dev_stack_rides_out_a_frozen_broker_and_stops_quietly_on_sigterm(tmp_path):
    cluster = KafkaCluster(port=0).start()
    stack: list[StackProcess] = []
    try:
        bootstrap = cluster.bootstrap
        registry_url = f"http://127.0.0.1:{free_port()}"
        registry = StackProcess(
            "registry", ["registry", "--bootstrap", bootstrap, "--port", registry_url.rsplit(":", 1)[1]], tmp_path
        )
        stack.append(registry)

        def registry_answers() -> bool:
            try:
                with urllib.request.urlopen(f"{registry_url}/subjects", timeout=1):
                    return True
            except OSError:
                return False

        _wait_for("the registry answers", registry_answers, 60, stack)
        common = ["--bootstrap", bootstrap]
        stack += [
            StackProcess(
                "demo",
                ["demo", *common, "--topic", "outage-demo", "--partitions", "2", "--rate", "20"]
                + ["--fault-every", "1", "--restart-every", "0", "--writers", "2"],
                tmp_path,
            ),
            StackProcess(
                "changefeed",
                ["changefeed-demo", *common, "--topic", "outage-cdc", "--partitions", "1", "--rate", "10"],
                tmp_path,
                env={"KDIV_SCHEMA_REGISTRY_URL": registry_url},
            ),
        ]
        # The hop subscribes to the demo's topic: were it first, the broker would create it
        # with one partition, not the demo's two.
        _wait_for("the demo writing", lambda: _total(bootstrap, "outage-demo") > 0, 60, stack)
        stack.append(
            StackProcess(
                "processor",
                ["processor", "outage-demo", "outage-enriched", *common, "--group", "outage-hop"]
                + ["--instances", "1", "--restart-every", "0", "--partitions", "2"],
                tmp_path,
            )
        )
        topics = ["outage-demo", "outage-cdc", "outage-enriched"]
        _wait_for("every topic written", lambda: all(_total(bootstrap, t) > 0 for t in topics), 90, stack)

        lines_before = {p.name: p.log().count("\n") for p in stack}
        cluster.pause_node(1)
        frozen_at = time.monotonic()
        # A registration while the broker is frozen: an error naming the timeout, not a hang.
        during: dict[str, tuple[int, dict]] = {}
        registering = threading.Thread(
            target=lambda: during.setdefault("answer", _register(registry_url, "during-outage", timeout=90))
        )
        registering.start()
        # The reconcile loop's question before a run: no answer from a frozen broker.
        assert not broker_answers(bootstrap)
        while time.monotonic() - frozen_at < FREEZE_S:
            for process in stack:
                assert process.running(), f"{process.name} exited during the outage:\n{process.log()[-3000:]}"
            time.sleep(1)
        cluster.resume_node(1)
        registering.join(60)
        status, body = during["answer"]
        assert (status, body["error_code"]) == (500, 50002), body

        time.sleep(5)  # what was held during the freeze lands; growth after this is new writing
        after_thaw = {topic: _total(bootstrap, topic) for topic in topics}
        for topic in topics:
            _wait_for(
                f"{topic} written again after the thaw",
                lambda topic=topic: _total(bootstrap, topic) > after_thaw[topic] + 5,
                90,
                stack,
            )
        status, body = _register(registry_url, "after-outage")
        assert status == 200, body
        assert broker_answers(bootstrap)

        for process in stack:
            log = process.log()
            starts, ends = log.count(UNREACHABLE), log.count(REACHABLE)
            grown = log.count("\n") - lines_before[process.name]
            print(f"{process.name}: {starts} outage start, {ends} end, {grown} lines since the freeze")
            if process.name == "processor":
                # Its writes are bursts after the demo's: it may have had none in flight.
                assert starts == ends <= 1, log[-3000:]
            else:
                assert (starts, ends) == (1, 1), log[-3000:]
        demo_log = stack[1].log()
        # The demo's write that timed out may or may not have landed: its producer is retired.
        assert "treated as crashed, new producer" in demo_log

        # honcho's stop: SIGTERM to every group at once; each gone well before its SIGKILL.
        lines_at_stop = {p.name: p.log().count("\n") for p in stack}
        for process in stack:
            process.terminate_group()
        for process in stack:
            process.process.wait(HONCHO_KILL_WAIT_S)
            said = process.log().splitlines()[lines_at_stop[process.name] :]
            assert process.process.returncode == 0, said
            assert len(said) <= 2, said
    finally:
        for process in stack:
            process.kill_group()
        cluster.stop()


def _broker(tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as output:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "kdiv.cli", "broker", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=output,
            env={**os.environ, "TMPDIR": str(tmp_path)},
            start_new_session=True,
        )


def test_kdiv_broker_killed_outright_leaves_its_directory_to_the_next_start_and_stops_cleanly_on_sigterm(tmp_path):
    log = tmp_path / "broker.log"
    first = _broker(tmp_path, log)
    try:
        assert first.stdout is not None
        host, port = first.stdout.readline().decode().strip().rsplit(":", 1)
        (directory,) = tmp_path.glob("kdiv-kafka-*")
        pids = [int(line) for line in (directory / PIDS_FILE).read_text().split()]
        assert pids[0] == first.pid and len(pids) == 2  # kdiv broker, then its node

        first.kill()  # what honcho does 5 s after its SIGTERM
        first.wait()
        # Its node dies with it (it held the port), but nothing removed the directory.
        deadline = time.monotonic() + 20
        while not port_is_bindable(host, int(port)):
            assert time.monotonic() < deadline, "the killed broker's node still holds its port"
            time.sleep(0.2)
        assert directory.exists()
    finally:
        if first.poll() is None:
            first.kill()

    second = _broker(tmp_path, log)
    try:
        assert second.stdout is not None
        assert second.stdout.readline().strip()
        (own,) = tmp_path.glob("kdiv-kafka-*")  # the stale one removed, its own made
        assert own != directory
        lines_before = log.read_text().count("\n")

        os.killpg(second.pid, signal.SIGTERM)
        second.wait(HONCHO_KILL_WAIT_S)
        assert second.returncode == 0
        assert not own.exists()
        said = log.read_text().splitlines()[lines_before:]
        print("\n".join(said))
    finally:
        if second.poll() is None:
            second.kill()
