"""The nightly job on a Spark standalone cluster (a master and two workers, each its own JVM),
submitted by the cluster command of docs/reconcile.md: the application registers with the master, its
tasks run on executors the two workers started, and its findings are those of a local-mode
run of the same job on the same snapshot."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kdiv.config.settings import RegistrySettings
from kdiv.dev.changefeed import write_changefeed
from kdiv.reconcile.job import Reconciliation, parse_args, settings_from
from kdiv.reconcile.report import SUMMARY_JSON
from tests.harness.processes import REPO
from tests.harness.spark_cluster import StandaloneCluster
from tests.integration.test_reconcile_changefeeds import FAULTS_AT, VERDICTS
from tests.integration.test_reconcile_job import without_timing

pytestmark = pytest.mark.broker

ROWS = 240
# docs/reconcile.md's line, placeholders and all: the test runs that line with them filled in.
DOCUMENTED_LINE = re.compile(r"^kdiv reconcile --master spark://HOST:7077 .*$", re.MULTILINE)


def documented_cluster_command(master: str, out: Path, textfile: Path) -> list[str]:
    (line,) = DOCUMENTED_LINE.findall((REPO / "docs" / "reconcile.md").read_text())
    words = shlex.split(line)
    assert words[:4] == ["kdiv", "reconcile", "--master", "spark://HOST:7077"], line
    filled = {"kdiv": str(Path(sys.executable).with_name("kdiv")), "spark://HOST:7077": master}
    for option, value in (("--out", out), ("--textfile", textfile)):
        filled[words[words.index(option) + 1]] = str(value)
    return [filled.get(word, word) for word in words]


def findings(spark, report: Path) -> set[tuple]:
    """Every column of every finding the report's Parquet holds."""
    return {
        tuple(sorted((k, repr(v)) for k, v in row.asDict(recursive=True).items()))
        for row in spark.read.parquet(str(report / "discrepancies")).collect()
    }


def task_executors(event_log_dir: Path, app_id: str) -> dict[str, int]:
    """Tasks ended per executor id, from the application's Spark event log."""
    (log,) = [p for p in event_log_dir.iterdir() if p.name.startswith(app_id)]
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerTaskEnd":
            executor = event["Task Info"]["Executor ID"]
            counts[executor] = counts.get(executor, 0) + 1
    return counts


async def test_the_documented_cluster_command_runs_the_job_on_the_clusters_executors(
    bootstrap, registry_url, topic_factory, spark, tmp_path
):
    topic = topic_factory(2)
    planted = await write_changefeed(
        bootstrap, topic, RegistrySettings(url=registry_url), rows=ROWS, partitions=2, faults_at=FAULTS_AT, seed=5
    )
    expected = {(p, o, VERDICTS[fault]) for fault, where in planted.faults.items() for p, o in where}
    assert len(expected) == len(FAULTS_AT)
    settings_env = {
        "KDIV_BOOTSTRAP": bootstrap,
        "KDIV_APP_ID": f"cluster-{uuid.uuid4().hex[:8]}",  # no worker ran: changefeeds need no state
        "KDIV_SCHEMA_REGISTRY_URL": registry_url,
        "KDIV_TICDC_TOPICS": topic,
        "KDIV_TICDC_PROTOCOL": "avro",
    }
    # The event log (from spark-defaults.conf, as an operator would set it) says where tasks ran.
    conf_dir, event_log = tmp_path / "conf", tmp_path / "events"
    conf_dir.mkdir()
    event_log.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {event_log.as_uri()}\n"
        # One plain file per application, to read back here.
        "spark.eventLog.rolling.enabled false\nspark.eventLog.compress false\n"
    )
    out, textfile = tmp_path / "reports", tmp_path / "kdiv.prom"

    with StandaloneCluster(tmp_path / "cluster", workers=2) as cluster:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KDIV_", "SPARK_", "PYSPARK_"))}
        env.update(settings_env, SPARK_CONF_DIR=str(conf_dir), SPARK_LOCAL_IP="127.0.0.1")
        command = documented_cluster_command(cluster.url, out, textfile)
        completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        said = completed.stdout + completed.stderr
        assert completed.returncode == 1, said[-4000:]
        master = cluster.master_json()
        workers = [cluster.worker_json(i) for i in range(2)]

    # The application registered with the master, under the job's name, and finished.
    apps = [a for a in master["completedapps"] + master["activeapps"] if a["name"] == "kdiv-reconcile"]
    assert len(apps) == 1, f"the master ran {master['completedapps'] + master['activeapps']}"
    (app,) = apps
    assert app["state"] == "FINISHED", app
    # Each worker started an executor of it, in its own JVM and work directory...
    for index, worker in enumerate(workers):
        ran = [e for e in worker["executors"] + worker["finishedexecutors"] if e["appid"] == app["id"]]
        assert len(ran) == 1, worker
        assert (cluster.worker_dir(index) / app["id"] / str(ran[0]["id"]) / "stderr").is_file()
    # ... and the tasks ran on those executors, none on the driver.
    per_executor = task_executors(event_log, app["id"])
    assert set(per_executor) == {
        str(e["id"]) for w in workers for e in w["finishedexecutors"] if e["appid"] == app["id"]
    }
    assert "driver" not in per_executor and min(per_executor.values()) > 0, per_executor

    # The planted faults, found...
    (report,) = out.iterdir()
    summary = json.loads((report / SUMMARY_JSON).read_text())
    assert summary["status"] == "discrepancies", summary
    found = {
        (r["partition"], r["offset"], r["class"]) for r in spark.read.parquet(str(report / "discrepancies")).collect()
    }
    assert found == expected
    assert "kdiv_reconcile_status 1.0" in textfile.read_text()

    # ... and exactly what local mode finds on the same snapshot, through the same source.
    args = parse_args(
        [
            "--out", str(tmp_path / "local"),
            "--snapshot", str(report / "snapshot.json"),
            "--kafka-source", summary["kafka_source"],
        ]
    )  # fmt: skip
    code, local = Reconciliation(args, settings_from(args, settings_env), spark, lambda m, err=False: None).run()
    assert code == 1 and local is not None
    assert findings(spark, local) == findings(spark, report)
    assert without_timing(json.loads((local / SUMMARY_JSON).read_text())) == without_timing(summary)
