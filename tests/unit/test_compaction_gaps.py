"""Which sequence gaps log compaction explains, in each semantics.

The cleaner removes a superseded record only once it is `min.compaction.lag.ms` old, and it
leaves the record's offset as a hole. Venice excuses a gap when the record that closes it is
that old, by the wall clock. The exact semantics asks that of the producer's previous record
(the gap's records were written after it), but only as a necessary condition: what decides
is the log's evidence, an offset hole between the two records for each record missing, so a
worker validating long after the lag excuses no more than one validating at once.
"""

from __future__ import annotations

from itertools import islice
from types import SimpleNamespace

from kdiv.div.compaction import holes_at, weigh_gap
from kdiv.div.exact import Gap, GapLog
from kdiv.div.record import consumed
from kdiv.div.segment import Segment
from kdiv.div.validator import DataIntegrityValidator, Semantics, TopicPolicy, ValidationResult
from kdiv.div.wire import ChecksumType, Kind, adhash_add, record_crc
from kdiv.state.values import StateValues
from kdiv.worker.incidents import incidents_for
from kdiv.worker.live import LiveValidation
from kdiv.worker.metrics import WorkerCollector
from kdiv.worker.readout import WorkerReadout
from tests.harness.streams import GUID_A, GUID_B, NOW, Log, verdicts

LAG = 60_000
OLD = NOW - 10 * LAG
# A worker running far behind: every record is long past the lag by its clock.
LATE = NOW + 100 * LAG


def validator(semantics: Semantics = Semantics.EXACT, lag: int | None = LAG) -> DataIntegrityValidator:
    return DataIntegrityValidator(lambda topic: TopicPolicy(compaction_lag_ms=lag), semantics=semantics)


def started(log: Log, guid: bytes = GUID_A, ts: int = OLD) -> None:
    log.control(Kind.START_OF_SEGMENT, 0, 0, guid=guid, timestamp=ts, producer_ts=ts, checksum_type=ChecksumType.ADHASH)


def compacted_log(closing_ts: int) -> Log:
    """seq 1..3 written long ago, 2 removed by the cleaner (its offset a hole); seq 3 written at `closing_ts`."""
    log = Log()
    started(log)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.skip()
    log.data(0, 3, b"k3", timestamp=closing_ts, producer_ts=closing_ts)
    return log


def lost_log() -> Log:
    """The same producer, seq 2 lost before it was written: no offset was ever given to it."""
    log = Log()
    started(log)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.data(0, 3, b"k3", timestamp=OLD, producer_ts=OLD)
    return log


def results(v: DataIntegrityValidator, log: Log, now_ms: int = NOW) -> list[ValidationResult]:
    return [v.validate(r, now_ms) for r in log.records]


def test_a_gap_after_an_old_record_closed_by_a_fresh_one_is_compaction_in_exact_semantics():
    assert verdicts(validator(Semantics.EXACT), compacted_log(NOW).records) == ["OK", "OK", "OK"]


def test_venice_asks_the_record_that_closes_the_gap():
    assert verdicts(validator(Semantics.VENICE), compacted_log(NOW).records) == ["OK", "OK", "MISSING"]
    assert verdicts(validator(Semantics.VENICE), compacted_log(OLD).records) == ["OK", "OK", "OK"]


def test_a_gap_among_fresh_records_is_missing_in_both():
    for semantics in Semantics:
        log = Log()
        log.control(Kind.START_OF_SEGMENT, 0, 0, checksum_type=ChecksumType.ADHASH)
        log.data(0, 1)
        log.skip()
        log.data(0, 3)
        assert verdicts(validator(semantics), log.records) == ["OK", "OK", "MISSING"], semantics


def test_a_gap_in_a_topic_that_is_not_compacted_is_missing_however_old():
    log = compacted_log(OLD)
    assert verdicts(validator(Semantics.EXACT, lag=None), log.records) == ["OK", "OK", "MISSING"]


def test_a_loss_validated_long_after_the_lag_is_still_missing_in_exact_semantics():
    """The worker's clock is past the lag for every record, but the log has no hole where
    seq 2 would be: it was never written, and compaction cannot have removed it."""
    got = results(validator(), lost_log(), LATE)
    assert [r.verdict.value for r in got] == ["OK", "OK", "MISSING"]
    assert "not compaction: the log has 0 offset holes between offsets 1 and 2, fewer than the 1 record missing" in (
        got[2].detail
    )
    # The gap's incident (rewritten as the gap changes) says so too, and its state keeps it.
    incident = incidents_for(got[2], LATE)[0]
    assert "; not compaction: the log has 0 offset holes between the producer's records" in incident.detail
    packed = GapLog.unpack(GapLog(0, 3, [Gap(0, 2, 2, 2, 3, holes=0)]).pack())
    assert packed.gaps[0].holes == 0
    # Venice's rule, by the wall clock, excuses it: it must match Venice's verdicts.
    assert verdicts(validator(Semantics.VENICE), lost_log().records, LATE) == ["OK", "OK", "OK"]
    # While compaction's gap, validated as late, is excused.
    assert verdicts(validator(), compacted_log(OLD).records, LATE) == ["OK", "OK", "OK"]


def test_a_gap_needs_a_hole_for_every_record_missing():
    log = Log()
    started(log)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.skip()  # one hole, two seqs missing
    log.data(0, 4, timestamp=OLD, producer_ts=OLD)
    got = results(validator(), log, LATE)
    assert [r.verdict.value for r in got] == ["OK", "OK", "MISSING"]
    assert "1 offset hole between offsets 1 and 3, fewer than the 2 records missing" in got[2].detail

    log = Log()
    started(log)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.skip(2)
    log.data(0, 4, timestamp=OLD, producer_ts=OLD)
    assert verdicts(validator(), log.records, LATE) == ["OK", "OK", "OK"]


def test_holes_count_whoever_left_them_and_other_records_between_are_no_holes():
    """A hole between the producer's records counts, whichever record was there (another
    producer's superseded record, a transaction marker): the rule weighs the gap against the
    log, not against its own producer's records. Another producer's record there is no hole."""
    log = Log()
    started(log)
    started(log, GUID_B)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.data(0, 1, b"b1", guid=GUID_B, timestamp=OLD, producer_ts=OLD)
    log.skip()  # B's seq 2, removed by the cleaner
    log.data(0, 3, b"b3", guid=GUID_B, timestamp=OLD, producer_ts=OLD)
    log.data(0, 3, timestamp=OLD, producer_ts=OLD)  # A's seq 2 lost: the one hole is B's, yet it counts
    assert verdicts(validator(), log.records, LATE) == ["OK"] * 6

    log = Log()
    started(log)
    started(log, GUID_B)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.data(0, 1, b"b1", guid=GUID_B, timestamp=OLD, producer_ts=OLD)
    log.data(0, 2, b"b2", guid=GUID_B, timestamp=OLD, producer_ts=OLD)
    log.data(0, 3, timestamp=OLD, producer_ts=OLD)
    assert verdicts(validator(), log.records, LATE) == ["OK"] * 5 + ["MISSING"]


def test_a_gap_whose_holes_are_not_known_is_missing_and_says_it_cannot_be_told():
    """State saved before holes were counted (an earlier kdiv): the gap may be compaction's,
    but nothing shows it, so it is reported, as such, and counted."""
    v = validator()
    log = compacted_log(OLD)
    sos, first, closing = log.records
    assert verdicts(v, [sos, first], LATE) == ["OK", "OK"]
    part = v.partition("t", 0)
    segment = part.tracker.segment(GUID_A)
    assert segment is not None and segment.partition_holes == 0
    segment.partition_holes = -1
    got = v.validate(closing, LATE)
    assert got.verdict.value == "MISSING"
    assert "compaction or loss, which cannot be told" in got.detail
    assert "offset 1) are not known" in got.detail
    assert "compaction or loss, which cannot be told" in incidents_for(got, LATE)[0].detail
    assert part.untold_gaps == 1
    # The producer's next gap has its evidence again.
    assert segment.partition_holes == 1
    log.skip()
    assert v.validate(log.data(0, 5, timestamp=OLD, producer_ts=OLD), LATE).verdict.value == "OK"
    assert part.untold_gaps == 1


def test_a_compaction_gap_is_excused_alike_one_by_one_and_in_bulk():
    log = Log()
    started(log)
    started(log, GUID_B)
    for seq in range(1, 7):
        if seq in (3, 4):
            log.skip()  # A's seq 3 and 4 removed by the cleaner
        else:
            log.data(0, seq, b"a%d" % seq, timestamp=OLD, producer_ts=OLD)
        log.data(0, seq, b"b%d" % seq, guid=GUID_B, timestamp=OLD, producer_ts=OLD)
    log.data(0, 9, b"b9", guid=GUID_B, timestamp=OLD, producer_ts=OLD)  # B's 7 and 8 lost: no holes
    one_by_one = validator()
    got = [one_by_one.validate(r, LATE) for r in log.records]
    assert [(r.guid, r.seq, r.verdict.value) for r in got if r.verdict.value != "OK"] == [(GUID_B, 9, "MISSING")]

    bulk = validator()
    reported: list[ValidationResult] = []
    fetched = list(log.records)
    assert bulk.validate_run("t", 0, fetched, 0, LATE, set(), set(), reported) == len(fetched)
    assert [(r.guid, r.seq, r.verdict.value) for r in reported if r.verdict.value != "OK"] == [(GUID_B, 9, "MISSING")]
    for v in (one_by_one, bulk):
        part = v.partition("t", 0)
        assert (part.holes, part.holes_from, part.last_offset) == (2, 0, len(log.records) + 1)
        tracker = part.tracker
        assert [tracker.segment(g).partition_holes for g in (GUID_A, GUID_B)] == [2, 2]


def test_the_end_of_segment_after_an_excused_gap_is_not_corrupt_but_an_unexcused_mismatch_is():
    log = compacted_log(NOW)
    # The producer's checksum covers seq 1..3; seq 2 is gone, so ours would differ.
    full = 0
    for key in (b"k", b"k2", b"k3"):
        full = adhash_add(full, record_crc(Kind.DATA, key, b"v"))
    log.control(Kind.END_OF_SEGMENT, 0, 4, segment_checksum=full)
    assert verdicts(validator(Semantics.EXACT), log.records) == ["OK", "OK", "OK", "OK"]

    fresh = Log()
    fresh.control(Kind.START_OF_SEGMENT, 0, 0, checksum_type=ChecksumType.ADHASH)
    fresh.data(0, 1)
    fresh.control(Kind.END_OF_SEGMENT, 0, 2, segment_checksum=full)
    assert verdicts(validator(Semantics.EXACT), fresh.records) == ["OK", "OK", "CORRUPT"]


def test_a_checksum_mismatch_without_a_gap_is_corrupt_however_late_in_exact_semantics():
    """No seq is missing, so compaction removed nothing of the segment: a mismatch at its
    END_OF_SEGMENT is corruption, whatever the clock (Venice's rule excuses it when old)."""
    log = Log()
    started(log)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.control(Kind.END_OF_SEGMENT, 0, 2, segment_checksum=12345, timestamp=OLD, producer_ts=OLD)
    assert verdicts(validator(), log.records, LATE) == ["OK", "OK", "CORRUPT"]
    assert verdicts(validator(Semantics.VENICE), log.records, LATE) == ["OK", "OK", "OK"]


def test_records_deleted_before_validation_leave_no_evidence_for_a_gap_across_them():
    """The log starts past offsets the worker never read: they are no holes, and whether
    the cleaner had removed the missing records there first is not known."""
    live = LiveValidation(validator(), StateValues(7))
    live.load("t", 0, [])
    log = compacted_log(OLD)
    for record in log.records[:2]:
        assert live.process(record, LATE) is not None
    log.skip(5)  # deleted by retention before the worker read them
    assert live.log_starts_at("t", 0, 7, "fetch", "-") is not None
    closing = log.data(0, 9, timestamp=OLD, producer_ts=OLD)
    got = live.process(closing, LATE)
    assert got is not None and got.verdict.value == "MISSING"
    assert "compaction or loss, which cannot be told: offsets before 7 were not read" in got.detail
    assert live.validator.partition("t", 0).untold_gaps == 1


def test_a_record_validated_again_after_a_crash_is_weighed_by_bounds_on_the_holes():
    """The partition's state was saved past a producer's (a crash between the two writes):
    its record is validated again behind the partition's last offset, where the holes up to
    it are known only within bounds. They decide when they can; otherwise it cannot be told."""
    log = Log()
    started(log)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)  # offset 1
    log.skip()  # 2: A's seq 2
    log.data(0, 3, timestamp=OLD, producer_ts=OLD)  # offset 3
    log.data(0, 1, b"b", guid=GUID_B, timestamp=OLD, producer_ts=OLD)  # offset 4 (an unregistered B, OK)
    v = validator()
    for record in log.records[:2]:
        v.validate(record, LATE)
    saved = v.partition("t", 0).tracker.segment(GUID_A).copy()
    for record in log.records[2:]:
        v.validate(record, LATE)
    v.partition("t", 0).tracker.segments[GUID_A] = saved.copy()
    # Up to offset 3 the holes are known exactly (none can lie between 3 and 4).
    again = v.bring_forward(consumed("t", 0, log.records[2]), LATE, 1, log.records[2].headers[0][1])
    assert again.verdict.value == "OK"
    assert v.partition("t", 0).tracker.segment(GUID_A).partition_holes == 1

    assert holes_at(7, 3, 4) == (1, 3)  # two of the partition's holes may lie past offset 4
    assert weigh_gap(2, 1, 0, 0, 4, 1, 3).untold
    assert weigh_gap(1, 1, 0, 0, 4, 1, 3).explains
    assert not weigh_gap(4, 1, 0, 0, 4, 1, 3).untold  # at most 3 holes: 4 records cannot be compaction's


def test_producer_states_carry_their_hole_count_packed():
    segment = Segment(1, 5, ChecksumType.ADHASH, [0] * 8)
    segment.partition_holes = 1 << 40
    segment.last_offset = 7
    assert Segment.unpack(segment.pack()) == segment


def test_gaps_that_cannot_be_told_are_counted_in_the_metrics():
    v = validator()
    log = compacted_log(OLD)
    sos, first, closing = log.records
    verdicts(v, [sos, first], LATE)
    v.partition("t", 0).tracker.segment(GUID_A).partition_holes = -1
    assert v.validate(closing, LATE).verdict.value == "MISSING"
    worker = SimpleNamespace(
        live=SimpleNamespace(validator=v),
        assigned_partitions=lambda: [("t", 0)],
        is_loaded=lambda topic, partition: True,
        changefeed_topics=(),
        partition_progress=list,
    )
    families = {family.name: family for family in islice(WorkerCollector(WorkerReadout(worker)).collect(), 11)}
    (sample,) = families["kdiv_compaction_gaps_untold"].samples
    assert (sample.labels, sample.value) == ({"topic": "t", "partition": "0"}, 1)
