"""TLS and SASL against a real Apache Kafka: every kdiv component on a SASL_SSL listener
(SCRAM-SHA-512) and on a mutual-TLS listener, configured only by the KDIV_* security settings
(docs/operations.md); and each one refused in one line when its credentials are wrong.

One cluster for the module: PLAINTEXT (which the tests' own checks read), SASL_SSL and
SSL with `ssl.client.auth=required`, certificates from a throwaway CA. The component under
test only ever sees the secured listener.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from kdiv.config.security import KafkaSecurity
from kdiv.dev.broker import BrokerTls, KafkaCluster, Listener
from kdiv.dev.demo import FaultyPipeline
from kdiv.dev.registry.process import DevRegistryProcess
from kdiv.kafka.failures import BrokerRefused
from kdiv.reconcile.job import Reconciliation, parse_args, settings_from
from kdiv.writer import DivWriter
from tests.conftest import _create_topic, run_coroutine
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.oracle import incident_differences, oracle
from tests.harness.processes import WorkerProcess

pytestmark = pytest.mark.broker

KDIV = str(Path(sys.executable).with_name("kdiv"))
USER = "kdiv-worker"
# Distinctive, so that a leak into any output is found by a plain substring search.
PASSWORD = f"right-{uuid.uuid4().hex}"
WRONG_PASSWORD = f"wrong-{uuid.uuid4().hex}"
# A refused connection must be said within this many seconds, not retried for minutes.
REFUSED_WITHIN_S = 30.0
MODES = ("SASL_SSL", "mTLS")


def _pkcs8(key_pem: bytes) -> bytes:
    # Kafka's PEM key store and the Java client read PKCS#8 only; trustme writes the
    # traditional form.
    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, the brokers' certificate for 127.0.0.1 and localhost, a client certificate it
    signed, and one another CA signed."""
    d = tmp_path_factory.mktemp("pki")
    ca, foreign_ca = trustme.CA(), trustme.CA()
    files: dict[str, Path] = {}
    ca.cert_pem.write_to_path(d / "ca.pem")
    files["ca"] = d / "ca.pem"
    for name, issued in (
        ("server", ca.issue_cert("127.0.0.1", "localhost")),
        ("client", ca.issue_cert("kdiv-client@example.com")),
        ("foreign", foreign_ca.issue_cert("kdiv-client@example.com")),
    ):
        files[f"{name}_cert"] = d / f"{name}.pem"
        files[f"{name}_cert"].write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
        files[f"{name}_key"] = d / f"{name}.key"
        files[f"{name}_key"].write_bytes(_pkcs8(issued.private_key_pem.bytes()))
    return files


@pytest.fixture(scope="module")
def secured(pki) -> Iterator[KafkaCluster]:
    tls = BrokerTls(certificate=pki["server_cert"], key=pki["server_key"], ca=pki["ca"])
    with KafkaCluster(port=0, listeners=[Listener.sasl_ssl(tls, {USER: PASSWORD}), Listener.mutual_tls(tls)]) as kafka:
        yield kafka


@dataclass(frozen=True)
class Secured:
    """One secured listener and the settings docs/operations.md#security gives for it."""

    mode: str
    bootstrap: str
    env: dict[str, str]  # KDIV_BOOTSTRAP and the security settings
    plaintext: str  # the same cluster's PLAINTEXT listener, for the tests' own checks

    @property
    def security(self) -> KafkaSecurity:
        return KafkaSecurity.from_env(self.env)


def settings_for(mode: str, kafka: KafkaCluster, pki: dict[str, Path]) -> Secured:
    if mode == "SASL_SSL":
        bootstrap = kafka.bootstrap_of("SASL_SSL")
        security = {
            "KDIV_SECURITY_PROTOCOL": "SASL_SSL",
            "KDIV_SASL_MECHANISM": "SCRAM-SHA-512",
            "KDIV_SASL_USERNAME": USER,
            "KDIV_SASL_PASSWORD": PASSWORD,
            "KDIV_SSL_CA": str(pki["ca"]),
        }
    else:
        bootstrap = kafka.bootstrap_of("SSL")
        security = {
            "KDIV_SECURITY_PROTOCOL": "SSL",
            "KDIV_SSL_CA": str(pki["ca"]),
            "KDIV_SSL_CERT": str(pki["client_cert"]),
            "KDIV_SSL_KEY": str(pki["client_key"]),
        }
    return Secured(mode, bootstrap, {"KDIV_BOOTSTRAP": bootstrap, **security}, kafka.bootstrap)


# What each way of being refused changes in the right settings, and what the one line says.
REFUSALS: dict[str, tuple[str, dict[str, str | None], str]] = {
    "wrong SCRAM password": ("SASL_SSL", {"KDIV_SASL_PASSWORD": WRONG_PASSWORD}, "SASL authentication failed"),
    "client certificate of another CA": (
        "mTLS",
        {"KDIV_SSL_CERT": "{foreign_cert}", "KDIV_SSL_KEY": "{foreign_key}"},
        "the broker did not accept a TLS client certificate",
    ),
    "no client certificate": (
        "mTLS",
        {"KDIV_SSL_CERT": None, "KDIV_SSL_KEY": None},
        "the broker did not accept a TLS client certificate",
    ),
}


@pytest.fixture(params=list(REFUSALS))
def refused(request, secured, pki) -> tuple[Secured, str]:
    """Settings the broker refuses, and the words of the line that must say so."""
    mode, changes, said = REFUSALS[request.param]
    right = settings_for(mode, secured, pki)
    env = dict(right.env)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value.format(**{k: str(v) for k, v in pki.items()})
    return Secured(mode, right.bootstrap, env, right.plaintext), said


def without_kdiv_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KDIV_")}


# A service's own start-up log lines ("2026-01-01 12:00:00,000 INFO name: ..."), not failures.
SERVICE_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO ")


def assert_one_clear_line(output: str, said: str, *, service: bool = False) -> str:
    """The one line (besides a service's INFO log) that says `said`; no traceback, no password."""
    lines = [line for line in output.splitlines() if line.strip()]
    if service:
        lines = [line for line in lines if not SERVICE_LOG_LINE.match(line)]
    assert len(lines) == 1, output
    assert said in lines[0], output
    assert "Traceback" not in output
    assert PASSWORD not in output and WRONG_PASSWORD not in output
    return lines[0]


# -- working over the secured listeners ---------------------------------------------------------


@dataclass(frozen=True)
class Validated:
    """A topic the writer wrote with faults and a worker validated, both over `secured`."""

    secured: Secured
    topic: str
    app_id: str
    registry_url: str
    records: int


@pytest.fixture(scope="module", params=MODES)
def validated(request, secured, pki, tmp_path_factory) -> Iterator[Validated]:
    """Per mode: the development registry, the writer and a worker, each on the secured listener."""
    on = settings_for(request.param, secured, pki)
    workdir = tmp_path_factory.mktemp(f"validated-{request.param}")
    run = uuid.uuid4().hex[:8]
    topic, app_id = f"secured-{run}", f"secured-{run}"
    run_coroutine(_create_topic(on.plaintext, topic, 2))
    registry = DevRegistryProcess(on.bootstrap, topic=f"_schemas-{run}", env={**without_kdiv_settings(), **on.env})
    with registry:
        run_coroutine(write_with_faults(on, topic))
        worker = WorkerProcess(
            "secured",
            bootstrap=on.bootstrap,
            topics=[topic],
            app_id=app_id,
            workdir=workdir,
            env={**on.env, "KDIV_SCHEMA_REGISTRY_URL": registry.url},
        )
        try:
            worker.start()
            run_coroutine(worker.wait_ready())
            run_coroutine(wait_until_caught_up(on.plaintext, app_id, topic, workers=[worker], timeout=90))
            assert worker.problems() == [], worker.log_tail()
        finally:
            worker.terminate()
        records = run_coroutine(oracle(on.plaintext, topic)).records
        yield Validated(on, topic, app_id, registry.url, records)


async def write_with_faults(on: Secured, topic: str) -> None:
    """DIV-stamped records from the writer, with a lost record and a duplicate among them."""
    writer = await DivWriter.start(on.bootstrap, security=on.security)
    async with writer:
        pipeline = FaultyPipeline(writer, topic)
        partitions = await writer.partitions(topic)
        for n in range(40):
            await pipeline.healthy(partitions[n % len(partitions)])
            if n == 15:
                await pipeline.inject("loss", partitions[0])
            if n == 30:
                await pipeline.inject("duplicate", partitions[1])


async def test_the_worker_validates_and_reports_the_planted_faults(validated):
    expected = await oracle(validated.secured.plaintext, validated.topic)
    assert {"MISSING", "DUPLICATE"} <= set(expected.verdicts()), expected.verdicts()
    live = await read_incidents(validated.secured.plaintext, validated.app_id)
    assert incident_differences(expected, live) == []


def test_the_registry_serves_over_the_secured_listener(validated):
    # The worker registered its state schema there; a schema registered now reads back.
    with urllib.request.urlopen(f"{validated.registry_url}/subjects", timeout=10) as answer:
        subjects = json.load(answer)
    assert f"{validated.app_id}-state-p2-changelog-value" in subjects, subjects
    schema = json.dumps({"type": "record", "name": "Probe", "fields": [{"name": "n", "type": "long"}]})
    request = urllib.request.Request(
        f"{validated.registry_url}/subjects/probe-value/versions",
        data=json.dumps({"schema": schema}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        schema_id = json.load(answer)["id"]
    with urllib.request.urlopen(f"{validated.registry_url}/schemas/ids/{schema_id}", timeout=10) as answer:
        assert json.loads(json.load(answer)["schema"]) == json.loads(schema)


def run_kdiv(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KDIV, *args],
        env={**without_kdiv_settings(), **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_kdiv_dump_reads_the_topic_and_kdiv_check_finds_the_faults(validated):
    dumped = run_kdiv(validated.secured.env, "dump", validated.topic)
    assert dumped.returncode == 0, dumped.stderr
    assert len(dumped.stdout.splitlines()) == validated.records
    assert f"kdiv dump: {validated.records} records from {validated.topic}" in dumped.stderr
    checked = run_kdiv({}, "check", stdin=dumped.stdout)
    assert checked.returncode == 1 and "MISSING" in checked.stdout and "DUPLICATE" in checked.stdout


def test_kdiv_validate_prints_the_faults(validated):
    process = subprocess.Popen(
        [KDIV, "validate", validated.topic],
        env={**without_kdiv_settings(), **validated.secured.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        assert process.stdout is not None
        # The planted loss (a duplicate is no fault here: validate prints faults only).
        while "MISSING" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            if ready:
                line = process.stdout.readline()
                if not line:
                    break
                seen.add(json.loads(line)["verdict"])
    finally:
        process.terminate()
        _out, err = process.communicate(timeout=30)
    assert "MISSING" in seen, err


def test_the_nightly_job_reads_through_kdiv_s_source(validated, spark, tmp_path):
    on = validated.secured
    args = parse_args(
        [
            "--app-id",
            validated.app_id,
            "--topics",
            validated.topic,
            "--registry-url",
            validated.registry_url,
            "--out",
            str(tmp_path),
            "--kafka-source",
            "python",
        ]
    )
    said: list[str] = []
    code, report = Reconciliation(args, settings_from(args, on.env), spark, lambda m, err=False: said.append(m)).run()
    assert report is not None
    summary = json.loads((report / "summary.json").read_text())
    assert (code, summary["status"], summary["kafka_source"]) == (0, "clean", "python"), said
    assert summary["records_read"][validated.topic] == validated.records


def test_kdiv_reconcile_reads_through_spark_s_source(validated, tmp_path):
    on = validated.secured
    completed = run_kdiv(
        on.env,
        "reconcile",
        "--app-id",
        validated.app_id,
        "--topics",
        validated.topic,
        "--registry-url",
        validated.registry_url,
        "--out",
        str(tmp_path),
        "--kafka-source",
        "spark",
    )
    said = completed.stdout + completed.stderr
    assert completed.returncode == 0, said
    (report,) = tmp_path.iterdir()
    summary = json.loads((report / "summary.json").read_text())
    assert (summary["status"], summary["kafka_source"]) == ("clean", "spark")
    assert summary["records_read"][validated.topic] == validated.records
    assert PASSWORD not in said


# -- refused: one line, in bounded time, no secret -------------------------------------------------


def test_a_refused_worker_exits_with_one_line(refused, tmp_path):
    on, said = refused
    worker = WorkerProcess(
        "refused", bootstrap=on.bootstrap, topics=["any"], app_id="refused", workdir=tmp_path, env=on.env
    )
    worker.start()
    try:
        code = worker._running.wait(timeout=REFUSED_WITHIN_S)
    finally:
        worker.terminate()
    assert code != 0
    line = assert_one_clear_line(worker.log_text(current_run_only=True), said)
    assert line.startswith(f"kdiv worker: Kafka at {on.bootstrap}: ")


async def test_a_refused_writer_raises_one_line(refused):
    on, said = refused
    started = time.monotonic()
    with pytest.raises(BrokerRefused) as refusal:
        await asyncio.wait_for(DivWriter.start(on.bootstrap, security=on.security), REFUSED_WITHIN_S)
    assert time.monotonic() - started < REFUSED_WITHIN_S
    assert_one_clear_line(str(refusal.value.args[0]), said)


@pytest.mark.parametrize("command", ["dump", "validate"])
def test_refused_kdiv_commands_say_one_line(refused, command):
    on, said = refused
    completed = run_kdiv(on.env, command, "any-topic")
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert assert_one_clear_line(completed.stderr, said).startswith(f"Error: Kafka at {on.bootstrap}: ")


def test_a_refused_registry_says_one_line(refused):
    on, said = refused
    completed = run_kdiv(on.env, "registry", "--port", "0")
    assert completed.returncode == 2
    line = assert_one_clear_line(completed.stderr, said, service=True)
    assert line.startswith(f"Error: Kafka at {on.bootstrap}: ")


def test_a_refused_nightly_job_reports_one_line(refused, spark, tmp_path):
    on, said = refused
    args = parse_args(["--app-id", "x", "--topics", "any", "--out", str(tmp_path), "--kafka-source", "python"])
    lines: list[str] = []
    code, report = Reconciliation(args, settings_from(args, on.env), spark, lambda m, err=False: lines.append(m)).run()
    assert code == 2 and report is not None
    summary = json.loads((report / "summary.json").read_text())
    assert_one_clear_line(summary["error"], said)
    assert lines[0] == f"reconciliation failed: {summary['error']}"
    assert PASSWORD not in (report / "report.html").read_text()


def test_kdiv_reconcile_refused_says_one_line_of_its_own(secured, pki, tmp_path):
    on = settings_for("SASL_SSL", secured, pki)
    completed = run_kdiv(
        {**on.env, "KDIV_SASL_PASSWORD": WRONG_PASSWORD},
        "reconcile",
        "--app-id",
        "x",
        "--topics",
        "any",
        "--out",
        str(tmp_path),
        "--kafka-source",
        "spark",
    )
    said = completed.stdout + completed.stderr  # spark-submit may hand the driver's stderr to stdout
    assert completed.returncode == 2, said
    failures = [line for line in said.splitlines() if line.startswith("reconciliation failed:")]
    assert len(failures) == 1, said
    assert failures[0].startswith(f"reconciliation failed: Kafka at {on.bootstrap}: SASL authentication failed")
    assert "Traceback" not in said
    assert WRONG_PASSWORD not in said and PASSWORD not in said
