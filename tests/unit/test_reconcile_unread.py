"""The nightly job's accounting of what it could not take for validated, without Spark or a
broker: the range past the worker's committed offsets, and the offsets deleted before a read."""

from __future__ import annotations

import pytest

from kdiv.reconcile.backlog import WorkerOffsets, backlog_snapshot
from kdiv.reconcile.snapshot import PartitionRange, Snapshot
from kdiv.reconcile.vanished import Vanished, moved, pieces_of, vanished_ranges

SNAPSHOT = Snapshot(
    1_000,
    (PartitionRange("orders", 0, 5, 100), PartitionRange("orders", 1, 0, 40), PartitionRange("other", 0, 0, 9)),
    ("gone",),
)


def test_the_backlog_is_what_lies_past_the_committed_offsets_and_all_of_a_partition_without_one():
    offsets = WorkerOffsets("app", 900, {("orders", 0): 60, ("other", 0): 9}, True)
    past = backlog_snapshot(SNAPSHOT, offsets, ["orders", "gone"])
    assert past.ranges == (PartitionRange("orders", 0, 60, 100), PartitionRange("orders", 1, 0, 40))
    assert past.missing == ("gone",)
    # A committed offset below the log start (records deleted since) or past the snapshot's end.
    behind = WorkerOffsets("app", 900, {("orders", 0): 2, ("orders", 1): 50}, True)
    assert backlog_snapshot(SNAPSHOT, behind, ["orders"]).ranges == (
        PartitionRange("orders", 0, 5, 100),
        PartitionRange("orders", 1, 40, 40),
    )


def test_worker_offsets_are_saved_and_read_back_and_a_bad_file_is_named():
    offsets = WorkerOffsets("app", 900, {("orders", 0): 60, ("orders", 1): 3}, True)
    assert WorkerOffsets.from_json(offsets.to_json(), "w.json") == offsets
    for bad in (
        "[]",
        "{}",
        '{"version": 9}',
        "not json",
        '{"version": 1, "group": "a", "taken_at_ms": 1, "group_known": true, "offsets": [["t", "x", 1]]}',
    ):
        with pytest.raises(ValueError, match="w.json"):
            WorkerOffsets.from_json(bad, "w.json")


def test_what_a_piece_did_not_reach_and_the_log_no_longer_holds_vanished():
    ranges = [PartitionRange("orders", 0, 0, 100), PartitionRange("orders", 1, 0, 50), PartitionRange("t", 0, 0, 9)]
    starts = {("orders", 0): 30, ("orders", 1): 0, ("t", 0): 20}
    assert moved(ranges, starts) == [ranges[0], ranges[2]]
    # kdiv's source read orders[0] in splits of 25: the first two splits found the log started
    # at 30 (nothing read of the first, the second from 30); the others read from their start.
    pieces = pieces_of(moved(ranges, starts), "python", 25)
    assert [(p.topic, p.start, p.end) for p in pieces] == [
        ("orders", 0, 25),
        ("orders", 25, 50),
        ("orders", 50, 75),
        ("orders", 75, 100),
        ("t", 0, 9),
    ]
    first = {1: 30, 2: 50, 3: 75}  # t[0]: nothing read, all deleted
    assert vanished_ranges(pieces, first, starts) == [Vanished("orders", 0, 0, 30, 30), Vanished("t", 0, 0, 9, 20)]
    # Spark's connector reads a partition as one piece; a compaction gap the log still holds is no loss.
    spark_pieces = pieces_of(moved(ranges, starts), "spark", 25)
    assert [(p.start, p.end) for p in spark_pieces] == [(0, 100), (0, 9)]
    assert vanished_ranges(spark_pieces, {0: 45, 1: 3}, {("orders", 0): 30, ("t", 0): 2}) == [
        Vanished("orders", 0, 0, 30, 30),
        Vanished("t", 0, 0, 2, 2),
    ]
    assert vanished_ranges(spark_pieces, {0: 0, 1: 0}, {("orders", 0): 30, ("t", 0): 2}) == []
