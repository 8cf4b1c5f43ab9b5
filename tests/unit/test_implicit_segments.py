"""Implicit segments (format version 2, docs/java-producers.md): DATA records of a producer
that sends no control records, as kdiv's Java interceptor stamps them."""

import pytest

from kdiv.div.validator import DataIntegrityValidator, Semantics
from kdiv.div.wire import HEADER_NAME, DivHeader, Kind, encode, record_crc
from tests.harness.streams import GUID_A, GUID_B, NOW, Log, corrupt_value, verdicts


def implicit(log: Log, seq: int, *, guid: bytes = GUID_A, segment: int = 0, value: bytes | None = None):
    key, value = b"k%d" % seq, value if value is not None else b"v%d" % seq
    header = encode(
        DivHeader(Kind.DATA, guid, segment, seq, NOW, record_crc(Kind.DATA, key, value), implicit_segment=True)
    )
    return log.add(key, value, ((HEADER_NAME, header),))


def exact(**kwargs) -> DataIntegrityValidator:
    return DataIntegrityValidator(semantics=Semantics.EXACT, **kwargs)


def venice(**kwargs) -> DataIntegrityValidator:
    return DataIntegrityValidator(semantics=Semantics.VENICE, **kwargs)


@pytest.mark.parametrize("make", [exact, venice])
def test_segment_opened_by_its_first_record_validates(make):
    log = Log()
    assert verdicts(make(), [implicit(log, s) for s in range(5)]) == ["OK"] * 5


def test_gap_is_missing_in_exact_semantics():
    log = Log()
    records = [implicit(log, s) for s in (0, 1, 2, 5, 6)]
    assert verdicts(exact(), records) == ["OK", "OK", "OK", "MISSING", "OK"]


def test_gap_after_a_mid_segment_first_record_is_missing_too():
    # The producer's first records are gone (e.g. retention): not a fault, but from the first
    # one seen on, its seqs must follow.
    log = Log()
    records = [implicit(log, s) for s in (40, 41, 43)]
    assert verdicts(exact(), records) == ["OK", "OK", "MISSING"]


def test_venice_semantics_judges_them_as_data_without_start_of_segment():
    # Venice tolerates gaps in a segment whose start it never saw, outside a push.
    log = Log()
    records = [implicit(log, s) for s in (0, 1, 4)]
    assert verdicts(venice(), records) == ["OK", "OK", "OK"]
    log = Log()
    assert verdicts(venice(start_in_push=True), [implicit(log, 0)]) == ["UNREGISTERED_PRODUCER"]


@pytest.mark.parametrize("make", [exact, venice])
def test_resent_record_is_duplicate_and_altered_bytes_corrupt(make):
    log = Log()
    records = [implicit(log, s) for s in range(3)]
    v = make()
    assert verdicts(v, records) == ["OK"] * 3
    assert verdicts(v, [log.redeliver(records[1])]) == ["DUPLICATE"]
    assert verdicts(v, [corrupt_value(implicit(log, 3))]) == ["CORRUPT"]


def test_restarted_producer_is_a_new_guid_starting_clean():
    log = Log()
    records = [implicit(log, s) for s in range(3)] + [implicit(log, s, guid=GUID_B) for s in range(3)]
    assert verdicts(exact(), records) == ["OK"] * 6


def test_first_record_mid_segment_inside_a_push_is_unregistered():
    log = Log()
    assert verdicts(exact(start_in_push=True), [implicit(log, 0), implicit(log, 1)]) == ["OK", "OK"]
    log = Log()
    assert verdicts(exact(start_in_push=True), [implicit(log, 3, guid=GUID_B)]) == ["UNREGISTERED_PRODUCER"]


def test_rollover_when_seqs_run_out_needs_no_end_of_segment():
    log = Log()
    last = 2**32 - 1
    records = [implicit(log, last - 1), implicit(log, last), implicit(log, 0, segment=1), implicit(log, 1, segment=1)]
    assert verdicts(exact(), records) == ["OK"] * 4
    log = Log()
    early = [implicit(log, 0), implicit(log, 1), implicit(log, 0, segment=1)]
    assert verdicts(exact(), early) == ["OK", "OK", "MISSING"]
