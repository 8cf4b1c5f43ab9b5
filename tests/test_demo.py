"""The demo's fault injections produce the verdicts they are meant to show, on a real broker."""

from __future__ import annotations

from collections import Counter

import pytest

from app.consume import read_snapshot
from app.demo import FAULTS, FaultyPipeline, run_demo
from app.div.validator import DataIntegrityValidator
from app.writer import DivWriter

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
        ("reordering", [("MISSING", False), ("DUPLICATE", False)]),
        ("unregistered", [("UNREGISTERED_PRODUCER", False)]),
        # Inside the push state stays before the gap (as in Venice), so END_OF_PUSH is missing
        # too; the END_OF_SEGMENT after the push is reported once more, then state moves on.
        ("push-failure", [("MISSING", True), ("MISSING", True), ("MISSING", False)]),
    ],
)
async def test_each_injected_fault_shows_its_verdict(bootstrap, topic_factory, fault, expected):
    topic = topic_factory(1)
    writer = await DivWriter.start(bootstrap, checksum_type=0)  # NONE: no END_OF_SEGMENT echo of the fault
    pipeline = FaultyPipeline(writer, topic)
    for _ in range(3):
        await pipeline.healthy(0)
    await pipeline.inject(fault, 0)
    for _ in range(2):
        await pipeline.healthy(0)
    await writer.close()
    assert await faults_in(bootstrap, topic) == expected


async def test_demo_run_shows_every_fault_class(bootstrap, topic_factory):
    topic = topic_factory(2)
    await run_demo(bootstrap, topic, 2, rate=400, fault_every_s=0.15, duration_s=1.6)
    seen = Counter(verdict for verdict, _ in await faults_in(bootstrap, topic))
    assert {"MISSING", "DUPLICATE", "CORRUPT", "UNREGISTERED_PRODUCER"} <= set(seen)
    assert len(FAULTS) == 6
