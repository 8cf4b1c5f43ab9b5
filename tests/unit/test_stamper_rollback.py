"""A stamper rolled back to a checkpoint (an aborted transaction) stamps as if what came after
had never been stamped: same seqs, same segment numbers, same END_OF_SEGMENT checksum."""

from __future__ import annotations

from kdiv.div.stamper import DivStamper
from kdiv.div.wire import decode

GUID = bytes(range(16))


def stamped(records) -> list[tuple[str, int, int, int | None]]:
    """(kind, segment, seq, segment checksum) of each record."""
    out = []
    for record in records:
        header = decode(dict(record.headers)["div"])
        out.append((header.kind.name, header.segment, header.seq, header.segment_checksum))
    return out


def test_rollback_undoes_records_segments_and_checksum_updates():
    committed_only = DivStamper(GUID, max_records_per_segment=3)
    rolled_back = DivStamper(GUID, max_records_per_segment=3)
    for stamper in (committed_only, rolled_back):
        for i in range(2):
            stamper.data("t", 0, b"k%d" % i, b"v", 1_000)

    checkpoint = rolled_back.checkpoint()
    # The aborted part rolls a segment over, opens partition 1, and ends partition 0's segment.
    for i in range(4):
        rolled_back.data("t", 0, b"aborted-%d" % i, b"x", 2_000)
    rolled_back.data("t", 1, b"other", b"x", 2_000)
    rolled_back.end_segment("t", 0, True, 2_000)
    rolled_back.rollback(checkpoint)

    after = []
    for stamper in (committed_only, rolled_back):
        records = [r for i in range(3) for r in stamper.data("t", 0, b"c%d" % i, b"v", 3_000)]
        records += stamper.data("t", 1, b"p1", b"v", 3_000)
        records += stamper.end_segment("t", 0, True, 3_000)
        after.append(stamped(records))
    assert after[0] == after[1]
    # The next seq after the checkpoint is the one the aborted records took first.
    assert after[1][0] == ("DATA", 0, 3, None)


def test_a_checkpoint_is_not_changed_by_later_stamping():
    stamper = DivStamper(GUID)
    stamper.data("t", 0, b"k", b"v", 1_000)
    checkpoint = stamper.checkpoint()
    for _ in range(5):
        stamper.data("t", 0, b"k", b"v", 1_000)
    stamper.rollback(checkpoint)
    stamper.rollback(checkpoint)  # twice: the same state
    (record,) = stamper.data("t", 0, b"k", b"v", 1_000)
    assert stamped([record]) == [("DATA", 0, 2, None)]
