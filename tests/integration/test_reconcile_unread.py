"""What the nightly job could not take for validated: records the live worker has not
validated (past its committed offsets, older than KDIV_UNVALIDATED_AFTER_S), and records deleted
between the snapshot and the read, through either Kafka source. Real broker, worker and Spark.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from confluent_kafka import Producer

from kdiv.reconcile.job import Reconciliation, parse_args, settings_from
from kdiv.writer import DivWriter
from tests.harness.broker import exact_end_offsets, wait_until_caught_up
from tests.harness.processes import WorkerProcess
from tests.integration.test_reconcile_job import found_in

pytestmark = pytest.mark.broker


def reconcile(spark, bootstrap, registry_url, app_id, topics, out: Path, *extra: str, env=None):
    args = parse_args(
        [
            "--bootstrap",
            bootstrap,
            "--app-id",
            app_id,
            "--topics",
            ",".join(topics),
            "--registry-url",
            registry_url,
            "--out",
            str(out),
            "--kafka-source",
            "python",
            *extra,
        ]
    )
    lines: list[str] = []
    run = Reconciliation(args, settings_from(args, env or {}), spark, lambda m, err=False: lines.append(m))
    code, report = run.run()
    assert report is not None
    return code, report, json.loads((report / "summary.json").read_text()), lines


async def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def validated_by_a_worker(bootstrap, topic, app_id, tmp_path, writer, records: int) -> None:
    """`records` records on partition 0 of `topic`, validated and committed by a worker that then stops."""
    for i in range(records):
        await writer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=0)
    await writer.flush()
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        # Partitions without records get no committed offset: only the others are waited for.
        ends = {p: end for p, end in (await exact_end_offsets(bootstrap, topic)).items() if end}
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], ends=ends)
    finally:
        worker.terminate()


async def test_records_the_stalled_worker_never_validated_are_a_finding_and_newer_ones_lag(
    bootstrap, registry_url, spark, tmp_path
):
    run = uuid.uuid4().hex[:8]
    topic, app_id = f"stalled-{run}", f"stalled-{run}"
    await create(bootstrap, topic, 2)
    async with await DivWriter.start(bootstrap) as writer:
        await validated_by_a_worker(bootstrap, topic, app_id, tmp_path, writer, 10)
    # The worker is gone: what follows it never validates. Record times say when it was
    # written: an hour and two ago, then now.
    now_ms = int(time.time() * 1000)
    hour_ago, two_hours_ago = now_ms - 3_600_000, now_ms - 7_200_000
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        producer.produce(topic, b"old%d" % i, key=b"o%d" % i, partition=0, timestamp=hour_ago + i)
    for i in range(4):
        producer.produce(topic, b"older%d" % i, key=b"p%d" % i, partition=1, timestamp=two_hours_ago + i)
    for i in range(5):
        producer.produce(topic, b"new%d" % i, key=b"n%d" % i, partition=0)
    assert producer.flush(30) == 0

    # KDIV_UNVALIDATED_AFTER_S at its default, 300 s.
    code, report, summary, _ = reconcile(spark, bootstrap, registry_url, app_id, [topic], tmp_path / "r")

    assert code == 1, summary
    not_validated = summary["not_validated"]
    assert (not_validated["status"], not_validated["group"], not_validated["group_known"]) == ("checked", app_id, True)
    assert (not_validated["after_s"], not_validated["unvalidated"], not_validated["lag"]) == (300, 34, 6)
    by_partition = {p["partition"]: p for p in not_validated["partitions"]}
    # Partition 0: the worker validated the writer's START_OF_SEGMENT and 10 records; its
    # END_OF_SEGMENT, sent as the writer closed, and the 5 new records are lag.
    assert by_partition[0] == {
        "topic": topic,
        "partition": 0,
        "committed": 11,
        "unvalidated": 30,
        "first_offset": 12,
        "oldest_ms": hour_ago,
        "lag": 6,
    }
    # Partition 1: the worker committed nothing there (no record then): from its start.
    assert by_partition[1] == {
        "topic": topic,
        "partition": 1,
        "committed": None,
        "unvalidated": 4,
        "first_offset": 0,
        "oldest_ms": two_hours_ago,
        "lag": 0,
    }
    assert (summary["counts"]["NOT_VALIDATED"], summary["records"]["NOT_VALIDATED"]) == (2, 34)
    assert {f for f in found_in(spark, report) if f[0] == "NOT_VALIDATED"} == {
        ("NOT_VALIDATED", topic, 0, 12, None),
        ("NOT_VALIDATED", topic, 1, 0, None),
    }
    page = (report / "report.html").read_text()
    assert "34 records the live worker has not validated" in page.split("</h1>")[0]
    assert (report / "worker_offsets.json").is_file()

    # A bound the records are within: lag, no finding; the same snapshot and offsets.
    again = ["--snapshot", str(report / "snapshot.json")]
    patient = {"KDIV_UNVALIDATED_AFTER_S": "14400"}
    code, _, summary, _ = reconcile(
        spark, bootstrap, registry_url, app_id, [topic], tmp_path / "again", *again, env=patient
    )
    assert (code, summary["not_validated"]["unvalidated"], summary["not_validated"]["lag"]) == (0, 0, 40), summary
    assert summary["counts"]["NOT_VALIDATED"] == 0


@pytest.mark.parametrize("source", ["python", "spark"])
async def test_records_deleted_between_the_snapshot_and_the_read_are_reported_not_a_crash(
    bootstrap, registry_url, spark, tmp_path, source
):
    run = uuid.uuid4().hex[:8]
    topic, app_id = f"deleted-{source}-{run}", f"deleted-{source}-{run}"
    await create(bootstrap, topic, 1)
    writer = await DivWriter.start(bootstrap)
    async with writer:
        await validated_by_a_worker(bootstrap, topic, app_id, tmp_path, writer, 40)
    code, first, summary, _ = reconcile(spark, bootstrap, registry_url, app_id, [topic], tmp_path / "first")
    assert (code, summary["vanished"]) == (0, []), summary
    planned = summary["records_read"][topic]
    # Whose records: the cluster and the topic's incarnation, in the summary and on the page.
    assert isinstance(summary["cluster_id"], str) and summary["cluster_id"], summary
    assert isinstance(summary["topic_ids"][topic], str) and summary["topic_ids"][topic], summary
    assert summary["cluster_id"] in (first / "report.html").read_text()

    # The seam: the snapshot is taken (first run), records are deleted, the job reads them.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=15)}, timeout_ms=10_000)
    finally:
        await admin.close()
    again = ["--snapshot", str(first / "snapshot.json"), "--kafka-source", source]
    code, report, summary, lines = reconcile(spark, bootstrap, registry_url, app_id, [topic], tmp_path / "r", *again)

    assert summary["status"] != "failed", summary.get("error")
    assert summary["vanished"] == [{"topic": topic, "partition": 0, "from": 0, "to": 15, "log_start": 15}]
    assert summary["records_read"][topic] == planned - 15
    assert any(f"{topic}[0]: offsets [0, 15) were deleted before they could be read" in line for line in lines)
    page = (report / "report.html").read_text()
    assert 'id="vanished"' in page
    # Not a compacted topic: no key comparison, and each producer's highest sequence is intact.
    assert code == 0, summary
