"""The bulk record path (`kdiv.worker.faustcompat.parsed`) is the worker's consumer's alone:
in one process, a Faust app on kdiv's transport gets a watched topic's records parsed and in
bulk, while a plain aiokafka consumer of the same topic gets aiokafka's ConsumerRecords."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord
from faust.types import TP

from kdiv.worker.faustcompat.batches import attach_batch_handler
from kdiv.worker.faustcompat.epochs import batch_leader_epochs
from kdiv.worker.faustcompat.transport import broker_url

RECORDS = 20


class _Collector:
    """A batch handler keeping what it is handed."""

    def __init__(self, topic: str) -> None:
        self.topics = frozenset({topic})
        self.fetch_buffer_bytes = 64 << 20
        self.batches: list[Sequence[Any]] = []
        self.all_in = asyncio.Event()

    async def process(self, batch: Mapping[TP, Sequence[Any]]) -> bool:
        self.batches.extend(batch.values())
        if sum(len(records) for records in self.batches) >= RECORDS:
            self.all_in.set()
        return False

    def on_flushed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        return None

    def forget_offsets(self, keys: Sequence[tuple[str, int]]) -> None:
        return None

    async def flush(self) -> Mapping[tuple[str, int], int]:
        return {}


async def _plain_read(bootstrap: str, topic: str) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        records: list[Any] = []
        while len(records) < RECORDS:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def test_only_the_workers_consumer_gets_parsed_records(bootstrap, broker_is_tansu, topic_factory, tmp_path):
    topic = topic_factory(1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for n in range(RECORDS):
            await producer.send_and_wait(topic, b"v%d" % n, key=b"k%d" % n)
    finally:
        await producer.stop()

    app = faust.App(
        f"kdiv-parsed-{uuid.uuid4().hex[:8]}",
        broker=broker_url(bootstrap, tansu=broker_is_tansu),
        datadir=str(tmp_path),
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
        web_enabled=False,
    )
    app.topics.add(app.topic(topic, key_type=bytes, value_type=bytes))
    collector = _Collector(topic)
    attach_batch_handler(app, collector)
    await app.start()
    try:
        # The plain consumer reads while the worker's consumer fetches, in the same process.
        plain = await _plain_read(bootstrap, topic)
        await asyncio.wait_for(collector.all_in.wait(), timeout=60)
    finally:
        await app.stop()

    # aiokafka itself is as it came: no global of its fetcher module, no method of its classes changed.
    assert aiokafka_fetcher.MemoryRecords is MemoryRecords
    for cls in (aiokafka_fetcher.Fetcher, aiokafka_fetcher.FetchResult, aiokafka_fetcher.PartitionRecords):
        assert all(getattr(f, "__module__", cls.__module__) == cls.__module__ for f in vars(cls).values())
    assert all(type(record) is ConsumerRecord for record in plain)
    assert [(r.offset, r.key, r.value) for r in plain] == [(n, b"k%d" % n, b"v%d" % n) for n in range(RECORDS)]
    parsed = [record for batch in collector.batches for record in batch]
    assert not any(isinstance(record, ConsumerRecord) for record in parsed)
    assert [(r.offset, r.key, r.value) for r in parsed] == [(n, b"k%d" % n, b"v%d" % n) for n in range(RECORDS)]
    # Handed over in bulk: each partition's records with their batches' leader epochs, read
    # from the batches (a topic's first leader writes epoch 0 on Apache Kafka).
    epochs = [epoch for batch in collector.batches for _, epoch in batch_leader_epochs(batch)]
    assert epochs and (broker_is_tansu or all(epoch >= 0 for epoch in epochs))
