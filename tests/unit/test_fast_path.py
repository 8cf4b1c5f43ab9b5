"""Differential: the validator's in-order fast path decides exactly as its full three-step path,
and every reader of DIV metadata follows the one header rule."""

from __future__ import annotations

import uuid
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdiv.div.ledger import key_validation_of
from kdiv.div.record import ConsumedRecord
from kdiv.div.segment import as_segment
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import HEADER_NAME, ChecksumType, Kind, encode, readable_div_header, scan_div_header
from kdiv.state.codec import encode_partition, encode_segment
from kdiv.worker.live import _producer_of

TOPIC = "orders"
NOW = 1_700_000_000_000
MUTATIONS = ("keep", "drop", "duplicate", "swap", "corrupt_value", "corrupt_header", "second_header", "null_header")


def as_implicit(record):
    """The record as kdiv's Java interceptor would stamp it: its DATA header as format version 2."""
    header = readable_div_header(record.headers)._replace(implicit_segment=True)
    return replace(record, headers=((HEADER_NAME, encode(header)),))


@st.composite
def mutated_streams(draw):
    """Records of a few producers on two partitions, in writer order, then mutated."""
    records: list[ConsumedRecord] = []
    offsets = [0, 0]
    stampers = [
        DivStamper(
            uuid.UUID(int=i + 1).bytes,
            checksum_type=draw(st.sampled_from([ChecksumType.ADHASH, ChecksumType.NONE])),
            max_records_per_segment=draw(st.integers(1, 8)),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    implicit = draw(st.booleans())
    for n in range(draw(st.integers(1, 60))):
        stamper = draw(st.sampled_from(stampers))
        partition = draw(st.integers(0, 1))
        choice = draw(st.sampled_from(["data"] * 8 + ["end", "push"]))
        if choice == "data":
            out = stamper.data(TOPIC, partition, draw(st.binary(max_size=4)), draw(st.binary(max_size=8)), NOW + n)
        elif choice == "end":
            out = stamper.end_segment(TOPIC, partition, draw(st.booleans()), NOW + n)
        else:
            kind = draw(st.sampled_from([Kind.START_OF_PUSH, Kind.END_OF_PUSH]))
            out = stamper.control(TOPIC, partition, kind, NOW + n)
        if implicit and stamper is stampers[0]:
            # This producer stamps implicit segments (format version 2): DATA only.
            out = [as_implicit(record) for record in out if readable_div_header(record.headers).kind == Kind.DATA]
        for record in out:
            records.append(
                ConsumedRecord(
                    TOPIC, partition, offsets[partition], NOW + n, record.key, record.value, tuple(record.headers)
                )
            )
            offsets[partition] += 1
    mutated: list[ConsumedRecord] = []
    i = 0
    while i < len(records):
        record = records[i]
        mutation = draw(st.sampled_from(MUTATIONS))
        if mutation == "drop":
            i += 1
            continue
        if mutation == "swap" and i + 1 < len(records):
            mutated += [records[i + 1], record]
            i += 2
            continue
        if mutation == "duplicate":
            mutated += [record, record]
        elif mutation == "corrupt_value":
            mutated.append(ConsumedRecord(*_fields(record)[:5], (record.value or b"") + b"!", record.headers))
        elif mutation == "corrupt_header":
            name, raw = record.headers[-1]
            flipped = bytearray(raw or b"")
            flipped[draw(st.integers(0, len(flipped) - 1))] ^= 1 << draw(st.integers(0, 7))
            mutated.append(ConsumedRecord(*_fields(record)[:6], (*record.headers[:-1], (name, bytes(flipped)))))
        elif mutation == "second_header":
            mutated.append(ConsumedRecord(*_fields(record)[:6], (*record.headers, record.headers[-1])))
        elif mutation == "null_header":
            mutated.append(ConsumedRecord(*_fields(record)[:6], ((HEADER_NAME, None), *record.headers)))
        else:
            mutated.append(record)
        i += 1
    # Offsets as a consumer sees them: increasing per partition, whatever was mutated.
    renumbered, next_offset = [], [0, 0]
    for record in mutated:
        renumbered.append(
            ConsumedRecord(record.topic, record.partition, next_offset[record.partition], *_fields(record)[3:])
        )
        next_offset[record.partition] += 1
    return renumbered


def _fields(record: ConsumedRecord) -> tuple:
    return (record.topic, record.partition, record.offset, record.timestamp, record.key, record.value, record.headers)


def _saved_state(validator: DataIntegrityValidator) -> dict:
    state: dict[tuple, bytes] = {}
    for (topic, partition), part in validator.partitions.items():
        state[(topic, partition)] = encode_partition(part)
        for guid, segment in part.tracker.segments.items():
            state[(topic, partition, guid)] = encode_segment(as_segment(segment))
    return state


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=mutated_streams(), start_in_push=st.booleans())
def test_the_fast_path_decides_as_the_full_path(records, start_in_push):
    fast = DataIntegrityValidator(start_in_push=start_in_push)
    full = DataIntegrityValidator(start_in_push=start_in_push)
    for record in records:
        found, raw = scan_div_header(record.headers)
        expected = full._validate_full(record, NOW, found, raw)
        got = fast.validate(record, NOW)
        assert got[1:] == expected[1:], record
    assert _saved_state(fast) == _saved_state(full)


@given(records=mutated_streams())
@settings(max_examples=100, deadline=None)
def test_every_reader_takes_the_producer_from_the_same_readable_header(records):
    validator = DataIntegrityValidator()
    for record in records:
        header = readable_div_header(record.headers)
        result = validator.validate(record, NOW)
        if header is None:
            # The validator judges no producer, and neither does the ledger or the replay logic.
            assert result.guid is None
            assert _producer_of(*scan_div_header(record.headers)) == (None, None)
            entry = key_validation_of(record)
            assert entry is None or entry.producer is None
        else:
            assert result.guid == header.guid
            assert _producer_of(*scan_div_header(record.headers)) == (header.guid, header.kind)
            entry = key_validation_of(record)
            if header.kind == Kind.DATA and record.key is not None:
                assert entry is not None and entry.producer == header.guid and entry.seq == header.seq
            else:
                assert entry is None


def test_the_header_rule_for_absent_null_duplicate_and_malformed_headers():
    stamper = DivStamper(uuid.UUID(int=9).bytes)
    *_, sent = stamper.data(TOPIC, 0, b"k", b"v", NOW)  # the first record comes after its START_OF_SEGMENT
    good = sent.headers[-1]
    cases = {
        (): (0, None),
        (good,): (1, good[1]),
        ((HEADER_NAME, None),): (1, None),
        (good, good): (2, good[1]),
        ((HEADER_NAME, None), good): (2, good[1]),
        ((HEADER_NAME, b"\x01short"),): (1, b"\x01short"),
    }
    for headers, scanned in cases.items():
        assert scan_div_header(headers) == scanned
        readable = readable_div_header(headers)
        assert (readable is not None) == (headers == (good,)), headers


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=mutated_streams(), start_in_push=st.booleans(), chunk=st.integers(1, 70), watched=st.booleans())
def test_the_bulk_run_decides_as_one_record_at_a_time(records, start_in_push, chunk, watched):
    """`validate_run` (with its stops taken one by one) reports every result `validate` gives
    that is not an unwatched in-order OK, identical, and leaves the same state and counts."""
    bulk = DataIntegrityValidator(start_in_push=start_in_push)
    single = DataIntegrityValidator(start_in_push=start_in_push)
    expected = [(record, single.validate(record, NOW)) for record in records]
    reported: dict[tuple[int, int], tuple] = {}
    touched: dict[int, set[bytes]] = {0: set(), 1: set()}
    for partition in (0, 1):
        mine = [r for r in records if r.partition == partition]
        watch = {uuid.UUID(int=i + 1).bytes for i in range(3)} if watched else set()
        for begin in range(0, len(mine), chunk):
            part = mine[begin : begin + chunk]
            results: list = []
            i = 0
            while True:
                i = bulk.validate_run(TOPIC, partition, part, i, NOW, touched[partition], watch, results)
                if i == len(part):
                    break
                # A stop (re-delivery or push marker): its caller validates and touches it.
                results.append(bulk.validate(part[i], NOW))
                touched[partition].add(results[-1].guid or b"")
                i += 1
            for result in results:
                reported[(partition, result.record.offset)] = result[1:]
    for record, result in expected:
        got = reported.get((record.partition, record.offset))
        if got is not None:
            assert got == result[1:], record
        else:
            # Only an intact in-order record of an unwatched producer goes unreported.
            assert result.verdict.value == "OK" and not watched, (record, result)
        assert (result.guid or b"") in touched[record.partition]
    assert _saved_state(bulk) == _saved_state(single)
    for key, part in single.partitions.items():
        assert bulk.partitions[key].counts == part.counts
        assert bulk.partitions[key].last_offset == part.last_offset
