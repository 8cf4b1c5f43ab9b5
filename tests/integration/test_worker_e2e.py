"""The worker end to end: exactly_once, and topics of different partition counts.

exactly_once: it runs, validates and commits.

On Apache Kafka the counts are exact; on Tansu, which delivers aborted transactions, only
that it runs and commits is asserted after a clean run (no crash here), where the
incidents still equal the oracle's.
"""

from __future__ import annotations

import asyncio
import uuid

from kdiv.writer import DivWriter
from tests.harness.broker import produce_with_faults, produce_with_faults_for, read_incidents, wait_until_caught_up
from tests.harness.oracle import incident_differences, oracle
from tests.harness.processes import WorkerProcess


async def test_exactly_once_worker_runs_commits_and_reports_the_faults(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    app_id = f"eos-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "eos",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        env={"KDIV_PROCESSING_GUARANTEE": "exactly_once"},
    )
    try:
        worker.start()
        await worker.wait_ready()
        await produce_with_faults_for(bootstrap, topic, 2, rate=300, fault_every=25)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        expected = await oracle(bootstrap, topic)
        assert expected.verdicts()["MISSING"] >= 1
        assert incident_differences(expected, await read_incidents(bootstrap, app_id)) == []
        # Faust runs its transaction manager only under exactly_once; nothing failed in it.
        log = worker.log_text()
        assert "[^---TransactionManager]: Starting..." in log
        assert "Traceback" not in log
    finally:
        worker.terminate()


async def test_topics_with_different_partition_counts_are_watched_together(bootstrap, topic_factory, tmp_path):
    topics = [topic_factory(2), topic_factory(3)]
    app_id = f"mixed-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("mixed", bootstrap=bootstrap, topics=topics, app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        stop = asyncio.Event()
        producing = [
            asyncio.create_task(produce_with_faults(bootstrap, t, stop, rate=200, fault_every=20, seed=i))
            for i, t in enumerate(topics)
        ]
        await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*producing)
        for topic in topics:
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        live = await read_incidents(bootstrap, app_id)
        for topic in topics:
            expected = await oracle(bootstrap, topic)
            assert expected.verdicts()["MISSING"] >= 1
            of_topic = {k: v for k, v in live.items() if v[-1].topic == topic}
            assert incident_differences(expected, of_topic) == []
        # One state table per partition count.
        log = worker.log_text()
        assert "state-p2" in log and "state-p3" in log
    finally:
        worker.terminate()


async def test_restart_whose_first_record_is_a_push_marker(bootstrap, topic_factory, tmp_path):
    """After a restart the loaded state is written again with the first unit; when the first
    record is START_OF_PUSH that unit is written before it, in its partition's context."""
    topic = topic_factory(2)
    app_id = f"push-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("push", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    writer = await DivWriter.start(bootstrap)
    try:
        worker.start()
        await worker.wait_ready()
        for n in range(20):
            await writer.send(topic, b"before %d" % n, key=b"%d" % n)
        await writer.flush()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        worker.terminate()

        # The writer's segments are open: START_OF_PUSH is the first new record everywhere.
        await writer.start_push(topic)
        for n in range(20):
            await writer.send(topic, b"in the push %d" % n, key=b"%d" % n)
        await writer.end_push(topic)
        await writer.close()

        worker.restart(keep_data=True)
        await worker.wait_ready()
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=60)
        assert worker.alive and worker.problems() == []
        expected = await oracle(bootstrap, topic)
        assert incident_differences(expected, await read_incidents(bootstrap, app_id)) == []
    finally:
        worker.terminate()
