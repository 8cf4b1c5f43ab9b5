"""What the worker's consumer fetches and hands over at once is bounded, however large the
backlog (`kdiv.worker.faustcompat.transport`): a drain takes fetched records within
`DRAIN_BYTES`, also the first one after waiting for records (aiokafka's own drain takes all
that came meanwhile), and each partition is fetched at most the worker's fetch budget shared
by its partitions. A drained batch's partitions count as on their way until it is taken."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import faust
from aiokafka import AIOKafkaProducer
from faust.types import TP

from kdiv.worker.faustcompat import transport
from kdiv.worker.faustcompat.batches import attach_batch_handler
from kdiv.worker.faustcompat.transport import PARTITION_FETCH_FLOOR, KdivConsumer, broker_url

PARTITIONS = 20
PER_PARTITION = 2_000
VALUE = b"v" * 100
DRAIN_BYTES = 256 << 10


class _Collector:
    """A batch handler keeping each batch's size and what the consumer held meanwhile."""

    def __init__(self, topic: str, app: faust.App) -> None:
        self.topics = frozenset({topic})
        self.fetch_buffer_bytes = 1 << 20
        self.app = app
        self.batch_sizes: list[int] = []
        self.held_while_taken: list[bool] = []
        self.all_in = asyncio.Event()

    async def process(self, batch: Mapping[TP, Sequence[Any]]) -> bool:
        self.batch_sizes.append(sum(len(records) for records in batch.values()))
        held = cast(KdivConsumer, self.app.consumer).records_held()
        self.held_while_taken.append(all((tp.topic, tp.partition) in held for tp in batch))
        if sum(self.batch_sizes) >= PARTITIONS * PER_PARTITION:
            self.all_in.set()
        return False

    def on_flushed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        return None

    def forget_offsets(self, keys: Sequence[tuple[str, int]]) -> None:
        return None

    async def flush(self) -> Mapping[tuple[str, int], int]:
        return {}


def _app(name: str, bootstrap: str, broker_is_tansu: bool, tmp_path: Any, **conf: Any) -> faust.App:
    """A Faust app on kdiv's transport reading from the earliest offset, without its web server."""
    return faust.App(
        f"{name}-{uuid.uuid4().hex[:8]}",
        broker=broker_url(bootstrap, tansu=broker_is_tansu),
        datadir=str(tmp_path),
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
        web_enabled=False,
        **conf,
    )


async def _write_backlog(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            sends = [
                await producer.send(topic, VALUE, key=b"k%d" % n, partition=partition) for n in range(PER_PARTITION)
            ]
            await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def test_a_backlog_is_fetched_and_handed_over_within_the_budgets(
    bootstrap, broker_is_tansu, topic_factory, tmp_path, monkeypatch
):
    monkeypatch.setattr(transport, "DRAIN_BYTES", DRAIN_BYTES)
    topic = topic_factory(PARTITIONS)
    await _write_backlog(bootstrap, topic)
    app = _app("kdiv-fetch-budget", bootstrap, broker_is_tansu, tmp_path)
    app.topics.add(app.topic(topic, key_type=bytes, value_type=bytes))
    collector = _Collector(topic, app)
    attach_batch_handler(app, collector)
    await app.start()
    try:
        await asyncio.wait_for(collector.all_in.wait(), timeout=90)
        fetch_bytes = app.consumer._thread._ensure_consumer()._fetcher._max_partition_fetch_bytes
        held_after = cast(KdivConsumer, app.consumer).records_held()
    finally:
        await app.stop()

    # 1 MiB shared by 20 partitions is below the floor: each partition is fetched 64 KiB at a time.
    assert fetch_bytes == PARTITION_FETCH_FLOOR
    assert sum(collector.batch_sizes) == PARTITIONS * PER_PARTITION
    # A record takes about 120 bytes in its batch: a drain of 256 KiB, plus the partition
    # result that crosses it (at most a 64 KiB fetch), is under 3,000 records. Drained all
    # at once, the first batch alone held every partition's first fetch (about 10,000).
    assert max(collector.batch_sizes) <= 3_000, collector.batch_sizes
    assert len(collector.batch_sizes) >= PARTITIONS * PER_PARTITION // 3_000
    assert all(collector.held_while_taken)
    assert held_after == frozenset()


async def test_a_paused_changelog_partition_is_not_fetched(bootstrap, broker_is_tansu, topic_factory, tmp_path):
    """Faust pauses its tables' changelog partitions once restored, by leaving them out of what
    it takes from the fetcher; aiokafka fetched them still, and a worker held fetches of its
    own state writes. Paused through kdiv's consumer, they are not fetched."""
    topic = topic_factory(2)
    app = _app("kdiv-paused", bootstrap, broker_is_tansu, tmp_path, topic_partitions=2)
    app.topics.add(app.topic(topic, key_type=bytes, value_type=bytes))
    table = app.Table("state", partitions=2, key_type=bytes, value_type=bytes)
    collector = _Collector(topic, app)
    attach_batch_handler(app, collector)
    await app.start()
    try:
        changelog = table.changelog_topic.get_topic_name()
        consumer = app.consumer._thread._ensure_consumer()
        deadline = asyncio.get_running_loop().time() + 60
        while not app.tables.recovery.completed.is_set():
            assert asyncio.get_running_loop().time() < deadline, "recovery did not complete"
            await asyncio.sleep(0.2)
        # Written to the changelog as the worker writes its state, after the restore.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for n in range(200):
                await producer.send(changelog, b"state", key=b"k%d" % n, partition=n % 2)
            await producer.flush()
        finally:
            await producer.stop()
        await asyncio.sleep(3)  # several fetch rounds (the fetch wait is 1.5 s)
        paused = {(tp.topic, tp.partition) for tp in consumer.paused()}
        fetched = {(tp.topic, tp.partition) for tp in consumer._fetcher._records}
    finally:
        await app.stop()
    assert {(changelog, 0), (changelog, 1)} <= paused
    assert not any(name == changelog for name, _ in fetched)
