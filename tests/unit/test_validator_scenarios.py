"""Every scenario class of the DIV spec (§2-§5), stream and push, one behaviour per test."""

import pytest

from kdiv.div.faults import Verdict
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator, Semantics, TopicPolicy
from kdiv.div.wire import HEADER_NAME, ChecksumType, Kind
from tests.harness.streams import (
    GUID_A,
    GUID_B,
    NOW,
    Log,
    corrupt_value,
    header,
    validate,
    verdicts,
)

PUSH = "push"
STREAM = "stream"


def validator(phase: str = STREAM, **kwargs) -> DataIntegrityValidator:
    return DataIntegrityValidator(start_in_push=phase == PUSH, semantics=Semantics.VENICE, **kwargs)


def segment_of(log: Log, stamper: DivStamper, n: int, *, close: bool = True, partition: int = 0):
    """n data records in one segment (opened with START_OF_SEGMENT), optionally closed."""
    records = []
    for i in range(n):
        records += log.add_outgoing(stamper.data(log.topic, partition, b"key%d" % i, b"value%d" % i, NOW))
    if close:
        records += log.add_outgoing(stamper.end_segment(log.topic, partition, False, NOW))
    return records


# -- sequence numbers --------------------------------------------------------------------


@pytest.mark.parametrize("phase", [STREAM, PUSH])
@pytest.mark.parametrize("ctype", [ChecksumType.ADHASH, ChecksumType.NONE])
def test_clean_segments_validate(phase, ctype):
    log, st = Log(), DivStamper(GUID_A, checksum_type=ctype, max_records_per_segment=3)
    records = segment_of(log, st, 10)
    assert set(verdicts(validator(phase), records)) == {"OK"}


@pytest.mark.parametrize("phase", [STREAM, PUSH])
def test_redelivered_record_is_duplicate_and_changes_nothing(phase):
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, d2 = segment_of(log, st, 2, close=False)
    v = validator(phase)
    assert verdicts(v, [sos, d1, d2]) == ["OK"] * 3
    before = v.partition("t", 0).tracker.segments[GUID_A].copy()
    assert verdicts(v, [log.redeliver(d2), log.redeliver(d1)]) == ["DUPLICATE", "DUPLICATE"]
    after = v.partition("t", 0).tracker.segments[GUID_A]
    assert (after.sequence_number, after.checksum) == (before.sequence_number, before.checksum)
    assert not v.partition("t", 0).push_failed
    # The stream continues normally and its END_OF_SEGMENT checksum still matches.
    rest = log.add_outgoing(st.data("t", 0, b"k3", b"v3", NOW)) + log.add_outgoing(st.end_segment("t", 0, True, NOW))
    assert verdicts(v, rest) == ["OK", "OK"]


def test_gap_in_stream_is_missing_once_then_state_moves_past_it():
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, d2, d3, d4, eos = segment_of(log, st, 4)
    v = validator()
    results = [validate(v, r) for r in (sos, d1, d3, d4, eos)]
    assert [r.verdict.value for r in results] == ["OK", "OK", "MISSING", "OK", "CORRUPT"]
    assert results[2].detail == "seq 3 follows seq 1 in segment 0: 1 record missing (2..2)"
    assert not any(r.fatal for r in results)
    # The END_OF_SEGMENT still ended the segment, so the next one starts cleanly.
    assert verdicts(v, segment_of(log, st, 1)) == ["OK", "OK", "OK"]


def test_loss_of_last_record_is_reported_once_at_end_of_segment():
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, d2, eos = segment_of(log, st, 2)
    assert verdicts(validator(), [sos, d1, eos]) == ["OK", "OK", "MISSING"]


def test_gap_inside_push_is_fatal_and_state_stays_where_venice_leaves_it():
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, d2, d3, eos = segment_of(log, st, 3)
    v = validator(PUSH)
    results = [validate(v, r) for r in (sos, d1, d3, eos)]
    assert [r.verdict.value for r in results] == ["OK", "OK", "MISSING", "MISSING"]
    assert [r.fatal for r in results] == [False, False, True, True]
    assert v.partition("t", 0).push_failed
    assert v.partition("t", 0).tracker.segments[GUID_A].sequence_number == 1


def test_compaction_lag_excuses_gaps_only_for_old_enough_records():
    lag = 60_000
    log, st = Log(), DivStamper(GUID_A)
    records = segment_of(log, st, 4)
    sos, d1, d2, d3, d4, eos = records
    compacted = DataIntegrityValidator(
        lambda topic: TopicPolicy(compaction_lag_ms=lag), start_in_push=True, semantics=Semantics.VENICE
    )
    # d2 was compacted away; d3 is exactly lag old (>= holds), so the gap is excused, and so is
    # the END_OF_SEGMENT checksum mismatch the removal causes.
    now = NOW + lag
    assert verdicts(compacted, [sos, d1, d3, d4, eos], now) == ["OK"] * 5
    fresh = DataIntegrityValidator(
        lambda topic: TopicPolicy(compaction_lag_ms=lag), start_in_push=True, semantics=Semantics.VENICE
    )
    assert verdicts(fresh, [sos, d1, d3], now - 1) == ["OK", "OK", "MISSING"]
    not_compacted = validator(PUSH)
    assert verdicts(not_compacted, [sos, d1, d3], NOW + 10 * lag) == ["OK", "OK", "MISSING"]


# -- segments ----------------------------------------------------------------------------


def test_whole_lost_segment_is_missing_even_when_compaction_could_explain_gaps():
    log, st = Log(), DivStamper(GUID_A, max_records_per_segment=2)
    records = segment_of(log, st, 6, close=True)
    # Segments: [SOS d d EOS] [SOS d d EOS] [SOS d d EOS]; drop the middle one entirely.
    kept = records[:4] + records[8:]
    v = DataIntegrityValidator(lambda topic: TopicPolicy(compaction_lag_ms=0), semantics=Semantics.VENICE)
    results = [validate(v, r, NOW + 10**9) for r in kept]
    assert [r.verdict.value for r in results] == ["OK"] * 4 + ["MISSING", "OK", "OK", "OK"]
    assert results[4].detail == "segment 2 follows segment 0: segments 1..1 are missing"


def test_next_segment_before_end_of_segment_is_missing():
    log, st = Log(), DivStamper(GUID_A, max_records_per_segment=2)
    records = segment_of(log, st, 4)
    eos_of_first = records[3]
    assert eos_of_first.headers[0][1][1] == Kind.END_OF_SEGMENT
    kept = records[:3] + records[4:]
    v = validator()
    got = [validate(v, r) for r in kept]
    assert [r.verdict.value for r in got] == ["OK", "OK", "OK", "MISSING", "OK", "OK", "OK"]
    assert "END_OF_SEGMENT (after seq 2) is missing" in got[3].detail


def test_older_segment_is_duplicate():
    log, st = Log(), DivStamper(GUID_A, max_records_per_segment=1)
    records = segment_of(log, st, 2)
    v = validator()
    assert verdicts(v, records) == ["OK"] * 6
    assert verdicts(v, [log.redeliver(records[1])]) == ["DUPLICATE"]


def test_next_segment_without_start_of_segment_is_unregistered_even_after_push():
    log, st = Log(), DivStamper(GUID_A, max_records_per_segment=2)
    records = segment_of(log, st, 4)
    kept = records[:4] + records[5:]  # lose segment 1's START_OF_SEGMENT
    v = validator()
    assert verdicts(v, kept) == ["OK"] * 4 + ["UNREGISTERED_PRODUCER", "OK", "OK"]


@pytest.mark.parametrize("ctype,expected", [(ChecksumType.ADHASH, "DATA_AFTER_SEGMENT_END"), (ChecksumType.NONE, "OK")])
def test_data_after_end_of_segment(ctype, expected):
    log = Log()
    records = [
        log.control(Kind.START_OF_SEGMENT, 0, 0, checksum_type=ctype),
        log.control(Kind.END_OF_SEGMENT, 0, 1, segment_checksum=0, final=True),
    ]
    v = validator()
    # Build the ADHASH the END_OF_SEGMENT must carry: the START_OF_SEGMENT's CRC.
    sos_crc = int.from_bytes(records[0].headers[0][1][34:38], "big")
    records[1] = log.control(Kind.END_OF_SEGMENT, 0, 1, segment_checksum=sos_crc if ctype else 0, final=True)
    late = log.data(0, 2)
    assert verdicts(v, [records[0], records[1], late]) == ["OK", "OK", expected]


def test_data_after_end_of_segment_is_excused_by_compaction_lag():
    log, st = Log(), DivStamper(GUID_A)
    records = segment_of(log, st, 1)
    late = log.data(0, 3, timestamp=NOW - 5_000)
    v = DataIntegrityValidator(lambda topic: TopicPolicy(compaction_lag_ms=5_000), semantics=Semantics.VENICE)
    assert verdicts(v, records + [late]) == ["OK", "OK", "OK", "OK"]


# -- first record of an unknown producer (spec §2 summary table) --------------------------


@pytest.mark.parametrize(
    "segment,kind,phase,expected,stored",
    [
        (0, Kind.START_OF_SEGMENT, STREAM, "OK", True),
        (0, Kind.START_OF_SEGMENT, PUSH, "OK", True),
        (0, Kind.DATA, STREAM, "OK", True),
        (0, Kind.DATA, PUSH, "UNREGISTERED_PRODUCER", True),
        (4, Kind.START_OF_SEGMENT, STREAM, "OK", True),
        (4, Kind.START_OF_SEGMENT, PUSH, "UNREGISTERED_PRODUCER", False),
        (4, Kind.DATA, STREAM, "OK", True),
        (4, Kind.DATA, PUSH, "UNREGISTERED_PRODUCER", False),
    ],
)
def test_first_record_of_unknown_producer(segment, kind, phase, expected, stored):
    log = Log()
    first = log.control(kind, segment, 0) if kind == Kind.START_OF_SEGMENT else log.data(segment, 5)
    v = validator(phase)
    result = validate(v, first)
    assert result.verdict.value == expected
    assert result.fatal == (expected != "OK")
    assert (GUID_A in v.partition("t", 0).tracker.segments) == stored
    registered = kind == Kind.START_OF_SEGMENT
    if stored:
        assert v.partition("t", 0).tracker.segments[GUID_A].registered == registered
    # What follows: a stored segment lets the next record validate; otherwise it is reported again.
    nxt = log.data(segment, 1 if registered else 6)
    assert validate(v, nxt).verdict.value == ("OK" if stored else "UNREGISTERED_PRODUCER")


def test_mid_stream_segment_after_push_tolerates_gaps():
    log = Log()
    v = validator()
    assert verdicts(v, [log.data(3, 10), log.data(3, 11), log.data(3, 20)]) == ["OK", "OK", "OK"]


# -- checksums ---------------------------------------------------------------------------


def test_corrupt_record_is_corrupt_sequence_still_advances_and_segment_is_corrupt():
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, d2, d3, eos = segment_of(log, st, 3)
    v = validator()
    results = [validate(v, r) for r in (sos, d1, corrupt_value(d2), d3, eos)]
    assert [r.verdict.value for r in results] == ["OK", "OK", "CORRUPT", "OK", "CORRUPT"]
    assert "record CRC32" in results[2].detail and "ADHASH" in results[4].detail
    # The corrupt record was not counted twice, and the next segment starts cleanly.
    assert verdicts(v, segment_of(log, st, 1)) == ["OK", "OK", "OK"]


def test_corrupt_record_inside_push_is_fatal_but_not_missing_next():
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, d2, eos = segment_of(log, st, 2)
    v = validator(PUSH)
    got = [validate(v, r) for r in (sos, corrupt_value(d1), d2, eos)]
    assert [(r.verdict.value, r.fatal) for r in got] == [
        ("OK", False),
        ("CORRUPT", True),
        ("OK", False),
        ("CORRUPT", True),
    ]


def test_corrupt_record_checked_in_unregistered_segments_too():
    log = Log()
    v = validator()
    assert verdicts(v, [log.data(2, 7), corrupt_value(log.data(2, 8))]) == ["OK", "CORRUPT"]


def test_checksum_type_none_never_compares_end_of_segment():
    log, st = Log(), DivStamper(GUID_A, checksum_type=ChecksumType.NONE)
    sos, d1, d2, d3, eos = segment_of(log, st, 3)
    assert verdicts(validator(), [sos, d1, corrupt_value(d2), d3, eos]) == ["OK", "OK", "CORRUPT", "OK", "OK"]


def test_altered_control_record_is_caught_by_end_of_segment_only():
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, eos = segment_of(log, st, 1)
    assert verdicts(validator(), [corrupt_value(sos), d1, eos]) == ["OK", "OK", "CORRUPT"]


@pytest.mark.parametrize("phase", [STREAM, PUSH])
def test_end_of_segment_checksum_mismatch(phase):
    log, st = Log(), DivStamper(GUID_A)
    sos, d1, eos = segment_of(log, st, 1)
    forged = log.control(Kind.END_OF_SEGMENT, 0, 2, segment_checksum=12345, final=False)
    nxt = segment_of(log, st, 1)
    v = validator(phase)
    got = verdicts(v, [sos, d1, forged] + nxt)
    if phase == STREAM:
        # Ended before raising, so the next START_OF_SEGMENT is accepted.
        assert got == ["OK", "OK", "CORRUPT", "OK", "OK", "OK"]
    else:
        # Not ended inside a push: the next segment's start is reported missing, as in Venice.
        assert got[:4] == ["OK", "OK", "CORRUPT", "MISSING"]


# -- push phases -------------------------------------------------------------------------


def test_push_markers_switch_phase_and_faults_are_fatal_only_inside():
    log, st = Log(), DivStamper(GUID_A)
    v = validator()
    sop = log.add_outgoing(st.control("t", 0, Kind.START_OF_PUSH, NOW))
    assert [validate(v, r).fatal for r in sop] == [False, False]
    assert v.partition("t", 0).in_push
    d1 = log.add_outgoing(st.data("t", 0, b"k", b"v", NOW))
    lost = log.add_outgoing(st.data("t", 0, b"k", b"v", NOW))
    d3 = log.add_outgoing(st.data("t", 0, b"k", b"v", NOW))
    assert [(r.verdict.value, r.fatal) for r in (validate(v, x) for x in d1 + d3)] == [("OK", False), ("MISSING", True)]
    assert v.partition("t", 0).push_failed
    eop = log.add_outgoing(st.control("t", 0, Kind.END_OF_PUSH, NOW))
    # Inside the failed push the producer's seq never moved past the gap.
    assert validate(v, eop[0]).verdict is Verdict.MISSING
    assert not v.partition("t", 0).in_push
    assert v.partition("t", 0).push_failed, "the push stays FAILED until the next START_OF_PUSH"
    # A new push clears FAILED.
    v2 = validator()
    log2, st2 = Log(), DivStamper(GUID_B)
    recs = log2.add_outgoing(st2.control("t", 0, Kind.START_OF_PUSH, NOW))
    recs += log2.add_outgoing(st2.control("t", 0, Kind.END_OF_PUSH, NOW))
    assert verdicts(v2, recs) == ["OK", "OK", "OK"]
    assert not v2.partition("t", 0).in_push and not v2.partition("t", 0).push_failed
    assert lost  # the record that never reached the validator


def test_duplicate_push_marker_does_not_change_phase():
    log, st = Log(), DivStamper(GUID_A)
    v = validator()
    sop = log.add_outgoing(st.control("t", 0, Kind.START_OF_PUSH, NOW))
    eop = log.add_outgoing(st.control("t", 0, Kind.END_OF_PUSH, NOW))
    assert verdicts(v, sop + eop) == ["OK", "OK", "OK"]
    assert validate(v, log.redeliver(sop[1])).verdict is Verdict.DUPLICATE
    assert not v.partition("t", 0).in_push


def test_new_push_clears_failed_and_a_faulty_start_of_push_fails_its_own_push():
    log = Log()
    v = validator(PUSH)
    assert validate(v, log.data(3, 3)).fatal  # unregistered inside a push
    assert v.partition("t", 0).push_failed
    sop = log.control(Kind.START_OF_PUSH, 0, 1, guid=GUID_B)  # GUID_B never sent its SOS
    result = validate(v, sop)
    assert result.verdict is Verdict.UNREGISTERED_PRODUCER and result.fatal
    assert v.partition("t", 0).in_push and v.partition("t", 0).push_failed


def test_phases_are_per_partition():
    log, st = Log(), DivStamper(GUID_A)
    v = validator()
    verdicts(v, log.add_outgoing(st.control("t", 0, Kind.START_OF_PUSH, NOW)))
    assert v.partition("t", 0).in_push and not v.partition("t", 1).in_push
    assert validate(v, log.data(2, 2, partition=1)).verdict is Verdict.OK  # streaming partition 1


# -- expiry ------------------------------------------------------------------------------


def test_max_age_expiry_is_data_relative_and_anchored_at_the_previous_checkpoint():
    log = Log()
    v = validator(max_age_ms=1_000)
    old = DivStamper(GUID_A)
    young = DivStamper(GUID_B)
    verdicts(v, log.add_outgoing(old.data("t", 0, b"k", b"v", 10_000)))
    first = v.checkpoint("t", 0)
    assert set(first.upserts) == {GUID_A} and first.expired == ()
    verdicts(v, log.add_outgoing(young.data("t", 0, b"k", b"v", 50_000)))
    # The anchor is still 10_000 (saved at the previous checkpoint): nothing expires yet.
    second = v.checkpoint("t", 0)
    assert set(second.upserts) == {GUID_A, GUID_B} and second.expired == ()
    third = v.checkpoint("t", 0)
    assert set(third.upserts) == {GUID_B} and third.expired == (GUID_A,)
    # Kept iff ts >= anchor - maxAge: exactly maxAge older than the anchor survives.
    verdicts(v, log.add_outgoing(old.data("t", 0, b"k", b"v", 49_000)))
    assert v.checkpoint("t", 0).expired == ()


def test_expired_producer_returning_mid_segment_is_unregistered_only_inside_a_push():
    for phase, expected in ((STREAM, "OK"), (PUSH, "UNREGISTERED_PRODUCER")):
        log, st = Log(), DivStamper(GUID_A)
        v = validator(phase, max_age_ms=10)
        recs = log.add_outgoing(st.data("t", 0, b"k", b"v", 100))
        verdicts(v, recs)
        v.checkpoint("t", 0)
        verdicts(v, log.add_outgoing(DivStamper(GUID_B).data("t", 0, b"k", b"v", 10_000)))
        v.checkpoint("t", 0)
        assert v.checkpoint("t", 0).expired == (GUID_A,)
        later = log.add_outgoing(st.data("t", 0, b"k", b"v", 10_001))
        assert verdicts(v, later) == [expected]


def test_expiry_disabled_keeps_everything():
    log = Log()
    v = validator()
    verdicts(v, log.add_outgoing(DivStamper(GUID_A).data("t", 0, b"k", b"v", 0)))
    verdicts(v, log.add_outgoing(DivStamper(GUID_B).data("t", 0, b"k", b"v", 10**12)))
    for _ in range(3):
        assert v.checkpoint("t", 0).expired == ()


# -- records that are not ours or cannot be read -----------------------------------------


def test_untracked_and_malformed_never_touch_state():
    log = Log()
    v = validator(PUSH)
    plain = log.add(b"k", b"v", (("other", b"x"),))
    twice = log.add(b"k", b"v", ((HEADER_NAME, header(Kind.DATA, 0, 1, b"k", b"v")),) * 2)
    null = log.add(b"k", b"v", ((HEADER_NAME, None),))
    short = log.add(b"k", b"v", ((HEADER_NAME, b"\x01\x00"),))
    got = [validate(v, r) for r in (plain, twice, null, short)]
    assert [r.verdict.value for r in got] == ["UNTRACKED", "MALFORMED", "MALFORMED", "MALFORMED"]
    assert got[1].detail == "2 div headers, expected one"
    assert not any(r.fatal for r in got)
    assert v.partition("t", 0).tracker.segments == {}
    assert not v.partition("t", 0).push_failed
    assert v.partition("t", 0).counts == {Verdict.UNTRACKED: 1, Verdict.MALFORMED: 3}


def test_producers_are_independent_within_a_partition():
    log = Log()
    a, b = DivStamper(GUID_A), DivStamper(GUID_B)
    records = []
    for i in range(3):
        records += log.add_outgoing(a.data("t", 0, b"a", b"%d" % i, NOW))
        records += log.add_outgoing(b.data("t", 0, b"b", b"%d" % i, NOW))
    records += log.add_outgoing(a.end_segment("t", 0, True, NOW)) + log.add_outgoing(b.end_segment("t", 0, True, NOW))
    assert set(verdicts(validator(PUSH), records)) == {"OK"}


@pytest.mark.parametrize("semantics", [Semantics.EXACT, Semantics.VENICE])
def test_a_producer_clock_far_ahead_expires_no_other_producer_under_the_exact_semantics(semantics):
    """One producer stamping 2^60 (or microseconds): Venice anchors expiry at it and forgets
    every other producer of the partition two checkpoints later; the exact semantics anchors
    only at timestamps no further ahead of the validation's time than maxAge."""
    week = 7 * 24 * 3600 * 1000
    for far_ahead in (2**60, NOW * 1000):
        log = Log()
        v = DataIntegrityValidator(semantics=semantics, max_age_ms=week)
        verdicts(v, log.add_outgoing(DivStamper(GUID_A).data("t", 0, b"k", b"v", NOW)))
        verdicts(v, log.add_outgoing(DivStamper(GUID_B).data("t", 0, b"k", b"v", far_ahead)))
        expired = [guid for _ in range(3) for guid in v.checkpoint("t", 0).expired]
        assert expired == ([] if semantics is Semantics.EXACT else [GUID_A]), far_ahead
    # Credible clocks still expire, as Venice's rule says.
    log = Log()
    v = DataIntegrityValidator(semantics=Semantics.EXACT, max_age_ms=week)
    verdicts(v, log.add_outgoing(DivStamper(GUID_A).data("t", 0, b"k", b"v", NOW - 2 * week)))
    verdicts(v, log.add_outgoing(DivStamper(GUID_B).data("t", 0, b"k", b"v", NOW)))
    assert [guid for _ in range(3) for guid in v.checkpoint("t", 0).expired] == [GUID_A]
