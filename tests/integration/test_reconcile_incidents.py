"""The reconciliation sets the workers' live incidents beside its findings: what the incidents
topic holds per topic and class, detected between the end of the previous run's count (its
snapshot) and this run's snapshot, in the report's topic rows and in summary.json; without an
incidents topic, it says the counts are unknown rather than showing zeros.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from confluent_kafka import Producer

from kdiv.incident.shape import Incident
from kdiv.state.tables import changelog_topic_name
from tests.integration.test_reconcile_job import reconcile_in_process
from tests.integration.test_reconcile_report import _Page, table_dicts

pytestmark = pytest.mark.broker


def incident(topic: str, verdict: str, seq: int, detected_at_ms: int) -> Incident:
    return Incident(
        topic=topic,
        partition=0,
        producer="0a" * 16,
        segment=1,
        seq=seq,
        verdict=verdict,
        offset=seq,
        severity="warning",
        detail=f"seq {seq}",
        record_timestamp_ms=detected_at_ms,
        detected_at_ms=detected_at_ms,
    )


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    # A new topic reaches each broker's metadata in its own time: until every partition has a
    # leader, records sent to it can fail.
    for _ in range(300):
        metadata = producer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is None and metadata.partitions and all(p.leader >= 0 for p in metadata.partitions.values()):
            break
        time.sleep(0.1)
    failures: list = []

    def delivered(error, _message) -> None:
        if error is not None:
            failures.append(error)

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert failures == []


def run(spark, bootstrap, registry_url, app_id, orders, out: Path) -> tuple[dict, dict[str, dict[str, str]]]:
    code, report, lines = reconcile_in_process(spark, bootstrap, registry_url, app_id, [orders], out)
    assert code == 0, lines
    summary = json.loads((report / "summary.json").read_text())
    page = _Page((report / "report.html").read_text(encoding="utf-8"))
    rows = {row["Topic"]: row for row in table_dicts(page, "counts-by-topic")}
    return summary, rows


async def test_live_incidents_of_the_window_are_counted_by_topic_and_class(bootstrap, registry_url, spark, tmp_path):
    tag = uuid.uuid4().hex[:8]
    orders, app_id = f"orders-{tag}", f"inc-{tag}"
    incidents_topic = f"{app_id}-incidents"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # An empty watched topic and the worker's (empty) state: nothing to find at rest.
        await admin.create_topics(
            [
                NewTopic(orders, 1, 1),
                NewTopic(changelog_topic_name(app_id, 1), 1, 1, topic_configs={"cleanup.policy": "compact"}),
            ]
        )
    finally:
        await admin.close()
    out = tmp_path / "reports"

    # No incidents topic yet: unknown, not zero.
    summary, rows = run(spark, bootstrap, registry_url, app_id, orders, out)
    first_snapshot = summary["snapshot"]["taken_at_ms"]
    assert summary["incidents"] == {
        "topic": incidents_topic,
        "status": "missing",
        "window": {"from_ms": None, "to_ms": first_snapshot},
    }
    assert rows[orders]["Live incidents"] == rows["All topics"]["Live incidents"] == "unknown"

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(incidents_topic, 2, 1, topic_configs={"cleanup.policy": "compact"})])
    finally:
        await admin.close()
    # Counted by the next run, whose window is the whole topic (the run before counted nothing).
    earlier = incident(orders, "MISSING", 40, first_snapshot - 1)
    produce(bootstrap, incidents_topic, [(earlier.key, earlier.value)])
    summary, rows = run(spark, bootstrap, registry_url, app_id, orders, out)
    second_snapshot = summary["snapshot"]["taken_at_ms"]
    assert summary["incidents"] == {
        "topic": incidents_topic,
        "status": "read",
        "window": {"from_ms": None, "to_ms": second_snapshot},
        "by_topic": {orders: {"MISSING": 1}},
        "held": 1,
        "outside_window": 0,
        "malformed": 0,
        "first_malformed": None,
    }
    assert rows[orders]["Live incidents"].startswith("1MISSING: 1/incidents/?topic=")

    in_window = second_snapshot + 1
    missing = [incident(orders, "MISSING", seq, in_window) for seq in (1, 2, 3)]
    corrupt = [incident(orders, "CORRUPT", seq, in_window) for seq in (7, 8)]
    replayed = incident(orders, "CORRUPT", 7, in_window + 1)  # the same fault again: counted once
    elsewhere = incident(f"payments-{tag}", "MISSING", 1, in_window)
    withdrawn = incident(orders, "DUPLICATE", 9, in_window)
    produce(
        bootstrap,
        incidents_topic,
        [
            *((i.key, i.value) for i in (*missing, *corrupt, replayed, elsewhere, withdrawn)),
            (withdrawn.key, None),  # a tombstone: the incident is gone
            (b"not-an-incident", b'{"topic": 5}'),
            (b"not-json", b"\xff not even JSON"),
            # An incident in form, with a time no Spark long holds: malformed too, not a failed read.
            (b"far-future", incident(orders, "MISSING", 99, 10**30).value),
        ],
    )

    summary, rows = run(spark, bootstrap, registry_url, app_id, orders, out)
    counted = summary["incidents"]
    malformed = counted.pop("first_malformed")
    assert counted == {
        "topic": incidents_topic,
        "status": "read",
        "window": {"from_ms": second_snapshot, "to_ms": summary["snapshot"]["taken_at_ms"]},
        "by_topic": {orders: {"CORRUPT": 2, "MISSING": 3}, f"payments-{tag}": {"MISSING": 1}},
        "held": 7,
        "outside_window": 1,
        "malformed": 3,
    }
    assert malformed["partition"] in (0, 1) and malformed["offset"] >= 0
    assert malformed["error"], malformed
    cell = rows[orders]["Live incidents"]
    # The total is the table's topics'; the notes name the incidents on others.
    assert rows["All topics"]["Live incidents"] == "5"
    assert cell.startswith("5CORRUPT: 2MISSING: 3/incidents/?topic=" + orders), cell
    assert f"since={second_snapshot}" in cell and f"until={summary['snapshot']['taken_at_ms']}" in cell
    # Only the incidents count toward what the snapshot planned to compare.
    assert summary["snapshot"]["records_planned"] == 0
