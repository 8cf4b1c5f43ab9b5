"""The development broker, Apache Kafka in KRaft mode (kdiv.dev.broker): real JVM processes.

Start, serve, stop; three nodes with replication and a leader failover; a restart that
keeps its topics; the log cleaner compacting within seconds; one clear line when no Java
runtime or no jars are found; and the Tansu workarounds never firing on it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.producer import sender as aiokafka_sender

import kdiv.kafka.tansu as tansu_workarounds
from kdiv.config.settings import Settings
from kdiv.dev.broker import KafkaCluster, new_cluster_id
from kdiv.dev.ports import live_brokers
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.discovery import discover
from kdiv.kafka.topics import create_topic
from kdiv.maven import JARS_DIR_ENV, KAFKA_BROKER
from tests.conftest import run_coroutine
from tests.harness.broker import delete_topic, port_is_bindable

# alone: it measures how long the worker or a producer takes under a frozen or killed broker.
pytestmark = [pytest.mark.broker, pytest.mark.alone]

REPO_ROOT = Path(__file__).resolve().parents[2]
KDIV = [sys.executable, "-m", "kdiv"]


async def _produce(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]], **config) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await producer.start()
    try:
        for key, value in values:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) async for r in read_snapshot(bootstrap, topic)]


async def _create(bootstrap: str, topic: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await create_topic(admin, topic)
    finally:
        await admin.close()


def test_three_nodes_form_one_cluster_and_a_replicated_topic_survives_its_leaders_death(three_nodes):
    cluster = three_nodes
    hosts = [address.rsplit(":", 1) for address in cluster.bootstrap.split(",")]
    assert [int(port) for _, port in hosts] == [node.port for node in cluster.nodes]
    for node in cluster.nodes:
        seen = live_brokers("127.0.0.1", node.port)
        assert seen == (cluster.cluster_id, [1, 2, 3])
    assert len(set(cluster.pids)) == 3

    async def scenario() -> None:
        topic = "replicated"
        await _create(cluster.bootstrap, NewTopic(topic, 1, 3, topic_configs={"min.insync.replicas": "2"}))
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await admin.start()
        try:
            # Each node applies the new topic's metadata in its own time: ask until the one
            # answering has it.
            async with asyncio.timeout(30):
                while True:
                    (described,) = await admin.describe_topics([topic])
                    if described["partitions"]:
                        break
                    await asyncio.sleep(0.1)
            (partition,) = described["partitions"]
            assert sorted(partition["replicas"]) == [1, 2, 3]
            leader = partition["leader"]
        finally:
            await admin.close()

        written = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]
        await _produce(cluster.bootstrap, topic, written, acks="all")
        cluster.kill_node(leader)
        survivors = ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes if n.node_id != leader)

        admin = AIOKafkaAdminClient(bootstrap_servers=survivors)
        await admin.start()
        try:
            async with asyncio.timeout(30):
                while True:
                    try:
                        (described,) = await admin.describe_topics([topic])
                    except KafkaError:  # asked the dead node, which metadata still lists
                        described = {"partitions": [{"leader": -1}]}
                    new_leader = described["partitions"][0]["leader"]
                    if new_leader not in (-1, leader):
                        break
                    await asyncio.sleep(0.2)
        finally:
            await admin.close()
        # Every acknowledged record (acks=all) is still there, on the new leader.
        assert [(k, v) for _, k, v in await _read_all(survivors, topic)] == written

        cluster.start_node(leader)
        assert live_brokers("127.0.0.1", cluster.node(leader).port) == (cluster.cluster_id, [1, 2, 3])

    run_coroutine(scenario())


def test_a_cluster_with_a_data_dir_keeps_its_topics_across_a_restart(tmp_path):
    data_dir = tmp_path / "kafka"
    written = [(b"k", b"kept")]
    with KafkaCluster(port=0, data_dir=data_dir) as first:
        run_coroutine(_create(first.bootstrap, NewTopic("kept", 1, 1)))
        run_coroutine(_produce(first.bootstrap, "kept", written))
        cluster_id = first.cluster_id
    assert (data_dir / "node-1" / "data" / "meta.properties").is_file()

    with KafkaCluster(port=0, data_dir=data_dir) as second:
        assert second.cluster_id == cluster_id
        assert [(k, v) for _, k, v in run_coroutine(_read_all(second.bootstrap, "kept"))] == written


def test_a_cluster_id_starting_with_a_dash_is_formatted_as_an_id(monkeypatch):
    # One id in 64 starts with "-": the storage tool must not read it as an option.
    dashed = "-" + new_cluster_id()[1:]
    monkeypatch.setattr("kdiv.dev.broker.new_cluster_id", lambda: dashed)
    with KafkaCluster(port=0) as cluster:
        assert live_brokers("127.0.0.1", cluster.nodes[0].port) == (dashed, [1])


def test_a_node_whose_port_was_taken_before_it_bound_it_starts_on_new_ports(monkeypatch):
    """A free port is found by letting go of it: another process may bind it first. The
    cluster then starts again on new ports, once it finds the port taken."""
    import socket

    import kdiv.dev.broker as broker_module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real_free_port = broker_module.free_port
    handed = iter([taken.getsockname()[1]])
    monkeypatch.setattr(broker_module, "free_port", lambda host: next(handed, None) or real_free_port(host))
    try:
        with KafkaCluster(port=0) as cluster:
            assert cluster.nodes[0].port != taken.getsockname()[1]
            assert live_brokers("127.0.0.1", cluster.nodes[0].port) is not None
    finally:
        taken.close()


def test_the_log_cleaner_compacts_a_rolled_segment_within_seconds(bootstrap, topic_factory):
    topic = f"compacted-{os.getpid()}"

    async def scenario() -> list[tuple[int, bytes | None, bytes | None]]:
        config = {"cleanup.policy": "compact", "segment.ms": "100", "min.compaction.lag.ms": "0"}
        await _create(bootstrap, NewTopic(topic, 1, 1, topic_configs=config))
        await _produce(bootstrap, topic, [(f"k{i % 5}".encode(), f"v{i}".encode()) for i in range(50)])
        await asyncio.sleep(0.3)
        # A later record rolls the segment: only closed segments are cleaned.
        await _produce(bootstrap, topic, [(b"roll", b"roll")])
        async with asyncio.timeout(30):
            while True:
                records = await _read_all(bootstrap, topic)
                keys = [key for _, key, _ in records]
                if len(keys) == len(set(keys)):
                    return records
                await asyncio.sleep(0.5)

    try:
        records = run_coroutine(scenario())
    finally:
        run_coroutine(delete_topic(bootstrap, topic))
    latest = {key: value for _, key, value in records}
    assert latest == {**{f"k{i}".encode(): f"v{45 + i}".encode() for i in range(5)}, b"roll": b"roll"}
    # The latest value of every key survives, at its original offset.
    assert [offset for offset, key, _ in records if key != b"roll"] == list(range(45, 50))


def test_without_a_java_runtime_the_broker_fails_in_one_clear_line(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # kdiv runs from sys.executable; nothing else is on this PATH
    assert shutil.which("java", path=env["PATH"]) is None
    result = subprocess.run(
        [*KDIV, "broker", "--port", "0"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: no Java runtime (java not on the PATH, JAVA_HOME unset)")
    assert "kdiv broker --tansu" in lines[0]


def test_without_fetched_jars_the_broker_fails_in_one_clear_line_naming_the_fetch(tmp_path):
    env = {**os.environ, JARS_DIR_ENV: str(tmp_path / "empty-cache")}
    result = subprocess.run(
        [*KDIV, "broker", "--port", "0"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"Error: no kafka-broker {KAFKA_BROKER.version} jars in {tmp_path / 'empty-cache'}/"
        f"{KAFKA_BROKER.directory.name}: run `kdiv fetch-jars` once (it needs Maven and Maven Central)"
    )


def test_kdiv_broker_prints_where_it_listens_and_stops_cleanly_on_sigterm():
    process = subprocess.Popen(
        [*KDIV, "broker", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert live_brokers(host, int(port)) is not None

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        stderr = process.stderr.read() if process.stderr else ""
        assert f"Apache Kafka {KAFKA_BROKER.version} (KRaft, 1 node, cluster " in stderr
        assert f"listening on {address}" in stderr
        assert port_is_bindable(host, int(port))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


@pytest.fixture(scope="module")
def apache_kafka(bootstrap: str, broker_is_tansu: bool) -> Iterator[str]:
    """The session's broker when it is Apache Kafka, else one started for this module."""
    if not broker_is_tansu:
        yield bootstrap
    else:
        with KafkaCluster(port=0) as cluster:
            yield cluster.bootstrap


def test_tansu_workarounds_never_fire_on_apache_kafka(apache_kafka, monkeypatch, tmp_path):
    def fired(*args, **kwargs):
        raise AssertionError("a Tansu workaround ran against Apache Kafka")

    monkeypatch.delenv(tansu_workarounds.BROKER_FLAVOR_ENV, raising=False)
    monkeypatch.setattr(tansu_workarounds, "_ends_from_fetch", fired)
    monkeypatch.setattr(tansu_workarounds, "enable_tansu_producer_ids", fired)
    monkeypatch.setattr("kdiv.worker.service.enable_tansu_producer_ids", fired)
    own_init_pid_handler = aiokafka_sender.InitPIDHandler
    topic = f"no-workarounds-{os.getpid()}"

    async def scenario() -> None:
        assert not await tansu_workarounds.detect_tansu(apache_kafka)
        await _create(apache_kafka, NewTopic(topic, 2, 1))
        # Multi-record batches: where Tansu's ListOffsets fell short.
        producer = AIOKafkaProducer(bootstrap_servers=apache_kafka, linger_ms=50)
        await producer.start()
        try:
            sent = [producer.send(topic, f"v{i}".encode(), partition=i % 2) for i in range(100)]
            await asyncio.gather(*[await future for future in sent])
        finally:
            await producer.stop()
        assert len(await _read_all(apache_kafka, topic)) == 100

        consumer = AIOKafkaConsumer(bootstrap_servers=apache_kafka)
        await consumer.start()
        try:
            ends = await tansu_workarounds.end_offsets(
                consumer, [TopicPartition(topic, 0), TopicPartition(topic, 1)], tansu=False
            )
        finally:
            await consumer.stop()
        assert sorted(ends.values()) == [50, 50]

        settings = Settings.from_env({"KDIV_BOOTSTRAP": apache_kafka, "KDIV_TOPICS": topic})
        cluster = await discover(settings, wait_s=10, create_own=False)
        assert cluster.tansu is False

    try:
        run_coroutine(scenario())
        from kdiv.worker.service import build_app

        settings = Settings.from_env(
            {"KDIV_BOOTSTRAP": apache_kafka, "KDIV_TOPICS": topic, "KDIV_DATA_DIR": str(tmp_path / "data")}
        )
        app, _worker = build_app(settings, run_coroutine(discover(settings, wait_s=10, create_own=False)))
        assert [str(url) for url in app.conf.broker] == [f"kdiv://{apache_kafka}"]
        assert aiokafka_sender.InitPIDHandler is own_init_pid_handler
    finally:
        run_coroutine(delete_topic(apache_kafka, topic))
