"""The exact semantics beside Venice's: LATE, DIVERGENT, one gap one incident, and state that
keeps them across a save and restore. Each scenario is also run under Venice's semantics,
which must give Venice's verdicts."""

import pytest

from kdiv.div.segment import Segment, as_segment
from kdiv.div.stamper import DivStamper, OutgoingRecord
from kdiv.div.validator import DEFAULT_WINDOW, DataIntegrityValidator, Semantics
from kdiv.div.wire import HEADER_NAME, Kind
from kdiv.state.codec import decode_partition, decode_segment, encode_partition, encode_segment
from kdiv.worker.incidents import incidents_for
from tests.harness.streams import GUID_A, NOW, Log, header

EXACT, VENICE = Semantics.EXACT, Semantics.VENICE


def stamped(n: int, *, close: bool = True) -> list[OutgoingRecord]:
    """START_OF_SEGMENT, n data records (seq 1..n), END_OF_SEGMENT (ADHASH)."""
    st = DivStamper(GUID_A, max_records_per_segment=10_000)
    out: list[OutgoingRecord] = []
    for i in range(n):
        out += st.data("t", 0, b"key%d" % i, b"value%d" % i, NOW)
    if close:
        out += st.end_segment("t", 0, False, NOW)
    return out


def judge(semantics: Semantics, records, *, push: bool = False) -> list:
    v = DataIntegrityValidator(start_in_push=push, semantics=semantics)
    return [v.validate(r, NOW) for r in records]


def names(results) -> list[str]:
    return [r.verdict.value for r in results]


@pytest.mark.parametrize(
    ("semantics", "expected"),
    [
        # seq 5 before seq 4: Venice reads MISSING then DUPLICATE, and the segment's checksum
        # lacks the record it called a duplicate; exact: LATE, and the checksum matches.
        (VENICE, ["MISSING", "DUPLICATE", "OK", "CORRUPT"]),
        (EXACT, ["MISSING", "LATE", "OK", "OK"]),
    ],
)
def test_a_reordered_record(semantics, expected):
    out = stamped(6)  # SOS, seq 1..6, EOS
    log = Log()
    records = log.add_outgoing(out[:4] + [out[5], out[4]] + out[6:])
    results = judge(semantics, records)
    assert names(results[:4]) == ["OK"] * 4
    assert names(results[4:]) == expected
    if semantics is EXACT:
        late = results[5]
        assert "arrived late, after seq 5" in late.detail and "offset 4" in late.detail
        assert late.gap is not None and late.gap.resolved and (late.gap.first, late.gap.last) == (4, 4)
        # The gap's one MISSING incident, now resolved, naming where the record arrived.
        incidents = incidents_for(late, NOW)
        assert [i.verdict for i in incidents] == ["LATE", "MISSING"]
        missing = incidents[1]
        assert (missing.seq, missing.offset, missing.resolved_at_ms) == (4, 4, NOW)
        assert "all arrived late: seq 4 at offset 5" in missing.detail
        # The MISSING record's incident has the same key: one incident for the loss.
        assert [i.key for i in incidents_for(results[4], NOW)] == [missing.key]


@pytest.mark.parametrize("push", [False, True])
def test_a_divergent_resend_and_a_plain_duplicate(push):
    out = stamped(3, close=False)
    log = Log()
    records = log.add_outgoing(out)
    again = log.redeliver(records[2])  # seq 2, the same bytes
    altered_value = b"other"  # re-stamped under the same seq by a buggy producer
    rewritten = log.add(
        records[2].key,
        altered_value,
        ((HEADER_NAME, header(Kind.DATA, 0, 2, records[2].key, altered_value, guid=GUID_A)),),
    )
    exact = judge(EXACT, [*records, again, rewritten], push=push)
    venice = judge(VENICE, [*records, again, rewritten], push=push)
    assert names(exact[4:]) == ["DUPLICATE", "DIVERGENT"]
    assert names(venice[4:]) == ["DUPLICATE", "DUPLICATE"]
    assert "same CRC" in exact[4].detail
    assert "other bytes under one seq" in exact[5].detail
    # Two versions of one record inside a push fail it; a duplicate never does.
    assert (exact[4].fatal, exact[5].fatal) == (False, push)


def test_one_loss_inside_a_push_is_one_incident_that_counts_the_records_after_it():
    out = stamped(10, close=False)  # SOS, seq 1..10
    del out[4]  # seq 4 lost
    records = Log().add_outgoing(out)
    exact = judge(EXACT, records, push=True)
    venice = judge(VENICE, records, push=True)
    # Per record, Venice's rule in both: every later record of the producer is MISSING.
    assert names(exact) == names(venice) == ["OK"] * 4 + ["MISSING"] * 6
    assert venice[5].detail.endswith("2 records missing (4..5)")
    exact_keys = {i.key for r in exact for i in incidents_for(r, NOW)}
    venice_keys = {i.key for r in venice for i in incidents_for(r, NOW)}
    assert len(exact_keys) == 1 and len(venice_keys) == 6
    last = incidents_for(exact[-1], NOW)[0]
    assert (last.seq, last.offset, last.severity) == (4, 4, "fatal")
    assert last.detail.startswith("seq 4..4 of segment 0 missing (1 record), found at offset 4 by seq 5")
    assert "5 later records of the producer judged after it" in last.detail and "offset 9" in last.detail
    # The per-record detail keeps Venice's range and names the one gap.
    assert "2 records missing (4..5); one gap: seq 4..4" in exact[5].detail


def test_a_second_gap_in_a_push_is_its_own_incident_and_a_late_record_resolves_the_first():
    out = stamped(10, close=False)
    records_out = out[:4] + out[5:7] + out[8:] + [out[4]]  # seq 4 and 7 lost; seq 4 arrives last
    records = Log().add_outgoing(records_out)
    results = judge(EXACT, records, push=True)
    gaps = {(r.gap.first, r.gap.last) for r in results if r.gap is not None}
    assert gaps == {(4, 4), (7, 7)}
    assert results[-1].verdict.value == "LATE" and results[-1].gap.resolved
    keys = {i.key: i for r in results for i in incidents_for(r, NOW)}
    by_class: dict[str, list] = {}
    for incident in keys.values():
        by_class.setdefault(incident.verdict, []).append(incident.seq)
    assert sorted(by_class["MISSING"]) == [4, 7] and by_class["LATE"] == [4]


def test_a_duplicate_past_the_window_is_judged_by_venices_rule_and_says_so():
    out = stamped(40, close=False)
    log = Log()
    records = log.add_outgoing(out)
    old = log.redeliver(records[2])  # seq 2, 38 seqs back
    v = DataIntegrityValidator(window=16)
    results = [v.validate(r, NOW) for r in [*records, old]]
    assert results[-1].verdict.value == "DUPLICATE"
    assert "not among the last 16 seqs kdiv compares" in results[-1].detail


def test_the_exact_state_survives_a_save_and_restore_between_the_loss_and_the_late_record():
    out = stamped(6)
    records = Log().add_outgoing(out[:4] + [out[5], out[4]] + out[6:])
    restored = DataIntegrityValidator()
    for r in records[:5]:  # up to the MISSING seq 5
        restored.validate(r, NOW)
    part = restored.partition("t", 0)
    producers = {guid: decode_segment(encode_segment(as_segment(s))) for guid, s in part.tracker.segments.items()}
    saved = producers[GUID_A]
    assert saved.gaps is not None and [(g.first, g.last) for g in saved.gaps.gaps] == [(4, 4)]
    assert saved.recent is not None and len(saved.recent) == DEFAULT_WINDOW
    again = DataIntegrityValidator()
    again.restore_partition("t", 0, decode_partition(encode_partition(part)), producers)
    assert names([again.validate(r, NOW) for r in records[5:]]) == ["LATE", "OK", "OK"]


def test_the_packed_state_keeps_the_ring_and_the_gaps():
    out = stamped(8, close=False)
    v = DataIntegrityValidator()
    for r in Log().add_outgoing(out[:3] + out[5:]):  # seq 3..4 lost
        v.validate(r, NOW)
    segment = as_segment(v.partition("t", 0).tracker.segments[GUID_A])
    packed = segment.pack()
    assert Segment.unpack(packed) == segment
    assert len(packed) == len(Segment(0, 0, segment.checksum_type).pack()) + 2 + 8 * DEFAULT_WINDOW + len(
        segment.gaps.pack()
    )


def test_venice_semantics_keeps_no_exact_state():
    records = Log().add_outgoing(stamped(5))
    v = DataIntegrityValidator(semantics=VENICE)
    for r in records:
        v.validate(r, NOW)
    segment = as_segment(v.partition("t", 0).tracker.segments[GUID_A])
    assert segment.recent is None and segment.gaps is None and v.window == 0


def test_a_producer_keeps_its_first_seen_time_across_segments_and_a_save():
    st = DivStamper(GUID_A, max_records_per_segment=3)
    log = Log()
    records = []
    for i in range(10):  # four segments, one record a second
        records += log.add_outgoing(st.data("t", 0, b"k%d" % i, b"v", NOW + 1000 * i))
    v = DataIntegrityValidator()
    assert {v.validate(r, NOW).verdict.value for r in records} == {"OK"}
    segment = as_segment(v.partition("t", 0).tracker.segments[GUID_A])
    assert segment.segment_number == 3 and segment.first_seen_ts == NOW
    assert segment.last_producer_ts == NOW + 9000
    assert decode_segment(encode_segment(segment)).first_seen_ts == NOW == Segment.unpack(segment.pack()).first_seen_ts


def test_a_late_record_that_is_corrupt_leaves_its_gap_open_until_an_intact_copy_arrives():
    out = stamped(5, close=False)  # SOS, seq 1..5
    log = Log()
    records = log.add_outgoing(out[:3] + out[4:])  # seq 3 lost
    late = out[3]
    broken = log.add(late.key, b"tampered", late.headers)
    intact = log.add(late.key, late.value, late.headers)
    results = judge(EXACT, [*records, broken, intact])
    assert names(results) == ["OK", "OK", "OK", "MISSING", "OK", "CORRUPT", "LATE"]
    assert results[5].gap is not None and not results[5].gap.resolved
    assert results[6].gap is not None and results[6].gap.resolved
