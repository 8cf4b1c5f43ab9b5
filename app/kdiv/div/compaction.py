"""Which sequence gaps log compaction can explain, by the log's own evidence (exact semantics).

The cleaner removes a superseded record but keeps the offsets of the records it keeps, so
every record it removed leaves an offset hole. A loss leaves none: a record never written
has no offset, and a truncated one's offset is taken by the record written after the
truncation. A gap of `missing` seqs between a producer's previous record and the record
that closes it can therefore be compaction's only if the partition has at least `missing`
offset holes between those two records' offsets. The validator counts holes per partition
as it reads the records in offset order (`PartitionValidation.holes`) and each producer
state notes the count at its last record (`Segment.partition_holes`), so the holes between
are a subtraction, whenever the worker validates: a worker running behind sees the same holes.

Holes are not only compaction's: under read_committed a transaction marker and an aborted
record leave one too, and a gap is weighed against every hole between, whoever's record
was there. So the rule never excuses a loss in a log without holes, and excuses one only
where the log has as many holes as the gap.

Pure: no I/O.
"""

from __future__ import annotations

from typing import NamedTuple


class Evidence(NamedTuple):
    """What the offset holes say of one sequence gap."""

    explains: bool  # enough holes: compaction may have removed the missing records
    # Compaction may have made the gap, but the holes between are not known (or only within
    # bounds that leave both open): it cannot be told from loss.
    untold: bool = False
    detail: str = ""  # why compaction does not explain it, for the MISSING that reports it
    # The holes between the producer's records when they are fewer than the seqs missing
    # (-1: not counted so; `kdiv.div.exact.Gap.holes`).
    holes: int = -1


NOTHING_MISSING = Evidence(False)


def holes_at(
    last_offset: int,
    holes: int,
    offset: int,
    previous_offset: int = -1,
    previous_holes: int = -1,
    holes_from: int = -1,
) -> tuple[int, int]:
    """Bounds on a partition's hole count up to `offset` (the count the producer of the
    record at `offset` notes), from the partition's last validated offset and its count there,
    and the producer's previous record's offset and count (-1: not known).

    Exact for a record past the last validated offset: its jump over offsets not read adds
    to the count. A record at or behind it (validated again after a crash that saved the
    partition's state but not its producer's) lies before holes already counted: at most one
    fewer than the offsets between it and the last validated one, and at most as many as the
    offsets between the producer's previous record and it; exact where either is none, or
    where the partition has no holes."""
    if last_offset < 0:
        return holes, holes
    if offset > last_offset:
        count = holes + offset - last_offset - 1
        return count, count
    # The count starts at 0 at `holes_from`, so it is never negative.
    low, high = max(holes - max(last_offset - offset - 1, 0), 0), holes
    if previous_holes >= 0 and holes_from <= previous_offset < offset:
        low = max(low, previous_holes)
        high = min(high, previous_holes + offset - previous_offset - 1)
    return low, high


def weigh_gap(
    missing: int,
    previous_offset: int,
    previous_holes: int,
    holes_from: int,
    offset: int,
    holes_low: int,
    holes_high: int,
) -> Evidence:
    """Whether a gap of `missing` seqs, after the producer's record at `previous_offset`
    (where the partition had counted `previous_holes` holes, -1: not known) and closed by
    the record at `offset` (the count there between `holes_low` and `holes_high`), can be
    compaction's. The partition counts holes from offset `holes_from` on (-1: all)."""
    if missing <= 0:
        # Nothing missing since the producer's last record (a checksum mismatch, data after
        # an END_OF_SEGMENT): compaction removes records, so it explains nothing else.
        return NOTHING_MISSING
    records = f"{missing} record{'s' if missing != 1 else ''} missing"
    if previous_holes < 0:
        return Evidence(
            False,
            True,
            f"compaction or loss, which cannot be told: the offset holes before the producer's previous record "
            f"(offset {previous_offset}) are not known (its state was saved without them: by an earlier kdiv, "
            f"or brought forward after a crash), so nothing shows whether offsets {previous_offset}..{offset} "
            f"hold a hole for each of the {records}",
        )
    if previous_offset < holes_from:
        return Evidence(
            False,
            True,
            f"compaction or loss, which cannot be told: offsets before {holes_from} were not read as the log's "
            f"evidence (deleted before validation, a rewound log, or a partition state started afresh), so "
            f"nothing shows whether offsets {previous_offset}..{offset} hold a hole for each of the {records}",
        )
    low, high = holes_low - previous_holes, holes_high - previous_holes
    if low >= missing:
        return Evidence(True)
    if high < 0:
        return Evidence(
            False,
            True,
            f"compaction or loss, which cannot be told: the producer's state counts more offset holes "
            f"({previous_holes}) than its partition's ({holes_high}): they were not saved together",
        )
    between = f"between offsets {previous_offset} and {offset}"
    if high < missing:
        return Evidence(
            False,
            False,
            f"not compaction: the log has {high} offset hole{'s' if high != 1 else ''} {between}, fewer than "
            f"the {records} (compaction leaves a hole for each record it removes; a lost record leaves none)",
            high,
        )
    return Evidence(
        False,
        True,
        f"compaction or loss, which cannot be told: {low}..{high} offset holes {between} (validated again "
        f"behind the partition's last offset, after a crash), for {records}",
    )
