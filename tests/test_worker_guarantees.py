"""The worker under processing_guarantee=exactly_once: it runs, validates and commits.

On Apache Kafka the counts are exact; on Tansu, which delivers aborted transactions, only
that it runs and commits is asserted after a clean run (no crash here), where the
incidents still equal the oracle's.
"""

from __future__ import annotations

import asyncio
import uuid

from tests.workerproc import (
    WorkerProcess,
    incident_differences,
    oracle,
    produce_with_faults,
    read_incidents,
    wait_until_caught_up,
)


async def test_exactly_once_worker_runs_commits_and_reports_the_faults(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    app_id = f"eos-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        "eos", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path,
        env={"KDIV_PROCESSING_GUARANTEE": "exactly_once"},
    )
    try:
        worker.start()
        await worker.wait_ready()
        stop = asyncio.Event()
        producing = asyncio.create_task(produce_with_faults(bootstrap, topic, stop, rate=300, fault_every=25))
        await asyncio.sleep(2)
        stop.set()
        await producing
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
