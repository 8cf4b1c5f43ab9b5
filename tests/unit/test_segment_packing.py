"""Idle producers' states are kept packed: packing loses nothing and changes no verdict."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdiv.div import tracker as tracker_module
from kdiv.div.producer_states import ProducerStates
from kdiv.div.segment import Segment, as_segment, last_producer_ts
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator, Semantics
from kdiv.div.wire import ChecksumType
from tests.harness.streams import GUID_A, GUID_B, Log
from tests.harness.streams import NOW as STREAM_NOW
from tests.unit.test_properties import NOW, faulty_stream

_INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


@given(
    segment_number=_INT64,
    sequence_number=_INT64,
    checksum_type=st.sampled_from(list(ChecksumType)),
    checksum=st.one_of(st.none(), st.integers(0, (1 << 64) - 1)),
    last_offset=_INT64,
    producer_ts=_INT64,
    flags=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_a_packed_segment_unpacks_equal(
    segment_number, sequence_number, checksum_type, checksum, last_offset, producer_ts, flags
):
    segment = Segment(segment_number, sequence_number, checksum_type)
    segment.checksum = checksum
    segment.last_offset = last_offset
    segment.last_producer_ts = producer_ts
    (
        segment.checksum_finalized,
        segment.registered,
        segment.started,
        segment.ended,
        segment.final_segment,
        segment.new_segment,
    ) = flags
    packed = segment.pack()
    assert isinstance(packed, bytes) and len(packed) < 64
    assert Segment.unpack(packed) == segment
    assert as_segment(packed) == segment and as_segment(segment) is segment
    assert last_producer_ts(packed) == producer_ts == last_producer_ts(segment)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_stream())
def test_checkpoints_pack_idle_producers_and_change_no_verdict(stream):
    steady = DataIntegrityValidator()
    packing = DataIntegrityValidator()
    for record, _ in stream:
        got, want = packing.validate(record, NOW), steady.validate(record, NOW)
        assert (got.verdict, got.fatal, got.detail) == (want.verdict, want.fatal, want.detail)
        # A checkpoint after every record: whoever did not move since the last one is packed.
        packing.checkpoint(record.topic, record.partition)
        tracker = packing.partition(record.topic, record.partition).tracker
        want_states = steady.partition(record.topic, record.partition).tracker.segments
        assert {g: as_segment(s) for g, s in tracker.segments.items()} == want_states


def test_an_idle_producer_is_packed_at_the_second_checkpoint_and_unpacked_when_it_writes():
    log = Log()
    busy, idle = DivStamper(GUID_A), DivStamper(GUID_B)
    v = DataIntegrityValidator()
    for r in log.add_outgoing(idle.data("t", 0, b"k", b"v", 1_000)):
        v.validate(r, NOW)
    tracker = v.partition("t", 0).tracker
    v.checkpoint("t", 0)  # the idle producer's state moved since it was created: kept as is
    assert isinstance(tracker.segments[GUID_B], Segment)
    for r in log.add_outgoing(busy.data("t", 0, b"k", b"v", 1_001)):
        v.validate(r, NOW)
    v.checkpoint("t", 0)
    assert isinstance(tracker.segments[GUID_B], bytes) and isinstance(tracker.segments[GUID_A], Segment)
    for r in log.add_outgoing(idle.data("t", 0, b"k", b"v", 1_002)):
        assert v.validate(r, NOW).verdict.value == "OK"
    assert isinstance(tracker.segments[GUID_B], Segment) and tracker.segments[GUID_B].sequence_number == 2


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(list(Semantics)).flatmap(lambda semantics: st.tuples(st.just(semantics), faulty_stream(semantics)))
)
def test_packing_a_crowd_of_unpacked_producers_between_records_changes_no_verdict(semantics_and_stream):
    semantics, stream = semantics_and_stream
    steady = DataIntegrityValidator(semantics=semantics)
    for record, _ in stream:  # its trackers made now, with the real bound: they never pack
        steady.partition(record.topic, record.partition)
    crowded = DataIntegrityValidator(semantics=semantics)
    with mock.patch.object(tracker_module, "UNPACKED_MAX", 1):
        _validate_both(stream, crowded, steady)


def _validate_both(stream, crowded: DataIntegrityValidator, steady: DataIntegrityValidator) -> None:
    for record, _ in stream:
        got, want = crowded.validate(record, NOW), steady.validate(record, NOW)
        assert (got.verdict, got.fatal, got.detail, got.gap) == (want.verdict, want.fatal, want.detail, want.gap)
        tracker = crowded.partition(record.topic, record.partition).tracker
        want_states = steady.partition(record.topic, record.partition).tracker.segments
        assert {g: as_segment(s) for g, s in tracker.segments.items()} == want_states


def test_a_burst_of_new_producers_keeps_at_most_twice_the_bound_unpacked_on_the_bulk_path():
    log = Log()
    records = []
    for n in range(2_000):
        records += log.add_outgoing(DivStamper(n.to_bytes(16, "big")).data("t", 0, b"k", b"v", STREAM_NOW))
    v = DataIntegrityValidator()
    touched: set[bytes] = set()
    results: list = []
    peak = 0
    with mock.patch.object(tracker_module, "UNPACKED_MAX", 100):
        for start in range(0, len(records), 50):
            v.validate_run("t", 0, records[start : start + 50], 0, NOW, touched, set(), results)
            peak = max(peak, len(v.partition("t", 0).tracker.segments.active))
    segments = v.partition("t", 0).tracker.segments
    assert len(segments) == 2_000 and [r.verdict.value for r in results] == ["OK"] * len(results)
    assert 100 < peak <= 2 * 100 + 50, peak  # packed as it went, not only at a checkpoint
    assert all(as_segment(segments[n.to_bytes(16, "big")]).sequence_number == 1 for n in range(2_000))


def test_many_producers_removed_at_once_leave_exactly_the_others():
    states = ProducerStates()
    packed = {n.to_bytes(16, "big"): Segment(0, n, ChecksumType.ADHASH).pack() for n in range(1, 500)}
    states.put_packed(packed.items())
    states[b"active"] = Segment(0, 7, ChecksumType.NONE)
    gone = [g for n, g in enumerate(packed) if n % 3 == 0] + [b"active"]
    states.remove_many(gone)
    assert len(states) == 499 + 1 - len(gone)
    assert dict(states.items()) == {g: p for g, p in packed.items() if g not in gone}
    with pytest.raises(KeyError):
        states.remove_many([gone[0]])


def test_after_a_rewind_a_producer_that_writes_again_is_not_taken_for_idle():
    log = Log()
    stamper = DivStamper(GUID_A)
    v = DataIntegrityValidator()
    for _ in range(3):
        for r in log.add_outgoing(stamper.data("t", 0, b"k", b"v", 1_000)):
            v.validate(r, NOW)
    tracker = v.partition("t", 0).tracker
    tracker.pack_idle()  # the producer is at offset 2: what is at or below it has not moved
    tracker.rewound(1)  # offsets 1 and 2 come again
    state = tracker.segment(GUID_A)
    assert state is not None
    state.last_offset = 1  # a record at a rewound offset
    tracker.pack_idle()
    assert isinstance(tracker.segments[GUID_A], Segment)
    tracker.pack_idle()  # not moved since: packed
    assert isinstance(tracker.segments[GUID_A], bytes)


def test_the_unpacked_states_are_bounded_across_partitions_not_per_partition():
    """A worker of many partitions, each with a few hundred new producers (a burst over 1,000
    partitions): the unpacked states of all partitions together stay within the shared bound,
    where a bound per partition let every one of them stay unpacked."""
    partitions, producers, run = 400, 200, 10
    v = DataIntegrityValidator()
    touched: set[bytes] = set()
    results: list = []
    peak = 0
    streams = []
    for p in range(partitions):
        log = Log()
        records = []
        for n in range(producers):
            guid = (p * producers + n).to_bytes(16, "big")
            records += log.add_outgoing(DivStamper(guid).data("t", p, b"k", b"v", STREAM_NOW))
        streams.append(records)
    for start in range(0, len(streams[0]), run):
        for p in range(partitions):
            v.validate_run("t", p, streams[p][start : start + run], 0, NOW, touched, set(), results)
        peak = max(peak, sum(len(v.partition("t", p).tracker.segments.active) for p in range(partitions)))
    assert [r.verdict.value for r in results] == ["OK"] * len(results)
    assert sum(len(v.partition("t", p).tracker.segments) for p in range(partitions)) == partitions * producers
    # Twice the share left unpacked by a pass, a pass's own crowd, and a run between passes.
    bound = 3 * max(tracker_module.UNPACKED_MAX, getattr(tracker_module, "UNPACKED_MIN", 16) * partitions)
    bound += partitions * run
    assert peak <= bound < partitions * producers, (peak, bound)
