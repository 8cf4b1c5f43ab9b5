"""A table's partitions in one RocksDB database (`kdiv.worker.faustcompat.stores`), on real
RocksDB: each partition sees only its own keys, Faust's persisted offset is per partition,
the database is opened once whatever the partition count, and what is written is there
again when the worker opens it next."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from kdiv.reconcile.schemas import local_store_uses
from kdiv.state.framing import frame
from kdiv.state.storekeys import partition_prefix, split_key
from kdiv.worker.faustcompat.stores import STORE_SCHEME, PartitionDB, SharedMemoryStore

# Partitions either side of a byte boundary of the prefix.
PARTITIONS = (0, 1, 2, 255, 256, 65535, 65536)


def table_of(datadir: Path, name: str = "state-p8", partitions: int = 70_000) -> Any:
    app = faust.App(
        f"kdiv-store-{name}",
        store=f"{STORE_SCHEME}://",
        datadir=str(datadir),
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
    )
    return app.Table(
        name,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        options={"shared_cache_bytes": 1 << 20, "memtables_bytes": 4 << 20},
    )


def store_of(table: Any) -> SharedMemoryStore:
    store = table.data
    assert isinstance(store, SharedMemoryStore)
    return store


def changelog_event(topic: str, partition: int, offset: int, key: bytes, value: bytes | None) -> SimpleNamespace:
    """What Faust's recovery hands `apply_changelog_batch`: events with a message."""
    message = SimpleNamespace(tp=TP(topic, partition), partition=partition, offset=offset, key=key, value=value)
    return SimpleNamespace(message=message)


def test_each_partition_reads_and_writes_only_its_own_keys(tmp_path):
    store = store_of(table_of(tmp_path))
    parts = {p: store._db_for_partition(p) for p in PARTITIONS}
    for p, db in parts.items():
        assert isinstance(db, PartitionDB)
        batch = db.batch()
        for n in range(3):
            batch.put(b"key-%d" % n, b"p%d-v%d" % (p, n))
        db.write(batch)
        db.put(b"", b"empty key of %d" % p)  # the shortest key: the prefix alone
    parts[1].delete(b"key-1")
    parts[256].batch()  # an unwritten batch writes nothing
    for p, db in parts.items():
        expected = {b"key-%d" % n: b"p%d-v%d" % (p, n) for n in range(3) if (p, n) != (1, 1)}
        expected[b""] = b"empty key of %d" % p
        assert dict(db.items()) == expected
        assert sorted(db.keys()) == sorted(expected)
        assert sorted(db.values()) == sorted(expected.values())
        assert db.get(b"key-0") == b"p%d-v0" % p
        assert db.get([b"key-2", b"absent", b"key-0"]) == [b"p%d-v2" % p, None, b"p%d-v0" % p]
        assert db.key_may_exist(b"key-0")
    assert parts[1].get(b"key-1") is None and parts[0].get(b"key-1") == b"p0-v1"
    # A partition with nothing written reads empty, between two that hold keys.
    assert list(store._db_for_partition(3).items()) == []
    # One database holds them all, each key after its partition's prefix.
    assert store.database is not None
    held = [split_key(key) for key, _ in store.database.items()]
    assert {p for p, _ in filter(None, held)} == set(PARTITIONS)


def test_a_batch_of_one_partition_is_refused_by_another(tmp_path):
    store = store_of(table_of(tmp_path))
    batch = store._db_for_partition(1).batch()
    batch.put(b"k", b"v")
    with pytest.raises(ValueError, match="partition 2"):
        store._db_for_partition(2).write(batch)
    assert store._db_for_partition(2).get(b"k") is None


def test_persisted_offsets_and_restored_batches_are_per_partition(tmp_path):
    table = table_of(tmp_path)
    store = store_of(table)
    topic = table.changelog_topic.get_topic_name()
    events = [
        changelog_event(topic, 0, 10, b"a", b"a0"),
        changelog_event(topic, 256, 3, b"a", b"a256"),
        changelog_event(topic, 0, 11, b"b", b"b0"),
        changelog_event(topic, 0, 12, b"a", None),
        changelog_event(topic, 256, 4, b"c", b"c256"),
    ]
    store.apply_changelog_batch(events, to_key=lambda k: k, to_value=lambda v: v)
    assert store.persisted_offset(TP(topic, 0)) == 12
    assert store.persisted_offset(TP(topic, 256)) == 4
    assert store.persisted_offset(TP(topic, 1)) is None
    offset_key = store.offset_key
    assert {k: v for k, v in store._db_for_partition(0).items() if k != offset_key} == {b"b": b"b0"}
    assert {k: v for k, v in store._db_for_partition(256).items() if k != offset_key} == {b"a": b"a256", b"c": b"c256"}


@pytest.mark.parametrize("partitions", [10, 1000])
def test_a_table_opens_one_database_whatever_its_partition_count(tmp_path, partitions, monkeypatch):
    store = store_of(table_of(tmp_path, partitions=partitions))
    opened: list[Path] = []
    open_database = store.rocksdb_options.open

    def counted(path: Path, **kwargs):
        opened.append(path)
        return open_database(path, **kwargs)

    monkeypatch.setattr(store.rocksdb_options, "open", counted)
    for p in range(partitions):
        store._db_for_partition(p).put(b"k", b"%d" % p)
    assert opened == [store.database_path]
    assert [p.name for p in tmp_path.rglob("*.db")] == [store.database_path.name]


def test_what_is_written_is_read_again_by_the_next_worker(tmp_path):
    store = store_of(table_of(tmp_path))
    topic = "kdiv-store-state-p8-state-p8-changelog"
    store._db_for_partition(7).put(b"producer", b"state")
    store.set_persisted_offset(TP(topic, 7), 41)
    assert store.database is not None
    store.database.close()
    again = store_of(table_of(tmp_path))
    assert again._db_for_partition(7).get(b"producer") == b"state"
    assert again.persisted_offset(TP(topic, 7)) == 41
    assert again._db_for_partition(6).get(b"producer") is None


def test_the_schema_check_reads_a_worker_s_store_per_partition(tmp_path):
    store = store_of(table_of(tmp_path, name="state-p8"))
    for partition, schema_ids in ((0, (5, 5, 6)), (256, (6,))):
        db = store._db_for_partition(partition)
        for n, schema_id in enumerate(schema_ids):
            db.put(b"producer-%d" % n, frame(schema_id, b"body"))
    store.set_persisted_offset(TP("changelog", 0), 2)  # Faust's own entry: not a table value
    store._db_for_partition(1).put(b"raw", b"not framed")
    assert store.database is not None
    store.database.close()
    uses = local_store_uses(tmp_path, "app")
    found = {(u.changelog, u.partition, u.schema_id): u.records for u in uses}
    assert found == {
        ("app-state-p8-changelog", 0, 5): 2,
        ("app-state-p8-changelog", 0, 6): 1,
        ("app-state-p8-changelog", 1, None): 1,
        ("app-state-p8-changelog", 256, 6): 1,
    }


def test_a_prefix_orders_partitions_as_numbers():
    prefixes = [partition_prefix(p) for p in PARTITIONS]
    assert prefixes == sorted(prefixes)
    assert split_key(partition_prefix(65536) + b"key") == (65536, b"key")
    assert split_key(b"abc") is None
