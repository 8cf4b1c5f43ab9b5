"""The demo's pipeline hop on a real broker: the demo writer traces its topic, `kdiv processor`'s
instances restart under load, and judging the topics at rest names exactly the records they
dropped (what the dev stack's worker and nightly job show)."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.dev.demo import run_demo
from kdiv.dev.processor import run_processors
from kdiv.kafka.consume import read_snapshot
from kdiv.trace.header import find_trace
from kdiv.trace.judge import Observation, TraceOutcome, judge_at_rest
from kdiv.trace.routes import parse_routes


async def observations(bootstrap: str, route: str, stage: int, topic: str) -> list[Observation]:
    found = []
    async for record in read_snapshot(bootstrap, topic):
        stamp = find_trace(record.headers)
        if stamp is not None:
            where = (record.partition, record.offset, record.timestamp)
            found.append(Observation(stamp.trace_id, route, stage, topic, *where, stamp.origin_ms))
    return found


async def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[tuple[str, str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        found = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    return {(group, tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}


async def test_the_demo_hop_drops_at_its_restarts_and_the_traces_name_exactly_those(bootstrap, topic_factory):
    source, sink = topic_factory(2), f"sink-{uuid.uuid4().hex[:8]}"
    group = f"hop-{uuid.uuid4().hex[:8]}"
    # No DIV fault injected: a re-sent source record would carry its trace twice.
    writing = asyncio.create_task(
        run_demo(bootstrap, source, 2, rate=300, fault_every_s=3600, duration_s=7, tracing=f"{source}=1")
    )
    ledger = await run_processors(
        bootstrap,
        source,
        sink,
        group,
        fault="drop",
        instances=2,
        restart_every_s=2,
        duration_s=10,
        partitions=2,
        # Batches that linger: a restart's rebalance always finds a buffer to drop.
        batch_size=10_000,
        linger_s=1.5,
    )
    await writing
    assert ledger.lost, "no restart dropped a buffer: the test proves nothing"

    (route,) = parse_routes(f"demo={source}>{group}>{sink}")
    seen = await observations(bootstrap, "demo", 0, source) + await observations(bootstrap, "demo", 1, sink)
    traced = {o.trace_id for o in seen if o.stage == 0}
    assert len(traced) > 500, "the demo traced too few records"
    assert len(traced) == sum(1 for o in seen if o.stage == 0), "every demo record has its own trace"
    result = judge_at_rest([route], seen, await committed(bootstrap, group, source, 2))
    lost = {(v.source[1], v.source[2]) for v in result.verdicts if v.outcome is TraceOutcome.LOST and v.source}
    assert lost == ledger.lost
    duplicated = {v.source for v in result.verdicts if v.outcome is TraceOutcome.DUPLICATED}
    assert {(w[1], w[2]) for w in duplicated if w} == ledger.duplicated
    assert result.counts["demo"]["DELIVERED"] == len(traced) - len(lost) - result.counts["demo"]["PENDING"]
