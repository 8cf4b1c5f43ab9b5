"""The bulk path for watched topics' fetched records (`kdiv.worker.faustcompat.parsed`)
yields what aiokafka's own per-record path yields, and leaves the fetch position where it does."""

from __future__ import annotations

import struct

import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from kdiv.worker.faustcompat.parsed import _unpack_parsed

TP = TopicPartition("orders", 3)
READ_UNCOMMITTED = 0


def batch(base: int, count: int, *, producer_id: int = -1, transactional: bool = False, control: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(
        2, 0, int(transactional), producer_id, 0 if producer_id >= 0 else -1, -1, 1 << 20
    )
    for i in range(count):
        if control:
            builder.append(i, 1_700_000_000_000, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])
        else:
            builder.append(i, 1_700_000_000_000 + i, f"k{base + i}".encode(), b"v" * i, [("div", bytes([i]))])
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    if control:
        attributes = struct.unpack_from(">h", raw, 21)[0] | 0x20
        struct.pack_into(">h", raw, 21, attributes)
        struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    return bytes(raw)


def both_paths(data: bytes, fetch_offset: int, isolation: int, aborted=None):
    def partition_records() -> PartitionRecords:
        return PartitionRecords(TP, MemoryRecords(data), aborted, fetch_offset, None, None, True, isolation)

    theirs = partition_records()
    expected = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in theirs]
    ours = partition_records()
    got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in _unpack_parsed(ours)]
    return expected, got, theirs.next_fetch_offset, ours.next_fetch_offset


@pytest.mark.parametrize("fetch_offset", [0, 1, 4, 5, 9, 10, 12])
def test_plain_batches_from_any_fetch_position(fetch_offset):
    # A fetch starts at the batch that holds the fetch offset.
    data = b"".join(batch(base, count) for base, count in ((0, 5), (5, 5), (10, 3)) if base + count > fetch_offset)
    expected, got, their_position, our_position = both_paths(data, fetch_offset, READ_UNCOMMITTED)
    assert got == expected
    assert [r[0] for r in got] == list(range(fetch_offset, 13))
    assert our_position == their_position == 13


@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
def test_aborted_transactions_and_control_batches(isolation):
    # Producer 7's transaction (offsets 3..5) is aborted by the marker at 6; 0..2 and 7..8 are plain.
    data = (
        batch(0, 3)
        + batch(3, 3, producer_id=7, transactional=True)
        + batch(6, 1, producer_id=7, transactional=True, control=True)
        + batch(7, 2)
    )
    aborted = [(7, 3)]  # (producer id, first offset), as a Fetch response lists them
    expected, got, their_position, our_position = both_paths(data, 0, isolation, aborted)
    assert got == expected
    offsets = [r[0] for r in got]
    assert offsets == ([0, 1, 2, 7, 8] if isolation == READ_COMMITTED else [0, 1, 2, 3, 4, 5, 7, 8])
    assert our_position == their_position == 9


def test_a_corrupt_batch_is_refused_as_aiokafka_refuses_it():
    good = batch(0, 3)
    bad = bytearray(batch(3, 3))
    bad[-1] ^= 0xFF
    records = PartitionRecords(TP, MemoryRecords(good + bytes(bad)), None, 0, None, None, True, READ_UNCOMMITTED)
    with pytest.raises(Exception, match="Invalid CRC"):
        list(_unpack_parsed(records))
