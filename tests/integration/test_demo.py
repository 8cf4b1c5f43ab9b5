"""The demo's fault injections produce the verdicts they are meant to show, on a real broker."""

from __future__ import annotations

from collections import Counter

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.config.settings import Settings
from kdiv.dev.demo import FAULTS, FaultyPipeline, run_demo
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import readable_div_header
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.discovery import discover
from kdiv.writer import DivWriter

pytestmark = pytest.mark.broker


async def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


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
        ("reordering", [("MISSING", False), ("DUPLICATE", False)]),
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


async def test_demo_run_shows_every_fault_class(bootstrap, topic_factory):
    topic = topic_factory(2)
    compacted = f"{topic}-compacted"
    await run_demo(
        bootstrap,
        topic,
        2,
        rate=400,
        fault_every_s=0.15,
        duration_s=len(FAULTS) * 0.15 + 0.6,
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
        "DUPLICATE",
        "CORRUPT",
        "UNREGISTERED_PRODUCER",
        "DATA_AFTER_SEGMENT_END",
        "MALFORMED",
        "UNTRACKED",
    }
