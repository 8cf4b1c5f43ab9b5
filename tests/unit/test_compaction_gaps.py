"""Which sequence gaps log compaction explains, in each semantics.

The cleaner removes a superseded record only once it is `min.compaction.lag.ms` old. A gap's
missing records were written after the producer's previous record, so the exact semantics
excuses a gap when that previous record is old enough (the oldest missing record may then be);
Venice asks it of the record that closes the gap.
"""

from __future__ import annotations

from kdiv.div.validator import DataIntegrityValidator, Semantics, TopicPolicy
from kdiv.div.wire import ChecksumType, Kind, adhash_add, record_crc
from tests.harness.streams import NOW, Log, verdicts

LAG = 60_000
OLD = NOW - 10 * LAG


def validator(semantics: Semantics, lag: int | None = LAG) -> DataIntegrityValidator:
    return DataIntegrityValidator(lambda topic: TopicPolicy(compaction_lag_ms=lag), semantics=semantics)


def compacted_log(closing_ts: int) -> Log:
    """seq 1..3 written long ago, 2 removed by the cleaner; seq 3 written at `closing_ts`."""
    log = Log()
    log.control(Kind.START_OF_SEGMENT, 0, 0, timestamp=OLD, producer_ts=OLD, checksum_type=ChecksumType.ADHASH)
    log.data(0, 1, timestamp=OLD, producer_ts=OLD)
    log.data(0, 3, b"k3", timestamp=closing_ts, producer_ts=closing_ts)
    return log


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
        log.data(0, 3)
        assert verdicts(validator(semantics), log.records) == ["OK", "OK", "MISSING"], semantics


def test_a_gap_in_a_topic_that_is_not_compacted_is_missing_however_old():
    log = compacted_log(OLD)
    assert verdicts(validator(Semantics.EXACT, lag=None), log.records) == ["OK", "OK", "MISSING"]


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
