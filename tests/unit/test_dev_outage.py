"""The dev stack's outage handling: said once when it starts and once when it ends, backoff,
which failures count as an outage, the reconcile loop's decisions, and stale broker directories."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)

from kdiv.dev.broker import PIDS_FILE, remove_stale_directories
from kdiv.dev.nightly import FAILED, NightlyLoop
from kdiv.dev.outage import Backoff, BrokerOutage, is_outage

LOGGER = "kdiv.test-outage"


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends(caplog):
    now = [1_700_000_000.0]
    outage = BrokerOutage("kdiv demo", logging.getLogger(LOGGER), clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger=LOGGER)

    outage.ended()  # no outage: nothing to say
    for _ in range(5):
        outage.failed(RequestTimedOutError())
        now[0] += 10
    assert outage.ongoing
    outage.ended()
    outage.ended()

    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("kdiv demo: broker unreachable since 2023-11-14T22:13:20.000Z (RequestTimedOutError")
    assert "retrying" in lines[0]
    assert lines[1] == (
        "kdiv demo: broker reachable again at 2023-11-14T22:14:10.000Z, after 50 s unreachable "
        "(5 failed attempts); resuming"
    )
    assert not outage.ongoing

    outage.failed(KafkaConnectionError("gone"))  # a second outage is said again
    assert len(caplog.records) == 3


def test_backoff_doubles_up_to_its_cap_and_starts_over_after_a_reset():
    backoff = Backoff(first_s=0.5, max_s=4.0)
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next() == 0.5


@pytest.mark.parametrize(
    ("failure", "outage"),
    [
        (RequestTimedOutError(), True),
        (KafkaTimeoutError(), True),
        (KafkaConnectionError("refused"), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (TopicAuthorizationFailedError(), False),  # retrying cannot mend it
        (ValueError("a bug"), False),
    ],
)
def test_only_failures_a_broker_away_causes_are_an_outage(failure, outage):
    assert is_outage(failure) is outage


def test_the_reconcile_loop_waits_out_an_outage_then_runs_and_retries_a_failed_run(caplog):
    answers = iter([False, False, False, True, True, True])
    runs: list[int] = []
    outcomes = iter([FAILED, 0])

    def run() -> int:
        runs.append(1)
        return next(outcomes)

    caplog.set_level(logging.INFO, logger="kdiv.reconcile-loop")
    loop = NightlyLoop(
        broker_up=lambda: next(answers),
        run=run,
        every_s=86400.0,
        retry_after_s=600.0,
        clock=lambda: 1_700_000_000.0,
        backoff=Backoff(first_s=1.0, max_s=2.0),
    )
    waits = [loop.step() for _ in range(5)]

    assert waits == [1.0, 2.0, 2.0, 600.0, 86400.0]
    assert len(runs) == 2
    lines = [record.getMessage() for record in caplog.records]
    assert [line.split(":")[1].strip().split(" ")[0:3] for line in lines] == [
        ["broker", "unreachable", "since"],
        ["broker", "reachable", "again"],
        ["the", "run", "failed"],
    ]


def _dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_a_stale_broker_directory_is_removed_only_when_all_its_processes_are_gone(tmp_path):
    dead = tmp_path / "kdiv-kafka-dead"
    alive = tmp_path / "kdiv-kafka-alive"
    unmarked = tmp_path / "kdiv-kafka-unmarked"
    foreign = tmp_path / "kdiv-kafka-foreign"
    other = tmp_path / "something-else"
    for directory in (dead, alive, unmarked, foreign, other):
        (directory / "node-1" / "data").mkdir(parents=True)
    (dead / PIDS_FILE).write_text(f"{_dead_pid()}\n{_dead_pid()}\n")
    # The owner is gone but a node still runs: its port and files are in use.
    (alive / PIDS_FILE).write_text(f"{_dead_pid()}\n{os.getpid()}\n")
    (foreign / PIDS_FILE).write_text("not a pid\n")
    (other / PIDS_FILE).write_text(f"{_dead_pid()}\n")

    assert remove_stale_directories(tmp_path) == [dead]

    assert not dead.exists()
    assert alive.exists() and unmarked.exists() and foreign.exists() and other.exists()


def test_a_zombie_counts_as_gone(tmp_path):
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stale = tmp_path / "kdiv-kafka-zombie"
        stale.mkdir()
        (stale / PIDS_FILE).write_text(f"{zombie.pid}\n")
        assert remove_stale_directories(tmp_path) == [stale]
    finally:
        zombie.wait()


def test_a_broker_that_refuses_the_credentials_or_certificates_is_no_outage():
    import ssl

    from aiokafka.errors import SaslAuthenticationFailed

    from kdiv.kafka.failures import BrokerRefused, refused_by_policy

    assert refused_by_policy(SaslAuthenticationFailed("bad password"))
    assert refused_by_policy(ssl.SSLError(1, "sslv3 alert bad certificate"))
    assert not refused_by_policy(ConnectionRefusedError(111, "Connection refused"))
    away = BrokerRefused("Kafka at 127.0.0.1:9: Connection refused")
    assert is_outage(away)
    refused = BrokerRefused("Kafka at 127.0.0.1:9: SASL authentication failed")
    refused.by_policy = True
    assert not is_outage(refused)
