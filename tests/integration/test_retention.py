"""Records deleted before the worker validated them (DeleteRecords, retention.ms): one
DELETED_BEFORE_VALIDATION naming the range, and each producer that lost records there says so
in its next MISSING; records deleted after validation are no incident at all.

Every case writes from three producers before the deletion (A, B, D), deletes A's and B's
records that the worker has not read, then writes again from all of them and a new one (C):
D lost nothing, C was never seen before, so exactly A and B have a MISSING."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.admin.records_to_delete import RecordsToDelete

from kdiv.incident.shape import Incident
from kdiv.worker.incidents import DELETED_BEFORE_VALIDATION
from kdiv.writer import DivWriter
from tests.harness.broker import exact_end_offsets, read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess

# Record timestamps this old are past any retention.ms: deleted at the broker's next check.
YEARS_AGO_MS = 1_000_000_000_000
NOTE = "deleted before validation"
# Retention for these topics once set: records written now stay for the whole test.
RETENTION_MS = 10 * 60 * 1000


class Backdated(AIOKafkaProducer):
    """A producer whose records carry a timestamp years old (the DIV header is the writer's)."""

    async def send(self, topic, value=None, key=None, partition=None, timestamp_ms=None, headers=None):
        return await super().send(
            topic, value=value, key=key, partition=partition, timestamp_ms=YEARS_AGO_MS, headers=headers
        )


class Producers:
    """Named DIV producers writing to partition 0 of one topic, through one Kafka producer
    (now-stamped, or backdated for retention to delete)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.current = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.backdated = Backdated(bootstrap_servers=bootstrap, acks="all")
        self.writers: dict[str, DivWriter] = {}

    async def __aenter__(self) -> Producers:
        await self.current.start()
        await self.backdated.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.current.stop()
        await self.backdated.stop()

    def guid(self, name: str) -> str:
        return self.writers[name].guid.hex()

    async def write(self, counts: dict[str, int], *, backdated: bool = False) -> None:
        """`counts[name]` data records from each producer, interleaved, acknowledged."""
        producer = self.backdated if backdated else self.current
        for name in counts:
            writer = self.writers.setdefault(name, DivWriter(producer))
            writer.producer = producer
        for i in range(max(counts.values())):
            for name, count in counts.items():
                if i < count:
                    await self.writers[name].send(
                        self.topic, b"%s-%d" % (name.encode(), i), key=b"k%d" % i, partition=0
                    )
        await producer.flush()


async def end_offset(bootstrap: str, topic: str) -> int:
    return (await exact_end_offsets(bootstrap, topic))[0]


async def log_start(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return (await consumer.beginning_offsets([tp]))[tp]
    finally:
        await consumer.stop()


async def delete_records(bootstrap: str, topic: str, before: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before)})
    finally:
        await admin.close()
    assert await log_start(bootstrap, topic) == before


async def configure(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
    finally:
        await admin.close()


async def wait_for_log_start(bootstrap: str, topic: str, at_least: int, timeout: float = 30.0) -> int:
    """Wait until retention has moved the log start to `at_least` or past it."""
    deadline = time.monotonic() + timeout
    while (start := await log_start(bootstrap, topic)) < at_least:
        assert time.monotonic() < deadline, f"retention left {topic}'s log start at {start}, not {at_least}"
        await asyncio.sleep(0.25)
    return start


async def incidents_now(bootstrap: str, app_id: str) -> list[Incident]:
    """Each incident as its latest version says."""
    return [versions[-1] for versions in (await read_incidents(bootstrap, app_id)).values()]


def shape(incidents: Iterable[Incident]) -> set[tuple[str, str | None, int, bool]]:
    """(class, producer, seq or first offset, says deleted before validation) of each incident."""
    return {(i.verdict, i.producer, i.offset if i.seq is None else i.seq, NOTE in i.detail) for i in incidents}


def expected(producers: Producers, first: int) -> set[tuple[str, str | None, int, bool]]:
    """The deletion from `first`, and A's and B's MISSING from their seq 6 on (seq 1..5 were
    validated, 6.. deleted), both saying so."""
    return {
        (DELETED_BEFORE_VALIDATION, None, first, False),
        ("MISSING", producers.guid("A"), 6, True),
        ("MISSING", producers.guid("B"), 6, True),
    }


def check_details(incidents: list[Incident], first: int, last: int) -> None:
    (deletion,) = [i for i in incidents if i.verdict == DELETED_BEFORE_VALIDATION]
    assert f"offsets {first}..{last} ({last - first + 1} offsets) were deleted" in deletion.detail, deletion
    assert deletion.severity == "warning"
    missing = {i.producer: i for i in incidents if i.verdict == "MISSING"}
    seqs = {i.detail.split(" of segment")[0] for i in missing.values()}
    assert seqs == {"seq 6..9", "seq 6..8"}, missing  # A lost seq 6..9, B seq 6..8: all deleted
    assert all(f"offsets {first}..{last}" in i.detail for i in missing.values()), missing


BEFORE = {"A": 5, "B": 5, "D": 5}  # validated: seq 1..5 each (after START_OF_SEGMENT)
DELETED = {"A": 4, "B": 3}  # A's seq 6..9, B's 6..8: never read
AFTER = {"D": 3, "C": 3, "A": 3, "B": 2}  # D goes on in order, C is new


def worker_for(bootstrap: str, topic: str, tmp_path, **options) -> WorkerProcess:
    app_id = f"retention-{uuid.uuid4().hex[:8]}"
    return WorkerProcess("w", bootstrap=bootstrap, topics=[topic], app_id=app_id, workdir=tmp_path, **options)


async def validated_first(bootstrap: str, topic: str, worker: WorkerProcess, producers: Producers, **write) -> int:
    """Start the worker, write BEFORE and wait until it has validated them; the offset after them."""
    worker.start()
    await worker.wait_ready()
    await producers.write(BEFORE, **write)
    await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
    return await end_offset(bootstrap, topic)


async def incidents_after_start(bootstrap: str, topic: str, worker: WorkerProcess) -> list[Incident]:
    """Start the worker; its incidents once it has validated the whole topic."""
    worker.start()
    await worker.wait_ready()
    await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
    return await incidents_now(bootstrap, worker.app_id)


async def test_delete_records_while_the_worker_is_down_is_one_incident(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(1)
    worker = worker_for(bootstrap, topic, tmp_path)
    try:
        async with Producers(bootstrap, topic) as producers:
            first = await validated_first(bootstrap, topic, worker, producers)
            worker.terminate()

            await producers.write(DELETED)
            start = await end_offset(bootstrap, topic)
            await delete_records(bootstrap, topic, start)
            await producers.write(AFTER)

            incidents = await incidents_after_start(bootstrap, topic, worker)
            assert shape(incidents) == expected(producers, first), incidents
            check_details(incidents, first, start - 1)
            assert "found by fetch" in next(i.detail for i in incidents if i.verdict == DELETED_BEFORE_VALIDATION)
    finally:
        worker.terminate()


async def test_a_worker_killed_as_it_writes_the_incident_does_not_double_it(bootstrap, topic_factory, tmp_path):
    """SIGKILLed as soon as the incident is on the topic: before or after the state that
    accounts for the range was saved. Restarted, the worker finds the range again under the
    same key, or not at all; either way the incidents are the same."""
    topic = topic_factory(1)
    worker = worker_for(bootstrap, topic, tmp_path)
    try:
        async with Producers(bootstrap, topic) as producers:
            first = await validated_first(bootstrap, topic, worker, producers)
            worker.terminate()
            await producers.write(DELETED)
            start = await end_offset(bootstrap, topic)
            await delete_records(bootstrap, topic, start)
            await producers.write(AFTER)

            worker.start()
            deadline = time.monotonic() + 60
            while not await read_incidents(bootstrap, worker.app_id):
                assert time.monotonic() < deadline and worker.alive, worker.log_tail()
                await asyncio.sleep(0.05)
            worker.sigkill()
            worker.start()
            await worker.wait_ready()
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
            versions = await read_incidents(bootstrap, worker.app_id)
            incidents = [v[-1] for v in versions.values()]
            assert shape(incidents) == expected(producers, first) and len(versions) == 3, versions
            check_details(incidents, first, start - 1)
    finally:
        worker.terminate()


async def test_delete_records_under_a_running_worker_that_lags_is_one_incident(bootstrap, topic_factory, tmp_path):
    """The worker is stopped (SIGSTOP) with nothing left to read, long enough for its
    consumer's pending fetch to come back empty, and well within its session: when it goes on,
    its next fetch is out of range and the consumer resets to the log start, no rebalance."""
    topic = topic_factory(1)
    worker = worker_for(bootstrap, topic, tmp_path, session_timeout_s=15.0, heartbeat_interval_s=1.0)
    try:
        async with Producers(bootstrap, topic) as producers:
            first = await validated_first(bootstrap, topic, worker, producers)
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(2.5)  # Faust's consumer waits up to 1.5 s for a fetch's records
                await producers.write(DELETED)
                start = await end_offset(bootstrap, topic)
                await delete_records(bootstrap, topic, start)
                await producers.write(AFTER)
            finally:
                os.kill(worker.pid, signal.SIGCONT)

            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
            incidents = await incidents_now(bootstrap, worker.app_id)
            assert shape(incidents) == expected(producers, first), incidents
            check_details(incidents, first, start - 1)
            assert "found by fetch" in next(i.detail for i in incidents if i.verdict == DELETED_BEFORE_VALIDATION)
    finally:
        worker.terminate()


async def test_retention_deleting_records_the_worker_had_not_read_is_one_incident(bootstrap, topic_factory, tmp_path):
    """Records old enough for the topic's retention.ms, deleted while the worker is down."""
    topic = topic_factory(1)
    worker = worker_for(bootstrap, topic, tmp_path)
    try:
        async with Producers(bootstrap, topic) as producers:
            # No retention yet: the worker reads these before anything deletes them.
            first = await validated_first(bootstrap, topic, worker, producers, backdated=True)
            worker.terminate()

            await producers.write(DELETED, backdated=True)
            start = await end_offset(bootstrap, topic)
            # Every record is years old: retention deletes every segment, rolling the active one.
            await configure(bootstrap, topic, {"retention.ms": str(RETENTION_MS), "segment.ms": "100"})
            assert await wait_for_log_start(bootstrap, topic, start) == start
            await producers.write(AFTER)

            incidents = await incidents_after_start(bootstrap, topic, worker)
            assert shape(incidents) == expected(producers, first), incidents
            check_details(incidents, first, start - 1)
    finally:
        worker.terminate()


async def test_everything_deleted_up_to_the_end_is_found_without_a_record_after_it(bootstrap, topic_factory, tmp_path):
    """No record follows the deletion to show a gap: the worker's poll of the log start finds it."""
    topic = topic_factory(1)
    worker = worker_for(bootstrap, topic, tmp_path)
    try:
        async with Producers(bootstrap, topic) as producers:
            first = await validated_first(bootstrap, topic, worker, producers)
            worker.terminate()

            await producers.write(DELETED)
            start = await end_offset(bootstrap, topic)
            await delete_records(bootstrap, topic, start)
            worker.start()
            await worker.wait_ready()
            deadline = time.monotonic() + 60
            while not (incidents := await incidents_now(bootstrap, worker.app_id)):
                assert time.monotonic() < deadline and worker.alive, worker.log_tail()
                await asyncio.sleep(0.5)
            assert shape(incidents) == {(DELETED_BEFORE_VALIDATION, None, first, False)}, incidents
            assert "found by log start poll" in incidents[0].detail, incidents

            # The producers go on: the worker that found the deletion knows who was behind it.
            await producers.write(AFTER)
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
            incidents = await incidents_now(bootstrap, worker.app_id)
            assert shape(incidents) == expected(producers, first), incidents
            check_details(incidents, first, start - 1)
    finally:
        worker.terminate()


async def test_records_deleted_after_validation_are_no_incident(bootstrap, topic_factory, tmp_path):
    """DeleteRecords below the committed offset, then retention of everything validated, under
    a running worker and across a restart: nothing is reported, nothing else either."""
    topic = topic_factory(1)
    worker = worker_for(bootstrap, topic, tmp_path)
    try:
        async with Producers(bootstrap, topic) as producers:
            worker.start()
            await worker.wait_ready()
            await producers.write(BEFORE, backdated=True)
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
            await delete_records(bootstrap, topic, 8)
            await producers.write(DELETED, backdated=True)
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
            validated = await end_offset(bootstrap, topic)
            await configure(bootstrap, topic, {"retention.ms": str(RETENTION_MS), "segment.ms": "100"})
            assert await wait_for_log_start(bootstrap, topic, validated) == validated
            # Long enough for two of the worker's log start polls (5 s apart).
            await asyncio.sleep(11)
            await producers.write(AFTER)
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)

            worker.terminate()
            await delete_records(bootstrap, topic, await end_offset(bootstrap, topic))
            worker.start()
            await worker.wait_ready()
            await producers.write({"A": 2, "B": 2, "C": 2, "D": 2})
            await wait_until_caught_up(bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
            await asyncio.sleep(11)  # and two more polls after the restart
            assert worker.alive, worker.log_tail()
            assert await incidents_now(bootstrap, worker.app_id) == []
    finally:
        worker.terminate()
