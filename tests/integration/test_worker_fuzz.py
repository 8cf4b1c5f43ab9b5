"""Broken `div` headers through a live worker: it keeps running, reports each broken record
as MALFORMED at its offset, and nothing about the well-formed producer."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaProducer

from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.fuzz import fuzz_stream
from tests.harness.processes import WorkerProcess


async def test_a_live_worker_reports_every_broken_header_at_its_offset(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(1)
    app_id = f"fuzz-{uuid.uuid4().hex[:8]}"
    stream = fuzz_stream(3000, seed=7, topic=topic)
    worker = WorkerProcess("fuzz", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=1 << 20)
        await producer.start()
        try:
            offsets = []
            for r in stream:
                sent = await producer.send_and_wait(topic, r.value, r.key, partition=0, headers=list(r.headers))
                offsets.append(sent.offset)
        finally:
            await producer.stop()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=120)
        assert worker.alive and "Traceback" not in worker.log_text()
    finally:
        worker.terminate()
    incidents = [versions[-1] for versions in (await read_incidents(bootstrap, app_id)).values()]
    broken = {offset for offset, r in zip(offsets, stream, strict=True) if r.mutation is not None}
    assert len(broken) > 1000
    assert {i.verdict for i in incidents} == {"MALFORMED"}
    assert sorted(i.offset for i in incidents) == sorted(broken)
    assert all(i.detail for i in incidents)
