"""A worker that resumes where its restored state ends, with nothing committed for its group,
commits that position at once, not only after the partition's next record."""

from __future__ import annotations

import asyncio
import time
import uuid

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.harness.broker import committed_offsets, exact_end_offsets, produce_with_faults_for, wait_until_caught_up
from tests.harness.processes import WorkerProcess


def delete_group(bootstrap: str, group: str, timeout: float = 90.0) -> None:
    """Delete a consumer group (with its committed offsets), once it has no members left."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.delete_consumer_groups([group], request_timeout=30)[group].result(timeout=40)
            return
        except KafkaException as failed:
            if time.monotonic() > deadline:
                raise AssertionError(f"group {group} not deleted: {failed}") from None
            time.sleep(1)  # e.g. GROUP_NOT_EMPTY until the stopped worker's session ends


async def test_resumed_position_is_committed_without_a_new_record(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    app_id = f"resume-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path)
    try:
        worker.start()
        await worker.wait_ready()
        await produce_with_faults_for(bootstrap, topic, 2, rate=200, fault_every=1_000_000)
        ends = await exact_end_offsets(bootstrap, topic)
        assert all(ends.values())
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        worker.terminate()

        # The group's offsets are gone; the state changelog (and the local store) are not.
        await asyncio.to_thread(delete_group, bootstrap, app_id)
        assert await committed_offsets(bootstrap, app_id, topic, ends) == dict.fromkeys(ends, -1)

        worker.restart()
        await worker.wait_ready()
        # No record is written: the worker resumes at its state's end and commits it.
        await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=30, ends=ends)
        assert await exact_end_offsets(bootstrap, topic) == ends
        assert worker.problems() == []
    finally:
        worker.terminate()
