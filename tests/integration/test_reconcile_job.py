"""The reconciliation job end to end: a real worker validates real topics on the broker, the
topics are then rewritten to plant each discrepancy class, and the job must find exactly
those; a clean pipeline gives a clean report; the same snapshot gives the same report, read
through Spark's kafka source or kdiv's own; --repair registers what SUBJECT_MISMATCH names.

The planted run goes through `kdiv reconcile` (spark-submit); the others share the test
session's SparkSession.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from confluent_kafka import Producer

from kdiv.config.settings import RegistrySettings
from kdiv.div.wire import HEADER_NAME, Kind, unpack_common
from kdiv.kafka.consume import read_snapshot
from kdiv.reconcile.job import Reconciliation, parse_args, settings_from
from kdiv.registry.client import SchemaRegistry
from kdiv.state.framing import frame, unframe
from kdiv.writer import DivWriter
from tests.harness.broker import read_table, wait_until_caught_up
from tests.harness.processes import WorkerProcess
from tests.integration.test_schema_subjects import earlier_release_schema

pytestmark = pytest.mark.broker


def kind_of(record) -> int | None:
    for name, value in record.headers:
        if name == HEADER_NAME and value and len(value) >= 38:
            return unpack_common(value)[1]
    return None


async def read_all(bootstrap: str, topic: str) -> list:
    return [r async for r in read_snapshot(bootstrap, topic)]


async def rewrite(bootstrap: str, topic: str, partitions: int, records: list, configs: dict) -> None:
    """Replace the topic by `records` (in order): Tansu gives a recreated topic offsets from 0."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        for _ in range(50):
            if topic not in await admin.list_topics():
                break
            await asyncio.sleep(0.1)
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
    finally:
        await admin.close()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "max.in.flight": 1})
    for record in records:
        producer.produce(
            topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            headers=[(n, v) for n, v in record.headers],
            timestamp=record.timestamp,
        )
    assert producer.flush(30) == 0


def reconcile_in_process(spark, bootstrap, registry_url, app_id, topics, out: Path, *extra: str):
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
    lines = []
    code, report = Reconciliation(args, settings_from(args, {}), spark, lambda m, err=False: lines.append(m)).run()
    return code, report, lines


def found_in(spark, report: Path) -> set[tuple]:
    rows = spark.read.parquet(str(report / "discrepancies")).collect()
    return {(r["class"], r["topic"], r["partition"], r["offset"], r["key"]) for r in rows}


def without_timing(summary: dict, *also: str) -> dict:
    return {k: v for k, v in summary.items() if k not in ("started_at_ms", "finished_at_ms", "duration_s", *also)}


async def test_reconcile_finds_exactly_the_planted_discrepancies(bootstrap, registry_url, spark, tmp_path):
    run = uuid.uuid4().hex[:8]
    orders, events, app_id = f"orders-{run}", f"events-{run}", f"rec-{run}"
    compact = {"cleanup.policy": "compact"}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(orders, 2, 1, topic_configs=compact), NewTopic(events, 1, 1)])
    finally:
        await admin.close()
    writer = await DivWriter.start(bootstrap, max_records_per_segment=1000)
    async with writer:
        for i in range(60):
            await writer.send(orders, b"v%d" % i, key=b"k%d" % (i % 16))
        await writer.send(orders, None, key=b"k5")  # a tombstone the validator sees
        for i in range(12):
            await writer.send(events, b"e%d" % i, key=b"e%d" % i)

    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[orders, events], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        for topic in (orders, events):
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
    finally:
        worker.terminate()
    ledger = await read_table(bootstrap, app_id, 2, table="keys")
    assert len(ledger) == 16  # every key of the compacted topic, the tombstoned one included

    # A clean pipeline: nothing found, exit 0.
    code, report, _ = reconcile_in_process(spark, bootstrap, registry_url, app_id, [orders, events], tmp_path / "clean")
    summary = json.loads((report / "summary.json").read_text())
    assert (code, summary["status"]) == (0, "clean"), summary
    assert sum(summary["counts"].values()) == 0
    assert summary["state"]["key"] == 16 and summary["records_read"][orders] > 60

    # Plant. orders partition 0: one latest record corrupted (DIVERGED), one superseded record
    # replaced by a record of a key never seen (UNVALIDATED). Partition 1: its last three
    # records gone (LOST for the keys whose latest record was among them).
    original = await read_all(bootstrap, orders)
    p0 = [r for r in original if r.partition == 0]
    p1 = [r for r in original if r.partition == 1]
    data0 = [r for r in p0 if kind_of(r) == Kind.DATA and r.value is not None]
    latest0 = {r.key: r for r in data0}
    corrupt = next(r for r in reversed(data0) if latest0[r.key] is r)
    superseded = next(r for r in data0 if latest0[r.key] is not r)
    planted0 = [
        replace(r, value=b"X" + r.value[1:])
        if r is corrupt
        else replace(r, key=b"never-seen", value=b"?", headers=())
        if r is superseded
        else r
        for r in p0
    ]
    kept1, dropped1 = p1[:-3], p1[-3:]
    latest1 = {r.key: r for r in p1 if kind_of(r) in (None, Kind.DATA)}
    lost = {
        (r.key, r.offset)
        for r in dropped1
        if latest1.get(r.key) is r and not (r.value is None and all(k.key != r.key for k in kept1))
    }
    assert lost, "the dropped tail holds a key's latest record"
    await rewrite(bootstrap, orders, 2, planted0 + kept1, compact)
    event_records = await read_all(bootstrap, events)
    await rewrite(bootstrap, events, 1, event_records[:-2], {})
    # The state changelog of the 1-partition table: one value framed with an id registered
    # under another application's subject only (restored from the wrong topic), one with an
    # id the registry never gave.
    registry = SchemaRegistry(RegistrySettings(url=registry_url))
    try:
        foreign_id = await registry.register(
            f"other-{run}-state-p1-changelog-value", earlier_release_schema(f"other-{run}")
        )
    finally:
        await registry.close()
    changelog = f"{app_id}-state-p1-changelog"
    table = await read_table(bootstrap, app_id, 1)
    partition_key = f"p|{events}|0".encode()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        changelog, key=partition_key, value=frame(foreign_id, unframe(table[partition_key])[1]), partition=0
    )
    producer.produce(changelog, key=b"p|ghost|0", value=frame(987654, b"\x00"), partition=0)
    # A foreign value whose id does not fit a signed 32-bit int: a finding at its offset.
    producer.produce(changelog, key=b"p|ghost|1", value=b"\x00\xff\xff\xff\xfe\x00\x01", partition=0)
    assert producer.flush(30) == 0
    changelog_records = await read_all(bootstrap, changelog)
    mismatch_offset, unknown_offset, huge_id_offset = (r.offset for r in changelog_records[-3:])

    out = tmp_path / "planted"
    command = [
        str(Path(sys.executable).with_name("kdiv")),
        "reconcile",
        "--bootstrap",
        bootstrap,
        "--app-id",
        app_id,
        "--topics",
        f"{orders},{events}",
        "--registry-url",
        registry_url,
        "--out",
        str(out),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    report = next(out.iterdir())
    summary = json.loads((report / "summary.json").read_text())
    # kdiv reconcile hands spark-submit the connector `kdiv fetch-jars` cached; auto then takes it.
    assert summary["kafka_source"] == "spark", "Spark's kafka connector is not in the cache: run `kdiv fetch-jars`"
    events_seq = max(r.offset for r in event_records)  # the table's producer state: the final END_OF_SEGMENT
    expected = {
        ("DIVERGED", orders, 0, corrupt.offset, corrupt.key),
        ("UNVALIDATED", orders, 0, superseded.offset, b"never-seen"),
        *(("LOST", orders, 1, offset, key) for key, offset in lost),
        ("SEQUENCE_BEHIND", events, 0, events_seq, None),
        ("SUBJECT_MISMATCH", changelog, 0, mismatch_offset, None),
        ("SCHEMA_UNKNOWN", changelog, 0, unknown_offset, None),
        ("SCHEMA_UNKNOWN", changelog, 0, huge_id_offset, None),
    }
    assert found_in(spark, report) == expected
    assert summary["status"] == "discrepancies" and summary["exit_code"] == 1
    html = (report / "report.html").read_text()
    assert "<svg" in html and "SUBJECT_MISMATCH" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # self-contained
    assert "kdiv_reconcile_status 1.0" in (report / "kdiv_reconcile.prom").read_text()
    # The changelog's findings are counted against the records read of it.
    assert summary["changelog_records_read"][changelog] == len(changelog_records)
    assert f'<tr><td><code>{changelog}</code></td><td class="num">{len(changelog_records):,}</td>' in html

    # The same snapshot again (in process), through kdiv's own data source instead of Spark's:
    # the same findings and summary.
    code, again, _ = reconcile_in_process(
        spark,
        bootstrap,
        registry_url,
        app_id,
        [orders, events],
        tmp_path / "again",
        "--snapshot",
        str(report / "snapshot.json"),
    )
    assert code == 1 and again.name == report.name
    assert found_in(spark, again) == expected
    again_summary = json.loads((again / "summary.json").read_text())
    assert again_summary["kafka_source"] == "python"
    assert without_timing(again_summary, "kafka_source") == without_timing(summary, "kafka_source")

    # Subjects from the registry's own log instead of its REST API: the same verdicts.
    code, replayed, _ = reconcile_in_process(
        spark,
        bootstrap,
        "http://127.0.0.1:1",
        app_id,
        [orders, events],
        tmp_path / "replayed",
        "--snapshot",
        str(report / "snapshot.json"),
        "--schemas-topic",
        "_schemas",
    )
    assert code == 1 and found_in(spark, replayed) == expected

    # --repair says what it registers, registers it, and the mismatch is gone.
    code, repaired, lines = reconcile_in_process(
        spark,
        bootstrap,
        registry_url,
        app_id,
        [orders, events],
        tmp_path / "repair",
        "--snapshot",
        str(report / "snapshot.json"),
        "--repair",
    )
    subject = f"{changelog}-value"
    assert f"repair plan: register schema id {foreign_id} under {subject}" in lines
    assert lines.index(f"repair plan: register schema id {foreign_id} under {subject}") < lines.index(
        f"registering schema id {foreign_id} under {subject}"
    )
    code, after, _ = reconcile_in_process(
        spark,
        bootstrap,
        registry_url,
        app_id,
        [orders, events],
        tmp_path / "after",
        "--snapshot",
        str(report / "snapshot.json"),
    )
    assert {f[0] for f in found_in(spark, after)} == {
        "DIVERGED",
        "UNVALIDATED",
        "LOST",
        "SEQUENCE_BEHIND",
        "SCHEMA_UNKNOWN",
    }


async def test_unreachable_broker_is_a_failure_report(spark, tmp_path):
    code, report, lines = reconcile_in_process(spark, "127.0.0.1:1", "http://127.0.0.1:1", "x", ["t"], tmp_path)
    assert code == 2
    summary = json.loads((report / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"]
    assert not re.match(r"(\w+): \1", summary["error"]), summary["error"]  # the type named once
    assert "kdiv_reconcile_status 2.0" in (report / "kdiv_reconcile.prom").read_text()


def test_no_watched_topics_is_a_failure_report_without_a_traceback(tmp_path):
    """Settings the job cannot run with still leave a report (and the gauges say failed)."""
    out = tmp_path / "unset"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDIV_")}
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("kdiv")), "reconcile", "--out", str(out), "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    said = completed.stdout + completed.stderr  # spark-submit may hand the driver's stderr to stdout
    assert "reconciliation failed: bad settings: no watched topics" in said
    assert "Traceback" not in said
    (report,) = out.iterdir()
    summary = json.loads((report / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("bad settings: no watched topics")
    assert "kdiv_reconcile_status 2.0" in (report / "kdiv_reconcile.prom").read_text()
    assert "no watched topics" in (report / "report.html").read_text()
