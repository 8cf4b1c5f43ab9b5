"""Batched table writes (`kdiv.worker.faustcompat.tables.write_partition`) leave the changelog,
the RocksDB store and the persisted offset recovery starts after exactly as Faust's per-key
writes to its own store do, on the session's broker."""

from __future__ import annotations

import asyncio
import uuid

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.types import TP

from kdiv.kafka.consume import read_snapshot
from kdiv.worker.faustcompat.internals import hand_over_table_writes
from kdiv.worker.faustcompat.stores import STORE_SCHEME
from kdiv.worker.faustcompat.tables import partition_items, write_partition, writing_in_partition
from kdiv.worker.faustcompat.transport import broker_url

PARTITIONS = 2
SOURCE = "source-topic"


def _steps() -> list[list[tuple[int, bytes, bytes | None]]]:
    """Flushes of (partition, key, value or None) writes: puts, overwrites, deletions of
    present and absent keys, a key put then deleted and one deleted then put in one flush,
    and enough records for several record batches."""
    Write = tuple[int, bytes, bytes | None]
    first: list[Write] = [(n % PARTITIONS, b"k%05d" % n, b"v%d" % n * 40) for n in range(600)]
    second: list[Write] = [
        (0, b"k00000", b"again"),
        (0, b"k00002", None),
        (0, b"absent", None),
        (1, b"k00001", None),
        (1, b"fresh", b"x"),
        (1, b"fresh", None),
        (0, b"k00004", None),
        (0, b"k00004", b"back"),
        (1, b"k00003", b"three"),
    ]
    third: list[Write] = [(1, b"absent-too", None)]
    return [first, second, third]


async def _changelog(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return sorted([(r.partition, r.offset, r.key, r.value) async for r in read_snapshot(bootstrap, topic)])


async def test_batched_writes_leave_what_per_key_writes_leave(bootstrap, broker_is_tansu, tmp_path):
    app_id = f"kdiv-tables-{uuid.uuid4().hex[:8]}"
    app = faust.App(
        app_id,
        broker=broker_url(bootstrap, tansu=broker_is_tansu),
        store=f"{STORE_SCHEME}://",
        datadir=str(tmp_path),
        key_serializer="raw",
        value_serializer="raw",
        # Small record batches: a flush's changelog records take several.
        producer_max_batch_size=4096,
        autodiscover=False,
        web_enabled=False,
    )
    # The reference: Faust's own store (one database per partition), written key by key (a
    # URL with a path: Faust takes a bare "rocksdb://" for none and uses the app's). The
    # batched writes go to the worker's store (a table's partitions in one database).
    per_key = app.Table("perkey", partitions=PARTITIONS, key_type=bytes, value_type=bytes, store="rocksdb:perkey")
    batched = app.Table(
        "batched",
        partitions=PARTITIONS,
        key_type=bytes,
        value_type=bytes,
        options={"shared_cache_bytes": 1 << 20, "memtables_bytes": 4 << 20},
    )
    assert type(per_key.data) is not type(batched.data)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests")
    await admin.start()
    changelogs = [table.changelog_topic.get_topic_name() for table in (per_key, batched)]
    try:
        await admin.create_topics([NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in changelogs])
    finally:
        await admin.close()
    await app.producer.start()
    try:
        for number, step in enumerate(_steps()):
            acks = []
            for partition in range(PARTITIONS):
                changes = [(key, value) for p, key, value in step if p == partition]
                with writing_in_partition(SOURCE, partition):
                    for key, value in changes:
                        if value is None:
                            per_key.pop(key, None)
                        else:
                            per_key[key] = value
                acks += await write_partition(app, batched, SOURCE, partition, changes)
            if number == 0:
                assert len(acks) > 2 * PARTITIONS  # several record batches per partition
            await hand_over_table_writes(app)
            await app.producer.flush()
            await asyncio.gather(*acks)
    finally:
        await app.producer.stop()

    expected, found = [await _changelog(bootstrap, topic) for topic in changelogs]
    assert found == expected
    assert len(found) == 600 + 8  # the absent keys' deletions wrote nothing
    for partition in range(PARTITIONS):
        offsets = [offset for p, offset, _, _ in expected if p == partition]
        for table, changelog in zip((per_key, batched), changelogs, strict=True):
            assert table.persisted_offset(TP(changelog, partition)) == offsets[-1]
        stores = [dict(table.data._db_for_partition(partition).items()) for table in (per_key, batched)]
        for store in stores:
            del store[per_key.data.offset_key]
        assert stores[1] == stores[0]
        # Read back as the worker loads an assigned partition: that partition alone.
        assert dict(partition_items(batched, partition)) == stores[1]
        assert b"fresh" not in stores[1] and b"k00002" not in stores[1]
        if partition == 0:
            assert stores[1][b"k00004"] == b"back" and stores[1][b"k00000"] == b"again"
