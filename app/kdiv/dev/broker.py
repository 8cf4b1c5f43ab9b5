"""The development broker: Apache Kafka in KRaft mode, from the jars `kdiv fetch-jars` cached.

`KafkaCluster(nodes=1)` is one process that is both broker and controller; `nodes=3` is
three such processes, each with its own ports and log directory, forming one controller
quorum, so topics can have three replicas and leaders can fail over. Settings favour tests
and a laptop over throughput: no initial rebalance delay, sessions down to 1 s, small
segments, a log cleaner and retention checks that act within seconds.

Beside PLAINTEXT (clients, inter-broker) and CONTROLLER (the quorum), `listeners` adds
client listeners that need TLS: `Listener.sasl_ssl` (SCRAM-SHA-512 over TLS, its users
created at start through the admin API, so no password is on a command line) and
`Listener.mutual_tls` (TLS that requires a client certificate). Certificates are PEM
files; Kafka reads them itself (`ssl.keystore.type=PEM`), no keytool.

Each node's storage is formatted with the cluster's id before its first start. Without a
`data_dir` the cluster lives in a temporary directory removed at stop, like a fresh broker
each time; with one, a restart keeps every topic. A temporary directory names the processes
that use it (`kdiv-broker.pids`: the owner, then its nodes), so one left behind by an owner
that was killed (SIGKILL leaves no time to remove it) is removed at the next start of a
cluster, once all of them are gone. The nodes die with the process that started them, even
one killed outright (`kdiv.dev.lifetime`; on Linux, when started from the main thread). Nodes can be stopped, killed and started
again one by one (`stop_node`, `kill_node`, `start_node`), for failover tests, and frozen in
place (`pause_node`, SIGSTOP, and `resume_node`, SIGCONT): a paused node keeps its
connections and its log but answers nothing, like a broker in a long GC pause or behind a
partition, so it falls behind without leaving.
"""

from __future__ import annotations

import atexit
import base64
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from kdiv import maven
from kdiv.dev.lifetime import dies_with_this_process
from kdiv.dev.ports import (
    BrokerError,
    ensure_port_free,
    free_port,
    group_coordinator_ready,
    host_for_address,
    live_brokers,
    wait_or_kill,
)
from kdiv.dev.sigterm import serve_until_signalled
from kdiv.maven import KAFKA_BROKER, JarsError

_READY_POLL_INTERVAL_S = 0.1
_OUTPUT_TAIL_BYTES = 4000
_STORAGE_TOOL = "kafka.tools.StorageTool"
_SERVER_MAIN = "kafka.Kafka"
_META_PROPERTIES = "meta.properties"
SCRAM_MECHANISM = "SCRAM-SHA-512"
_SCRAM_ITERATIONS = 4096
# Names the broker keeps for its own listeners.
_RESERVED_LISTENERS = ("PLAINTEXT", "CONTROLLER")
_TEMPORARY_PREFIX = "kdiv-kafka-"
# A node's bind failure, as Kafka says it, and how many starts on new ports it is given.
PORT_TAKEN = "Address already in use"
PORT_TAKEN_ATTEMPTS = 3

log = logging.getLogger(__name__)
# In a temporary cluster directory: the pids of the processes using it, one a line.
PIDS_FILE = "kdiv-broker.pids"
# `kdiv broker` stops its nodes within this on SIGTERM, before honcho's SIGKILL (5 s after).
_CLI_STOP_TIMEOUT_S = 3.0

# Broker settings for development and tests. Each is something a test or the dev stack
# needs to see happen within seconds rather than minutes.
_FAST_SETTINGS: dict[str, str] = {
    # A consumer group starts at once instead of waiting 3 s for more members.
    "group.initial.rebalance.delay.ms": "0",
    # Worker takeover tests run 3 s sessions (Kafka refuses sessions under 6 s by default).
    "group.min.session.timeout.ms": "1000",
    # A dead node is fenced, and its leaderships move, after 3 s instead of 9.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    # Fewer internal partitions: created at the first group or transaction in a second, not ten.
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.num.partitions": "8",
    # Small segments and an eager cleaner: compaction and retention act within seconds once
    # a segment rolls (topics that test them set segment.ms too).
    "log.segment.bytes": str(1024 * 1024),
    "log.cleaner.backoff.ms": "500",
    "log.cleaner.min.cleanable.ratio": "0.01",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "log.retention.check.interval.ms": "1000",
    # Nothing is deleted by age unless its topic sets retention.ms: tests and replays write
    # records with fixed timestamps years old, which a 7-day default would delete at once.
    "log.retention.ms": "-1",
    "log.initial.task.delay.ms": "0",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.partitions": "1",
}

_LOG4J2_CONFIG = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
"""


def java_executable() -> str:
    """The Java runtime the broker runs on; BrokerError in one line when there is none."""
    try:
        return maven.java_executable("Apache Kafka", "`kdiv broker --tansu` runs the in-memory stand-in")
    except maven.JavaMissing as missing:
        raise BrokerError(str(missing)) from None


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, as kafka-storage makes."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass(frozen=True)
class BrokerTls:
    """The broker's side of TLS, as PEM files."""

    # The broker's certificate first, then any intermediates.
    certificate: Path
    # Its private key, PKCS#8 ("BEGIN PRIVATE KEY" or "BEGIN ENCRYPTED PRIVATE KEY"): the
    # only PEM key form Kafka reads.
    key: Path
    # The CA(s) whose client certificates the broker accepts (mutual TLS).
    ca: Path
    key_password: str = field(default="", repr=False)


@dataclass(frozen=True)
class Listener:
    """A client listener beside PLAINTEXT; build one with `sasl_ssl` or `mutual_tls`.

    `port`: node n listens on `port + n - 1`; 0 picks free ports at start. Read the
    addresses back from `KafkaCluster.bootstrap_of(listener.name)`.
    """

    name: str
    protocol: Literal["SSL", "SASL_SSL"]
    tls: BrokerTls
    port: int = 0
    client_auth: Literal["none", "requested", "required"] = "none"
    # SCRAM-SHA-512 users, name to password (SASL_SSL only).
    scram_users: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def sasl_ssl(cls, tls: BrokerTls, users: Mapping[str, str], *, port: int = 0, name: str = "SASL_SSL") -> Listener:
        """SASL SCRAM-SHA-512 over TLS for `users` (name to password)."""
        return cls(name=name, protocol="SASL_SSL", tls=tls, port=port, scram_users=dict(users))

    @classmethod
    def mutual_tls(cls, tls: BrokerTls, *, port: int = 0, name: str = "SSL") -> Listener:
        """TLS that refuses a client without a certificate signed by `tls.ca`."""
        return cls(name=name, protocol="SSL", tls=tls, port=port, client_auth="required")

    def settings(self, keystore: Path) -> dict[str, str]:
        """This listener's broker settings (`listener.name.<name>.`), its keystore at `keystore`."""
        prefix = f"listener.name.{self.name.lower()}."
        settings = {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.tls.ca),
            "ssl.client.auth": self.client_auth,
        }
        if self.tls.key_password:
            settings["ssl.key.password"] = self.tls.key_password
        if self.protocol == "SASL_SSL":
            settings |= {
                "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                # The broker's side only: it checks clients against the credentials in the metadata log.
                f"{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
            }
        return {prefix + key: value for key, value in settings.items()}


@dataclass
class KafkaNode:
    """One broker-and-controller process of the cluster."""

    node_id: int
    port: int
    controller_port: int
    directory: Path
    # The ports of the cluster's extra listeners, by listener name.
    listener_ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    output: IO[bytes] | None = field(default=None, repr=False)
    # SIGSTOPped by `KafkaCluster.pause_node`: a SIGTERM waits for a SIGCONT.
    paused: bool = False

    @property
    def log_dir(self) -> Path:
        return self.directory / "data"

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def output_file(self) -> Path:
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output_tail(self) -> str:
        try:
            with open(self.output_file, "rb") as output:
                size = output.seek(0, os.SEEK_END)
                output.seek(max(0, size - _OUTPUT_TAIL_BYTES))
                return output.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""


class KafkaCluster:
    """Apache Kafka (KRaft) in child processes, listening on and advertising `host`.

    `port` is the first node's port and node n listens on `port + n - 1`; `port=0` picks
    free ports at start (read them back from `.bootstrap`). `listeners` adds client
    listeners with TLS or SASL (`Listener`). `settings` override or add broker settings for
    every node. Use as a context manager, or `start()` and `stop()`.
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        host: str = "127.0.0.1",
        port: int = 9092,
        data_dir: str | Path | None = None,
        settings: Mapping[str, str] | None = None,
        listeners: Sequence[Listener] = (),
        heap: str = "768m",
    ):
        if nodes < 1:
            raise BrokerError(f"a cluster needs at least one node, not {nodes}")
        names = [listener.name.upper() for listener in listeners]
        if len(set(names)) < len(names) or set(names) & set(_RESERVED_LISTENERS):
            raise BrokerError(
                f"listener names must differ from each other and from {', '.join(_RESERVED_LISTENERS)}: {names}"
            )
        for listener in listeners:
            if listener.scram_users and listener.protocol != "SASL_SSL":
                raise BrokerError(f"listener {listener.name}: SCRAM users need SASL_SSL, not {listener.protocol}")
        self.listeners = tuple(listeners)
        self.node_count = nodes
        self.host = host
        self.port = port
        self.settings = dict(settings or {})
        self.heap = heap
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._temporary_dir: Path | None = None
        self.nodes: list[KafkaNode] = []
        self.cluster_id: str | None = None

    # -- addresses ---------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        if not self.nodes:
            raise BrokerError("the cluster's ports are chosen at start(); start it first")
        return ",".join(f"{host_for_address(self.host)}:{node.port}" for node in self.nodes)

    def bootstrap_of(self, listener: str) -> str:
        """The bootstrap address of the extra listener named `listener`."""
        if not self.nodes:
            raise BrokerError("the cluster's ports are chosen at start(); start it first")
        known = [extra.name for extra in self.listeners]
        if listener not in known:
            raise BrokerError(f"no listener {listener!r} in this cluster (listeners: PLAINTEXT, {', '.join(known)})")
        return ",".join(f"{host_for_address(self.host)}:{node.listener_ports[listener]}" for node in self.nodes)

    @property
    def directory(self) -> Path:
        directory = self._data_dir or self._temporary_dir
        if directory is None:
            raise BrokerError("the cluster has no directory before start()")
        return directory

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise BrokerError(f"no node {node_id} in this cluster (nodes {[n.node_id for n in self.nodes]})")

    @property
    def pids(self) -> list[int]:
        """The running nodes' process ids (for CPU accounting)."""
        return [node.process.pid for node in self.nodes if node.process is not None and node.running]

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0, *, inherit_output: bool = False) -> KafkaCluster:
        """Format what is new, start every node, and return once all serve clients."""
        if any(node.running for node in self.nodes):
            raise BrokerError(f"the cluster on {self.bootstrap} is already started")
        # A free port is found by binding and letting go of it; until the node binds it, any
        # other process (a client's outgoing connection among them) may take it. A cluster of
        # ports and storage chosen here is started again on new ones (stop() forgot both).
        retry = self._data_dir is None and self.port == 0 and all(extra.port == 0 for extra in self.listeners)
        for attempt in range(1, PORT_TAKEN_ATTEMPTS + 1):
            try:
                return self._start(timeout, inherit_output)
            except BrokerError as failed:
                if not retry or attempt == PORT_TAKEN_ATTEMPTS or PORT_TAKEN not in str(failed):
                    raise
                log.warning("a Kafka node's port was taken before it bound it; starting on new ports")
        raise AssertionError("unreachable")

    def _start(self, timeout: float, inherit_output: bool) -> KafkaCluster:
        java = java_executable()
        try:
            classpath = os.pathsep.join(str(jar) for jar in KAFKA_BROKER.jars())
        except JarsError as missing:
            raise BrokerError(str(missing)) from None
        if self._data_dir is None:
            remove_stale_directories()
            self._temporary_dir = Path(tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX))
            self._write_pids()
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._plan_nodes()
            self._write_configs()
            self._format_new_storage(java, classpath)
            for node in self.nodes:
                self._spawn(node, java, classpath, inherit_output)
            self._wait_until_serving(timeout, [node.node_id for node in self.nodes])
            self._create_scram_users(timeout)
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)  # no orphan JVMs if the caller forgets
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node (controlled shutdown, then SIGKILL after `timeout`). Idempotent."""
        atexit.unregister(self.stop)
        running = [node for node in self.nodes if node.running]
        # Signalled together: a node stopping alone would wait for the others' quorum.
        for node in running:
            assert node.process is not None
            node.process.terminate()
            if node.paused:
                self.resume_node(node.node_id)  # a stopped process acts on no SIGTERM
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            self._reap(node, max(0.0, deadline - time.monotonic()))
        if self._temporary_dir is not None:
            shutil.rmtree(self._temporary_dir, ignore_errors=True)
            self._temporary_dir = None
            self.nodes = []  # they lived in the removed directory; a new start plans anew

    def stop_node(self, node_id: int, timeout: float = 20.0) -> None:
        """Stop one node cleanly (its leaderships move to the others first)."""
        node = self.node(node_id)
        if node.running:
            assert node.process is not None
            node.process.terminate()
        self._reap(node, timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node: no controlled shutdown, unflushed writes may be lost."""
        node = self.node(node_id)
        if node.running:
            assert node.process is not None
            node.process.kill()
        self._reap(node, 10.0)

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP one node: it keeps its log and connections and answers nothing until
        `resume_node`; the others fence it once its heartbeats are missed."""
        node = self.node(node_id)
        if not node.running:
            raise BrokerError(f"node {node_id} is not running; only a running node can be paused")
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume_node(self, node_id: int) -> None:
        """SIGCONT a paused node: it goes on where it stopped (and learns it was fenced)."""
        node = self.node(node_id)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGCONT)
        node.paused = False

    def start_node(self, node_id: int, timeout: float = 60.0) -> None:
        """Start a stopped node again on its own ports and log directory."""
        node = self.node(node_id)
        if node.running:
            raise BrokerError(f"node {node_id} is already running")
        java = java_executable()
        classpath = os.pathsep.join(str(jar) for jar in KAFKA_BROKER.jars())
        self._spawn(node, java, classpath, inherit_output=False)
        self._wait_until_serving(timeout, [node_id])

    def run_forever(self) -> None:
        """For a CLI: start, print the bootstrap address, serve until SIGINT/SIGTERM, stop.

        The address goes alone to stdout (scripts read it); the brokers' logs go to stderr.
        Must run in the main thread, where Python delivers signals.
        """

        def announce() -> None:
            print(self.bootstrap, flush=True)
            where = "a temporary directory, removed at stop" if self._data_dir is None else str(self._data_dir)
            print(
                f"Apache Kafka {KAFKA_BROKER.version} (KRaft, {self.node_count} node"
                f"{'s' if self.node_count > 1 else ''}, cluster {self.cluster_id}) listening on "
                f"{self.bootstrap}; logs in {where}. Ctrl-C to stop.",
                file=sys.stderr,
                flush=True,
            )

        def ended() -> Exception | None:
            for node in self.nodes:
                if not node.running:
                    code = node.process.returncode if node.process is not None else None
                    return BrokerError(f"Kafka node {node.node_id} on port {node.port} exited unexpectedly ({code})")
            return None

        serve_until_signalled(
            lambda: self.start(inherit_output=True), announce, ended, lambda: self.stop(timeout=_CLI_STOP_TIMEOUT_S)
        )

    # -- internals ---------------------------------------------------------------------

    def _plan_nodes(self) -> None:
        if self.nodes:
            return  # a restart keeps each node's ports and directory

        def port_of(first: int, index: int) -> int:
            if first == 0:
                return free_port(self.host)
            ensure_port_free(self.host, first + index)
            return first + index

        self.nodes = [
            KafkaNode(
                node_id=index + 1,
                port=port_of(self.port, index),
                controller_port=free_port(self.host),
                directory=self.directory / f"node-{index + 1}",
                listener_ports={listener.name: port_of(listener.port, index) for listener in self.listeners},
            )
            for index in range(self.node_count)
        ]

    def node_settings(self, node: KafkaNode) -> dict[str, str]:
        """Every broker setting of `node` (the fast defaults, then `settings` over them)."""
        host = host_for_address(self.host)
        replicas = str(min(3, self.node_count))
        voters = ",".join(f"{n.node_id}@{host}:{n.controller_port}" for n in self.nodes)
        extra = [(listener.name.upper(), listener, node.listener_ports[listener.name]) for listener in self.listeners]
        clients = [f"PLAINTEXT://{host}:{node.port}", *(f"{name}://{host}:{port}" for name, _, port in extra)]
        base = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join([*clients, f"CONTROLLER://{host}:{node.controller_port}"]),
            "advertised.listeners": ",".join(clients),
            "listener.security.protocol.map": ",".join(
                ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT", *(f"{name}:{lst.protocol}" for name, lst, _ in extra)]
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(node.log_dir),
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": "1",
            "default.replication.factor": "1",
        }
        for listener in self.listeners:
            base |= listener.settings(self._keystore(listener))
        return {**base, **_FAST_SETTINGS, **self.settings}

    def _keystore(self, listener: Listener) -> Path:
        return self.directory / f"keystore-{listener.name.lower()}.pem"

    def _write_configs(self) -> None:
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            lines = [f"{key}={value}" for key, value in self.node_settings(node).items()]
            node.config_file.write_text("\n".join(lines) + "\n")
        (self.directory / "log4j2.yaml").write_text(_LOG4J2_CONFIG)
        for listener in self.listeners:
            # Kafka's PEM key store is one file: the key, then the certificate chain.
            try:
                pem = listener.tls.key.read_text() + "\n" + listener.tls.certificate.read_text()
            except OSError as unreadable:
                raise BrokerError(f"listener {listener.name}: cannot read its TLS files: {unreadable}") from None
            keystore = self._keystore(listener)
            keystore.write_text(pem)
            keystore.chmod(0o600)

    def _create_scram_users(self, timeout: float) -> None:
        """Create or update every listener's SCRAM users, through the PLAINTEXT listener."""
        users = {name: password for listener in self.listeners for name, password in listener.scram_users.items()}
        if not users:
            return
        # Imported here: only a cluster with SCRAM users needs confluent-kafka.
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialAlteration,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, _SCRAM_ITERATIONS)
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(name, info, password.encode()) for name, password in users.items()
        ]
        deadline = time.monotonic() + timeout
        for name, future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).items():
            try:
                future.result(timeout)
            except KafkaException as failed:
                # The error names the user, never the password.
                raise BrokerError(f"creating SCRAM user {name!r} on {self.bootstrap} failed: {failed}") from None
        # The controller has them once the futures resolve; a broker authenticates with them
        # once its metadata has caught up, which the description reflects.
        while True:
            described = admin.describe_user_scram_credentials(list(users), request_timeout=timeout)
            assert isinstance(described, dict)  # one future per user, as users are named
            try:
                if all(future.result(timeout).scram_credential_infos for future in described.values()):
                    return
            except KafkaException:
                pass  # not in this broker's metadata yet
            if time.monotonic() >= deadline:
                raise BrokerError(f"the SCRAM users {sorted(users)} were not visible on {self.bootstrap} in time")
            time.sleep(_READY_POLL_INTERVAL_S)

    def _format_new_storage(self, java: str, classpath: str) -> None:
        existing = [_read_cluster_id(node.log_dir) for node in self.nodes]
        known = {cluster_id for cluster_id in existing if cluster_id}
        if len(known) > 1:
            raise BrokerError(f"the nodes under {self.directory} belong to different clusters: {sorted(known)}")
        self.cluster_id = known.pop() if known else new_cluster_id()
        unformatted = [node for node, cluster_id in zip(self.nodes, existing, strict=True) if cluster_id is None]

        def format_storage(node: KafkaNode) -> None:
            result = subprocess.run(
                [
                    *self._java_command(java, classpath, quick=True),
                    _STORAGE_TOOL,
                    "format",
                    # One argument: a cluster id may start with "-", which argparse would take for an option.
                    f"--cluster-id={self.cluster_id}",
                    "--config",
                    str(node.config_file),
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                output = (result.stdout + result.stderr).strip()[-_OUTPUT_TAIL_BYTES:]
                raise BrokerError(f"formatting Kafka node {node.node_id}'s storage failed: {output}")

        # One JVM each, in parallel: formatting is mostly JVM start-up.
        with ThreadPoolExecutor(max_workers=max(1, len(unformatted))) as pool:
            list(pool.map(format_storage, unformatted))

    def _java_command(self, java: str, classpath: str, *, quick: bool = False) -> list[str]:
        options = [f"-Dlog4j2.configurationFile={self.directory / 'log4j2.yaml'}", "-Djava.awt.headless=true"]
        if quick:
            # A one-shot tool: the fastest start, no server tuning.
            options += ["-Xshare:auto", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m"]
        else:
            options += [f"-Xmx{self.heap}", "-Xms128m"]
        return [java, *options, "-cp", classpath]

    def _spawn(self, node: KafkaNode, java: str, classpath: str, inherit_output: bool) -> None:
        if inherit_output:
            output: int | IO[bytes] = sys.stderr.fileno()
        else:
            # A file, not a pipe: nobody drains a pipe while the broker runs.
            node.output = open(node.output_file, "ab")  # noqa: SIM115 - open while the node runs
            output = node.output
        try:
            node.process = subprocess.Popen(
                [*self._java_command(java, classpath), _SERVER_MAIN, str(node.config_file)],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C meant for us must not kill the broker before stop().
                start_new_session=True,
                # Nobody would stop it once we are gone, even killed outright.
                preexec_fn=dies_with_this_process(),
            )
        except OSError as exc:
            raise BrokerError(f"cannot run {java}: {exc}") from exc
        self._write_pids()

    def _write_pids(self) -> None:
        """Name this process and the running nodes in the temporary directory (see the module doc)."""
        if self._temporary_dir is None:
            return
        pids = [os.getpid(), *(n.process.pid for n in self.nodes if n.process is not None and n.running)]
        (self._temporary_dir / PIDS_FILE).write_text("".join(f"{pid}\n" for pid in pids))

    def _wait_until_serving(self, timeout: float, node_ids: list[int]) -> None:
        deadline = time.monotonic() + timeout
        expected = sorted(n.node_id for n in self.nodes)
        waiting = [self.node(node_id) for node_id in node_ids]
        while True:
            for node in waiting:
                if not node.running:
                    code = node.process.returncode if node.process is not None else None
                    raise BrokerError(
                        f"Kafka node {node.node_id} exited with code {code} before serving on port {node.port}"
                        + _quoted(node.output_tail())
                    )
            answers = [live_brokers(self.host, node.port) for node in waiting]
            if all(answer is not None and answer[1] == expected for answer in answers) and all(
                group_coordinator_ready(self.host, node.port) for node in waiting
            ):
                return
            if time.monotonic() >= deadline:
                tails = "".join(_quoted(node.output_tail()) for node in waiting)
                raise BrokerError(
                    f"Kafka on {self.bootstrap} did not serve with nodes {expected} within {timeout:.0f} s "
                    f"(brokers seen: {answers})" + tails
                )
            time.sleep(_READY_POLL_INTERVAL_S)

    def _reap(self, node: KafkaNode, timeout: float) -> None:
        if node.paused:
            self.resume_node(node.node_id)  # a stopped process acts on no SIGTERM
        process, node.process = node.process, None
        if process is not None and process.poll() is None:
            wait_or_kill(process, timeout)
        if node.output is not None:
            node.output.close()
            node.output = None


def remove_stale_directories(parent: Path | None = None) -> list[Path]:
    """Remove the temporary cluster directories under `parent` (default: the system's temporary
    directory) whose processes are all gone; the ones removed. A directory without a pids file
    is not known to be a cluster's, or is being created: left alone."""
    removed = []
    for directory in Path(parent or tempfile.gettempdir()).glob(_TEMPORARY_PREFIX + "*"):
        try:
            text = (directory / PIDS_FILE).read_text()
        except OSError:
            continue
        try:
            pids = [int(line) for line in text.split()]
        except ValueError:
            continue  # not a file this module wrote
        if pids and not any(_alive(pid) for pid in pids):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    # A zombie (dead, not yet reaped by whoever adopted it) answers signals too.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _read_cluster_id(log_dir: Path) -> str | None:
    try:
        text = (log_dir / _META_PROPERTIES).read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    raise BrokerError(f"{log_dir / _META_PROPERTIES} names no cluster.id")


def _quoted(tail: str) -> str:
    return f"; its output ends with:\n{tail}" if tail else ""
