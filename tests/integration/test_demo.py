"""The demo's fault injections produce the verdicts they are meant to show, on a real broker."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from kdiv.config.security import PLAINTEXT
from kdiv.config.settings import Settings
from kdiv.dev.demo import (
    AT_REST_FAULTS,
    COMPACTED_TOPIC_CONFIG,
    FAULTS,
    AtRestFaults,
    FaultyPipeline,
    ensure_topic,
    run_demo,
)
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import Kind, readable_div_header
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.discovery import discover
from kdiv.writer import DivWriter
from tests.harness.broker import delete_topic, read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess
from tests.integration.test_reconcile_job import found_in, reconcile_in_process

pytestmark = pytest.mark.broker


async def faults_in(bootstrap: str, topic: str):
    validator = DataIntegrityValidator()
    results = [validator.validate(r, 0) async for r in read_snapshot(bootstrap, topic)]
    return [(r.verdict.value, r.fatal) for r in results if r.verdict.is_fault]


@pytest.mark.parametrize(
    "fault,expected",
    [
        ("loss", [("MISSING", False)]),
        ("duplicate", [("DUPLICATE", False)]),
        ("corruption", [("CORRUPT", False)]),
        ("reordering", [("MISSING", False), ("LATE", False)]),
        ("divergent", [("DIVERGENT", False)]),
        ("unregistered", [("UNREGISTERED_PRODUCER", False)]),
        # Inside the push state stays before the gap (as in Venice), so END_OF_PUSH is missing
        # too; the END_OF_SEGMENT after the push is reported once more, then state moves on.
        ("push-failure", [("MISSING", True), ("MISSING", True), ("MISSING", False)]),
        # Only a finalised ADHASH rejects late data; the demo's writer uses ADHASH.
        ("data-after-end", [("DATA_AFTER_SEGMENT_END", False)]),
        ("malformed", [("MALFORMED", False)]),
        ("untracked", []),
    ],
)
async def test_each_injected_fault_shows_its_verdict(bootstrap, topic_factory, fault, expected):
    topic = topic_factory(1)
    # NONE, so that the END_OF_SEGMENT does not echo the fault, except where ADHASH is the point.
    checksum_type = 4 if fault == "data-after-end" else 0
    writer = await DivWriter.start(bootstrap, checksum_type=checksum_type)
    pipeline = FaultyPipeline(writer, topic)
    for _ in range(3):
        await pipeline.healthy(0)
    await pipeline.inject(fault, 0)
    for _ in range(2):
        await pipeline.healthy(0)
    await writer.close()
    assert await faults_in(bootstrap, topic) == expected
    if fault == "untracked":
        validator = DataIntegrityValidator()
        verdicts = [validator.validate(r, 0).verdict.value async for r in read_snapshot(bootstrap, topic)]
        assert verdicts.count("UNTRACKED") == 1


def readable_data_key(record) -> bool:
    """A data record with a key (not a control record, whose key names its producer)."""
    header = readable_div_header(record.headers)
    return header is not None and header.kind == Kind.DATA and record.key is not None and record.value is not None


async def test_demo_run_shows_every_fault_class(bootstrap, topic_factory):
    topic = topic_factory(2)
    compacted = f"{topic}-compacted"
    await run_demo(
        bootstrap,
        topic,
        2,
        rate=400,
        fault_every_s=0.15,
        duration_s=2 * len(FAULTS) * 0.15 + 0.6,  # two passes of the schedule: one may be slow under load
        writers=3,
        restart_every_s=0.5,
        compacted_topic=compacted,
    )
    try:
        validator = DataIntegrityValidator()
        records = [r async for r in read_snapshot(bootstrap, topic)]
        seen = Counter([validator.validate(r, 0).verdict.value for r in records])
        # Three producers at once, and restarts: each a new GUID.
        guids = {h.guid for r in records if (h := readable_div_header(r.headers)) is not None}
        assert len(guids) >= 4

        # The compacted topic: compacted by its config, a small key space updated over and over,
        # every record validating clean.
        kept = [r async for r in read_snapshot(bootstrap, compacted)]
        assert len(kept) > len({r.key for r in kept}) and len({r.key for r in kept if r.value}) <= 200
        assert {r.partition for r in kept} == {0, 1}
        checker = DataIntegrityValidator()
        assert {checker.validate(r, 0).verdict.value for r in kept} == {"OK"}
        # As a worker watching it sees it: compacted, so its key ledger is kept.
        settings = Settings.from_env({"KDIV_BOOTSTRAP": bootstrap, "KDIV_TOPICS": compacted})
        cluster = await discover(settings, wait_s=0, create_own=False)
        assert [t.compaction_lag_ms for t in cluster.topics] == [60_000]
    finally:
        await delete_topic(bootstrap, compacted)
    # Every verdict a validator can give shows up in one pass of the schedule.
    assert set(seen) == {
        "OK",
        "MISSING",
        "LATE",
        "DUPLICATE",
        "DIVERGENT",
        "CORRUPT",
        "UNREGISTERED_PRODUCER",
        "DATA_AFTER_SEGMENT_END",
        "MALFORMED",
        "UNTRACKED",
    }


async def test_at_rest_faults_are_what_the_nightly_reconciliation_finds(bootstrap, registry_url, spark, tmp_path):
    """A worker validates the demo's compacted topic; the demo deletes the head of one
    partition (DeleteRecords) and alters the worker's key ledger at rest: the reconciliation
    finds every key the deletion removed LOST, one DIVERGED and one UNVALIDATED."""
    app_id = f"atrest-{uuid.uuid4().hex[:8]}"
    topic = f"kdiv-demo-at-rest-{app_id}"  # created compacted here (topic_factory's are not)
    await ensure_topic(bootstrap, topic, 2, config=dict(COMPACTED_TOPIC_CONFIG))
    worker = WorkerProcess("atrest", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    writer = await DivWriter.start(bootstrap)
    try:
        worker.start()
        await worker.wait_ready()
        pipeline = FaultyPipeline(writer, topic, keys=20)
        for n in range(200):
            await pipeline.healthy(n % 2)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        # Partition 1's keys: the deletion through the LOST key removes their latest records.
        keys_before = {r.key async for r in read_snapshot(bootstrap, topic, [1]) if readable_data_key(r)}
        at_rest = AtRestFaults(bootstrap, pipeline, app_id, 2, PLAINTEXT)
        for finding in AT_REST_FAULTS:
            assert await at_rest.inject(finding, 1, wait_s=30), finding
        await writer.close()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        code, report, lines = reconcile_in_process(spark, bootstrap, registry_url, app_id, [topic], tmp_path / "out")
    finally:
        worker.terminate()
        await writer.close()
        await delete_topic(bootstrap, topic)
    assert code == 1, lines
    found = sorted((c, t, p, k) for c, t, p, _offset, k in found_in(spark, report))
    assert keys_before, "partition 1 held keys before the deletion"
    assert found == sorted(
        [
            ("DIVERGED", topic, 1, b"at-rest-diverged-1"),
            ("UNVALIDATED", topic, 1, b"at-rest-unvalidated-2"),
            *(("LOST", topic, 1, key) for key in keys_before | {b"at-rest-lost-0"}),
        ]
    )
    # No live incident: the deleted records had been validated.
    assert await read_incidents(bootstrap, app_id) == {}
