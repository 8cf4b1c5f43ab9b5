"""docker/: the compose file and the Dockerfile, checked without a Docker engine.

The KDIV_* names compose may set are taken from the code (every name app/ reads: tests/settings_scan.py), so a
renamed or misspelt setting in compose.yaml fails here instead of being ignored at run time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.settings_scan import kdiv_variables_read_by_the_code

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["NAME=value", ...]
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _image_tag(image: str) -> str | None:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def _pinned(image: str) -> bool:
    """An explicit version tag (digits, as in 4.1.0, v3.5.0 or 3.11.14-slim), not `latest`."""
    tag = _image_tag(image)
    return tag is not None and tag != "latest" and re.match(r"v?\d+(\.\d+)+", tag) is not None


def test_the_scan_finds_the_settings_the_code_reads():
    names = kdiv_variables_read_by_the_code()
    # A sample of what must be there for the scan to be trusted, each from a different kind of read.
    assert {"KDIV_BOOTSTRAP", "KDIV_WEB_PORT", "KDIV_SASL_USERNAME", "KDIV_WEB_TOKEN", "KDIV_BROKER_FLAVOR"} <= names
    assert "KDIV_NO_SUCH_SETTING" not in names


def test_the_compose_file_parses_and_every_image_is_pinned_or_built_here(services):
    assert {
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "schema-registry",
        "spark-master",
        "spark-worker",
        "kdiv-worker-1",
        "kdiv-worker-2",
        "demo",
        "prometheus",
        "grafana",
        "node-exporter",
    } <= services.keys()
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            assert (REPO / "docker" / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE, name
        else:
            assert _pinned(service["image"]), f"{name}: image {service['image']!r} has no explicit version tag"
    assert services["kafka-1"]["image"].startswith("apache/kafka:")
    assert services["schema-registry"]["image"].startswith("confluentinc/cp-schema-registry:")
    assert services["spark-master"]["image"].startswith("apache/spark:")


def test_the_dockerfile_is_pinned_and_runs_as_a_user():
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    args = dict(re.fullmatch(r"ARG (\w+)=(\S+)", line).groups() for line in lines if re.fullmatch(r"ARG \w+=\S+", line))
    bases = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert bases
    for base in bases:
        assert _pinned(base), f"FROM {base} has no explicit version tag"
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must end as a non-root USER"
    # The driver's Spark and the cluster's must be one version.
    spark_image = yaml.safe_load(COMPOSE.read_text())["services"]["spark-master"]["image"]
    assert _image_tag(spark_image) == args["SPARK_VERSION"]
    assert "openjdk-17-jre-headless" in DOCKERFILE.read_text()


def test_compose_sets_only_kdiv_variables_the_code_reads(services):
    known = kdiv_variables_read_by_the_code()
    used = {
        (name, var) for name, service in services.items() for var in _environment(service) if var.startswith("KDIV_")
    }
    assert used, "no KDIV_ settings in compose.yaml"
    unknown = sorted(f"{name}: {var}" for name, var in used if var not in known)
    assert unknown == [], f"compose.yaml sets KDIV_ variables no code reads: {unknown}"


def test_published_ports_match_the_web_port_and_the_kdiv_workers_are_distinct(services):
    workers = {
        name: s for name, s in services.items() if s.get("command", [None])[:3] == ["faust", "-A", "kdiv.worker.main"]
    }
    assert len(workers) == 2
    host_ports = []
    for name, service in workers.items():
        env = _environment(service)
        web_port = env.get("KDIV_WEB_PORT", "6066")
        published = [str(p).rsplit(":", 2) for p in service.get("ports", [])]
        assert published, f"{name} publishes no port"
        for *_host_ip, host_port, container_port in ([None, *p] if len(p) == 2 else p for p in published):
            assert container_port == web_port, (
                f"{name}: publishes container port {container_port}, KDIV_WEB_PORT={web_port}"
            )
            host_ports.append(host_port)
        # Peers reach each worker at its own name; with it not on loopback, a token is required.
        assert env["KDIV_WEB_HOST"] == service["hostname"] == name
        assert env["KDIV_WEB_TOKEN"].startswith("${KDIV_WEB_TOKEN")
        assert env["KDIV_SCHEMA_REGISTRY_URL"] == "http://schema-registry:8081"
    assert len(host_ports) == len(set(host_ports)), f"two workers publish the same host port: {host_ports}"


def test_dependencies_health_checks_and_volumes(compose, services):
    for name, service in services.items():
        depends = service.get("depends_on") or []
        for dependency in depends:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            if isinstance(depends, dict) and depends[dependency].get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}, which has no healthcheck"
    for name in ("kafka-1", "kafka-2", "kafka-3"):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert "kafka-broker-api-versions" in test or "kafka-topics" in test, name
    assert "/subjects" in " ".join(services["schema-registry"]["healthcheck"]["test"])
    for name in ("kdiv-worker-1", "kdiv-worker-2"):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert f"{name}:6066/health" in test, name
    # Every named volume used is declared, and every declared one is used.
    declared = set(compose.get("volumes") or {})
    used = {v.split(":", 1)[0] for s in services.values() for v in s.get("volumes", []) if not v.startswith((".", "/"))}
    assert used == declared
    for name in ("kdiv-worker-1", "kdiv-worker-2"):
        data_dir = _environment(services[name])["KDIV_DATA_DIR"]
        assert any(data_dir.startswith(v.split(":", 1)[1]) for v in services[name]["volumes"]), name


def test_kafka_is_a_replicated_kraft_cluster(services):
    brokers = [services[f"kafka-{n}"] for n in (1, 2, 3)]
    envs = [_environment(b) for b in brokers]
    assert {e["KAFKA_NODE_ID"] for e in envs} == {"1", "2", "3"}
    assert len({e["CLUSTER_ID"] for e in envs}) == 1
    for env in envs:
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
        assert sorted(v.split("@")[1].split(":")[0] for v in voters) == ["kafka-1", "kafka-2", "kafka-3"]
    registry = _environment(services["schema-registry"])
    assert registry["SCHEMA_REGISTRY_KAFKASTORE_TOPIC"] == "_schemas"
    assert registry["SCHEMA_REGISTRY_KAFKASTORE_TOPIC_REPLICATION_FACTOR"] == "3"
    demo = services["demo"]["command"]
    assert demo[:2] == ["kdiv", "demo"] and demo[demo.index("--topic") + 1] == "kdiv-demo"
