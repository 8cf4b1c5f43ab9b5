"""A test run that is stopped leaves none of the processes it started behind.

A child pytest session runs a test holding the session's broker, its registry and a worker,
and is stopped mid-test: by SIGTERM or SIGINT it tears its fixtures down (the broker's
temporary directory is removed, as only a clean stop does) and exits as interrupted; killed
outright, its children die with it. Its processes are found by a mark in their environment.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Not KDIV_*: workers are started without the caller's KDIV_* variables, and must carry it too.
MARK_ENV = "TEST_RUN_MARK"
READY_ENV = "TEST_RUN_READY_FILE"
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 90.0
# pytest's exit status for a run stopped by KeyboardInterrupt.
INTERRUPTED = 2

HELD_TEST = """
import os
import time
from pathlib import Path

from tests.harness.processes import WorkerProcess


def test_holds_a_broker_a_registry_and_a_worker(bootstrap, topic_factory, tmp_path):
    worker = WorkerProcess(
        "held", bootstrap=bootstrap, topics=[topic_factory()], app_id="kdiv-held", workdir=tmp_path
    ).start()
    Path(os.environ["TEST_RUN_READY_FILE"]).write_text(str(worker.pid))
    time.sleep(600)
"""

BROKER_DIRECTORY = re.compile(r"-Dlog4j2\.configurationFile=(\S*/kdiv-kafka-[^/\s]+)/log4j2\.yaml")


def marked_processes(mark: str) -> dict[int, str]:
    """Live (not zombie) processes whose environment carries `mark`, pid to command line."""
    wanted = f"{MARK_ENV}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if wanted in environment and state != "Z":
            found[int(entry.name)] = command
    return found


def wait_until_gone(mark: str, timeout: float) -> dict[int, str]:
    """The marked processes still there after `timeout` (none, once they are all gone)."""
    deadline = time.monotonic() + timeout
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_a_stopped_run_leaves_no_broker_registry_or_worker(tmp_path: Path, stop: signal.Signals) -> None:
    mark = uuid.uuid4().hex
    ready = tmp_path / "ready"
    (tmp_path / "test_held.py").write_text(HELD_TEST)
    env = {k: v for k, v in os.environ.items() if k not in ("KDIV_BOOTSTRAP", "KDIV_SCHEMA_REGISTRY_URL")}
    env |= {MARK_ENV: mark, READY_ENV: str(ready), "PYTHONPATH": f"{REPO / 'app'}{os.pathsep}{REPO}"}
    with open(tmp_path / "session.log", "wb") as log:
        session = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
            + ["--basetemp", str(tmp_path / "base"), str(tmp_path / "test_held.py")],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    output = tmp_path / "session.log"
    broker_directories: set[str] = set()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            assert session.poll() is None, f"the session ended before its test held:\n{output.read_text()}"
            assert time.monotonic() < deadline, f"the test did not start within {START_TIMEOUT_S} s"
            time.sleep(0.2)
        started = marked_processes(mark)
        commands = list(started.values())
        # The mark finds what the session started, so "none left" below means something.
        assert any(" kafka.Kafka " in c for c in commands), commands
        assert any("kdiv.cli registry" in c for c in commands), commands
        assert int(ready.read_text()) in started, commands
        broker_directories = {m.group(1) for c in commands if (m := BROKER_DIRECTORY.search(c))}
        assert broker_directories, commands

        session.send_signal(stop)
        try:
            status = session.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the session did not end within {STOP_TIMEOUT_S} s of {stop.name}:\n{output.read_text()}")
        left = wait_until_gone(mark, 15.0)
        assert not left, f"after {stop.name}, the session left {left}"
        if stop != signal.SIGKILL:
            assert status == INTERRUPTED, output.read_text()
            # Only the fixture's teardown removes the broker's directory: the stop was clean.
            assert not any(Path(d).exists() for d in broker_directories), output.read_text()
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        for directory in broker_directories:
            shutil.rmtree(directory, ignore_errors=True)  # what a killed session could not remove
