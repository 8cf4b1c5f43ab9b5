"""Shared fixtures: one Kafka broker per test session, and fresh topics on it.

The broker is, in order of preference: the cluster at $KDIV_BOOTSTRAP; Apache Kafka in
a container when a Docker engine answers; Apache Kafka started from the jars `kdiv
fetch-jars` cached (kdiv.dev.broker). `KDIV_TEST_BROKER=tansu` runs the suite on the
in-memory stand-in instead, for machines without Java; it never stands in unasked.

The registry tests run twice, through `each_registry_url`: on the session's registry
(kdiv's development registry unless $KDIV_SCHEMA_REGISTRY_URL names one) and on Apicurio
Registry, a real one, started once from what `kdiv fetch-jars` unpacked.

Each of them starts at the first test that asks for it, not before: tests/unit asks for
none (tests/unit/conftest.py fails a unit test that does), so it runs without Java.
`KDIV_TEST_BROKER=none` makes every test that asks for a broker fail at once, to find them.

A run stopped by SIGTERM (or Ctrl-C) stops what it started: SIGTERM is turned into the
KeyboardInterrupt pytest already stops on, which runs every fixture's teardown; and the
processes the fixtures and tests/harness start die with this one even if it is killed
outright (`kdiv.dev.lifetime`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import uuid
import warnings
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any, TypeVar

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kdiv.dev.broker import KafkaCluster
from kdiv.dev.tansu import TansuBroker
from kdiv.kafka.tansu import detect_tansu
from kdiv.kafka.topics import create_topic

BOOTSTRAP_ENV = "KDIV_BOOTSTRAP"
TEST_BROKER_ENV = "KDIV_TEST_BROKER"
REGISTRY_ENV = "KDIV_SCHEMA_REGISTRY_URL"

# KDIV_TEST_BROKER=none: no broker for this run; a test that asks for one fails, naming itself.
NO_BROKER = "none"

T = TypeVar("T")


def _interrupt_at_sigterm(signum: int, frame: FrameType | None) -> None:
    # Once: a second SIGTERM while the fixtures tear down ends the run at once, and the
    # processes they started die with it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt("SIGTERM: stopping the test run and what it started")


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt_at_sigterm)


# The modules that run Spark, in the test process or through spark-submit. Under pytest-xdist
# (tests/run) one worker runs them one after another: in one process every SparkSession
# shares the JVM the first one started (and its classpath), and Spark's JVMs are what loads
# two cores most. Every other module goes to a worker whole.
SPARK_MODULES = frozenset(
    f"tests/integration/test_{name}.py"
    for name in (
        "compaction",
        "demo",
        "java_interceptor_faults",
        "kafka_source",
        "reconcile_changefeeds",
        "reconcile_cluster",
        "reconcile_compare",
        "reconcile_incidents",
        "reconcile_job",
        "reconcile_report",
        "reconcile_report_layout",
        "reconcile_routes",
        "reconcile_unread",
        "security_kafka",
        "streams_hop",
    )
)
SPARK_GROUP = "spark"
# The `alone` modules time how long the worker takes to say a frozen, killed or elected broker:
# one after another in one process (they share the session's three-node cluster). The soak
# (about half a core) runs beside them in the other.
CLUSTER_MODULES = frozenset(
    f"tests/integration/test_{name}.py"
    for name in ("broker_failover", "devstack_outage", "java_interceptor_failover", "kafka_broker")
)
CLUSTER_GROUP = "cluster"
BESIDE_THE_CLUSTER = frozenset({"tests/integration/test_soak.py"})


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def worker_group(nodeid: str) -> str:
    """What one xdist worker runs together: the Spark modules, the cluster's, else the test's module."""
    module = module_of(nodeid)
    if module in SPARK_MODULES:
        return SPARK_GROUP
    return CLUSTER_GROUP if module in CLUSTER_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A module that asks for the session's SparkSession and is not among SPARK_MODULES would
    # share a worker's JVM with whatever ran there before it.
    strays = sorted({module_of(item.nodeid) for item in items if "spark" in getattr(item, "fixturenames", ())})
    strays = [module for module in strays if module not in SPARK_MODULES and module.startswith("tests/integration/")]
    if strays:
        raise pytest.UsageError(f"tests/conftest.py SPARK_MODULES lacks {', '.join(strays)}, which use Spark")
    # An `alone` module in neither set would run beside the cluster's tests in a third process.
    alone = {module_of(item.nodeid) for item in items if item.get_closest_marker("alone")}
    unplaced = sorted(alone - CLUSTER_MODULES - BESIDE_THE_CLUSTER)
    if unplaced:
        raise pytest.UsageError(f"tests/conftest.py CLUSTER_MODULES lacks {', '.join(unplaced)}, marked alone")


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to completion from sync code, even inside an async test.

    asyncio.run refuses to run while an event loop is running in the thread (as in an
    async test), so the coroutine gets a fresh loop in a worker thread.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdiv-fixture") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()  # type: ignore[attr-defined]  # docker's client, when installed
    except Exception:  # no client library, no socket, engine down: all mean "no Docker"
        return False
    return True


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """Bootstrap address ("host:port") of the session's broker."""
    configured = os.environ.get(BOOTSTRAP_ENV)
    if os.environ.get(TEST_BROKER_ENV) == NO_BROKER:
        pytest.fail(f"{TEST_BROKER_ENV}={NO_BROKER}: this run has no broker, and this test asks for one", pytrace=False)
    if configured:
        yield configured
    elif _docker_engine_answers():
        # Imported here: the module pulls in the Docker client, needed on this path only.
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server()
    elif os.environ.get(TEST_BROKER_ENV) == "tansu":
        with TansuBroker(port=0) as tansu:
            yield tansu.bootstrap
    else:
        with KafkaCluster(port=0) as kafka:
            yield kafka.bootstrap


@pytest.fixture(scope="session")
def three_node_cluster() -> Iterator[KafkaCluster]:
    """One three-node cluster for every test of the session that kills, pauses or elects
    (starting and stopping one takes about 20 s); each gets it whole again (`three_nodes`)."""
    with KafkaCluster(3, port=0) as cluster:
        yield cluster


@pytest.fixture
def three_nodes(three_node_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The session's three-node cluster, every node running and unpaused again afterwards."""
    # Imported here: the harness imports the writer and the demo, which unit runs need not load.
    from tests.harness.broker import restore

    restore(three_node_cluster)
    yield three_node_cluster
    restore(three_node_cluster)


@pytest.fixture(scope="session")
def registry_url(bootstrap: str) -> Iterator[str]:
    """A Schema Registry: $KDIV_SCHEMA_REGISTRY_URL, else kdiv's development registry."""
    configured = os.environ.get(REGISTRY_ENV)
    if configured:
        yield configured
    else:
        from kdiv.dev.registry.process import DevRegistryProcess

        with DevRegistryProcess(bootstrap) as registry:
            yield registry.url


@pytest.fixture(scope="session")
def apicurio_url() -> Iterator[str]:
    """Apicurio Registry's Confluent API base URL, started once from what `kdiv fetch-jars` unpacked."""
    if os.environ.get(TEST_BROKER_ENV) == NO_BROKER:
        pytest.fail(
            f"{TEST_BROKER_ENV}={NO_BROKER}: this run has no registry, and this test asks for one", pytrace=False
        )
    from kdiv.dev.apicurio import ApicurioRegistry

    with ApicurioRegistry() as registry:
        yield registry.url


@pytest.fixture(scope="session", params=["dev", "apicurio"])
def registry_kind(request: pytest.FixtureRequest) -> str:
    """Which registry `each_registry_url` is: "dev" (the session's, as `registry_url`) or "apicurio"."""
    return request.param


@pytest.fixture(scope="session")
def each_registry_url(registry_kind: str, request: pytest.FixtureRequest) -> str:
    """The registry tests run once per registry: the session's and a real one, Apicurio."""
    return request.getfixturevalue("apicurio_url" if registry_kind == "apicurio" else "registry_url")


@pytest.fixture(autouse=True)
def _workers_use_the_session_registry(request: pytest.FixtureRequest) -> Iterator[None]:
    """Workers a test starts use the session's registry, started (with the session's broker)
    when the first worker starts: a test that starts none starts neither."""
    from tests.harness import processes

    processes.registry_url_source = lambda: request.getfixturevalue("registry_url")
    yield
    processes.registry_url_source = processes.no_registry_url


@pytest.fixture(scope="session")
def broker_is_tansu(bootstrap: str) -> bool:
    return run_coroutine(detect_tansu(bootstrap))


@pytest.fixture
def topic_factory(bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """`topic_factory(partitions=1) -> name`: creates a fresh, uniquely named topic.

    Works from sync and async tests. The topics are deleted after the test.
    """
    test_name = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:150]
    created: list[str] = []

    def create_topic(partitions: int = 1) -> str:
        name = f"kdiv-{test_name}-{uuid.uuid4().hex[:8]}"
        run_coroutine(_create_topic(bootstrap, name, partitions))
        created.append(name)
        return name

    yield create_topic

    if created:
        try:
            run_coroutine(_delete_topics(bootstrap, created))
        except Exception as exc:  # leftover topics must not fail a test that passed
            warnings.warn(f"could not delete test topics {created} on {bootstrap}: {exc!r}")


async def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await admin.start()
    try:
        if not await create_topic(admin, NewTopic(name, num_partitions=partitions, replication_factor=1)):
            raise AssertionError(f"test topic {name} existed before the test created it")
    finally:
        await admin.close()


async def _delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def spark():
    """The session's one SparkSession (local[2]): starting one takes 8-9 s."""
    # Imported here: only the Spark tests pay for loading pyspark.
    from kdiv.reconcile.session import build_session

    session = build_session("local[2]")
    yield session
    session.stop()
