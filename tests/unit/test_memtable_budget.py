"""The worker's databases keep their memtables within the shared budget however many there
are (`kdiv.worker.faustcompat.stores.flush_largest`), on real RocksDB databases."""

from __future__ import annotations

import random
import time
from pathlib import Path

import rocksdict

from kdiv.worker.faustcompat.stores import flush_largest

BUDGET = 8 << 20  # 40 databases written hold about 21 MB of memtable
DATABASES = 40


def opened(root: Path, manager: rocksdict.WriteBufferManager) -> list[rocksdict.Rdict]:
    dbs = []
    for n in range(DATABASES):
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(4 << 20)
        options.set_write_buffer_manager(manager)
        dbs.append(rocksdict.Rdict(str(root / str(n)), options))
    return dbs


def write_once_each(dbs: list[rocksdict.Rdict], rng: random.Random) -> None:
    """One commit's writes per database, as a burst over many partitions makes them."""
    for db in dbs:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for k in range(300):
            batch.put(k.to_bytes(4, "big") + rng.randbytes(16), rng.randbytes(100))
        db.write(batch)


def settled_usage(manager: rocksdict.WriteBufferManager, at_most: int, within_s: float = 20.0) -> int:
    """The manager's usage once it is at most `at_most`, or as it stands after `within_s`
    (flushes run in RocksDB's background threads)."""
    deadline = time.monotonic() + within_s
    while manager.get_usage() > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
    return manager.get_usage()


def test_rocksdb_alone_keeps_each_database_s_latest_writes_past_the_budget(tmp_path):
    # The premise: past its budget RocksDB flushes only the database being written.
    manager = rocksdict.WriteBufferManager(BUDGET, False)
    dbs = opened(tmp_path, manager)
    rng = random.Random(1)
    for _ in range(2):
        write_once_each(dbs, rng)
    assert settled_usage(manager, BUDGET, within_s=2.0) > 2 * BUDGET
    for db in dbs:
        db.close()


def test_the_largest_memtables_are_flushed_down_to_half_the_budget(tmp_path):
    manager = rocksdict.WriteBufferManager(BUDGET, False)
    dbs = opened(tmp_path, manager)
    rng = random.Random(1)
    write_once_each(dbs, rng)
    over = manager.get_usage()
    assert over > 2 * BUDGET
    flushed = flush_largest(dbs, manager, BUDGET)
    assert 0 < flushed < DATABASES, "the largest only, until half the budget is left"
    assert settled_usage(manager, BUDGET) <= BUDGET
    assert flush_largest(dbs, manager, BUDGET) == 0, "within the budget: nothing to flush"
    # Nothing written is lost by a flush.
    assert sum(len(list(db.keys())) for db in dbs) == DATABASES * 300
    for db in dbs:
        db.close()
