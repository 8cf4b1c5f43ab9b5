"""Property: on writer output with injected loss, duplication, corruption and reordering, the
validator reports exactly the injected faults, at the offsets where they must show.

Faults are injected at most one per segment so that their consequences are independent; the
expected verdicts follow from the spec in streaming mode:
- loss of data seq k: the next record is MISSING and the END_OF_SEGMENT is CORRUPT (ADHASH),
  or, when k was the segment's last data record, the END_OF_SEGMENT alone is MISSING;
- duplicate of a data record, delivered anywhere later: DUPLICATE, nothing else;
- corrupted value: CORRUPT at the record, and at the END_OF_SEGMENT (ADHASH);
- two adjacent data records swapped (k+1, k): MISSING at k+1, DUPLICATE at k, CORRUPT at the
  END_OF_SEGMENT (ADHASH).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdiv.div.record import ConsumedRecord
from kdiv.div.segment import as_segment
from kdiv.div.stamper import DivStamper, OutgoingRecord
from kdiv.div.validator import DataIntegrityValidator, Semantics
from kdiv.div.wire import ChecksumType, Kind, decode
from kdiv.state.codec import (
    decode_partition,
    decode_segment,
    encode_partition,
    encode_segment,
)

TOPIC = "orders"
NOW = 1_700_000_000_000


@st.composite
def writer_output(draw):
    """Per producer: a stamper config and its records to each partition, ended as final."""
    n_partitions = draw(st.integers(1, 3))
    producers = []
    for i in range(draw(st.integers(1, 3))):
        stamper = DivStamper(
            uuid.UUID(int=i + 1).bytes,
            checksum_type=draw(st.sampled_from([ChecksumType.ADHASH, ChecksumType.NONE])),
            max_records_per_segment=draw(st.integers(1, 6)),
        )
        out: list[OutgoingRecord] = []
        for n in range(draw(st.integers(1, 25))):
            partition = draw(st.integers(0, n_partitions - 1))
            value = draw(st.binary(min_size=1, max_size=12))
            key = draw(st.one_of(st.none(), st.binary(max_size=6)))
            out += stamper.data(TOPIC, partition, key, value, NOW + n)
        for partition in range(n_partitions):
            out += stamper.end_segment(TOPIC, partition, True, NOW + 1000)
        producers.append((stamper, out))
    return producers


def _segment_groups(out: list[OutgoingRecord]) -> list[list[int]]:
    """Indexes into `out` of each closed segment's records, SOS..EOS, per partition."""
    groups: list[list[int]] = []
    open_by_partition: dict[int, list[int]] = {}
    for i, record in enumerate(out):
        group = open_by_partition.setdefault(record.partition, [])
        group.append(i)
        if record.kind == Kind.END_OF_SEGMENT:
            groups.append(group)
            del open_by_partition[record.partition]
    return groups


@st.composite
def faulty_stream(draw, semantics: Semantics = Semantics.EXACT):
    """Writer output with injected faults, interleaved into partition logs, and the expected
    verdicts under `semantics`."""
    exact = semantics is Semantics.EXACT
    producers = draw(writer_output())
    sequences = []  # per producer: list of (record, expected verdict or None)
    for stamper, out in producers:
        adhash = stamper.checksum_type == ChecksumType.ADHASH
        items: list[list] = [[r, "OK"] for r in out]
        drops, extra = set(), []
        for group in _segment_groups(out):
            data = [i for i in group if out[i].kind == Kind.DATA]
            eos = group[-1]
            fault = draw(st.sampled_from(["none", "loss", "dup", "corrupt", "swap"]))
            if fault == "loss":
                k = draw(st.sampled_from(data))
                drops.add(k)
                nxt = group[group.index(k) + 1]
                if nxt == eos:
                    items[eos][1] = "MISSING"
                else:
                    items[nxt][1] = "MISSING"
                    if adhash:
                        items[eos][1] = "CORRUPT"
            elif fault == "dup":
                k = draw(st.sampled_from(data))
                # Delivered again anywhere after the original, even in a later segment.
                extra.append((k, draw(st.integers(k, len(out) - 1))))
            elif fault == "corrupt":
                k = draw(st.sampled_from(data))
                value = bytearray(out[k].value)
                value[draw(st.integers(0, len(value) - 1))] ^= 1 << draw(st.integers(0, 7))
                items[k] = [replace(out[k], value=bytes(value)), "CORRUPT"]
                if adhash:
                    items[eos][1] = "CORRUPT"
            elif fault == "swap" and len(data) >= 2:
                j = draw(st.integers(0, len(data) - 2))
                a, b = data[j], data[j + 1]
                # Venice: the late record reads DUPLICATE and is left out of the segment's
                # checksum; exact: it is LATE and counted, so the checksum still matches.
                items[a], items[b] = [out[b], "MISSING"], [out[a], "LATE" if exact else "DUPLICATE"]
                if adhash and not exact:
                    items[eos][1] = "CORRUPT"
        sequence = []
        for i, item in enumerate(items):
            if i not in drops:
                sequence.append(tuple(item))
            sequence += [(out[k], "DUPLICATE") for k, after in extra if after == i]
        sequences.append(sequence)
    # Interleave producers, keeping each producer's order (per-partition order follows).
    order = draw(st.permutations([p for p, seq in enumerate(sequences) for _ in seq]))
    cursors = [0] * len(sequences)
    offsets: dict[int, int] = {}
    stream = []
    for p in order:
        record, expected = sequences[p][cursors[p]]
        cursors[p] += 1
        offset = offsets.get(record.partition, 0)
        offsets[record.partition] = offset + 1
        stream.append(
            (
                ConsumedRecord(record.topic, record.partition, offset, NOW, record.key, record.value, record.headers),
                expected,
            )
        )
    return stream


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_stream(Semantics.VENICE))
def test_venice_semantics_reports_exactly_the_injected_faults(stream):
    validator = DataIntegrityValidator(semantics=Semantics.VENICE)
    got = [(r.partition, r.offset, validator.validate(r, NOW).verdict.value) for r, _ in stream]
    expected = [(r.partition, r.offset, verdict) for r, verdict in stream]
    assert got == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_stream(Semantics.EXACT))
def test_exact_semantics_reports_exactly_the_injected_faults(stream):
    validator = DataIntegrityValidator()
    got = [(r.partition, r.offset, validator.validate(r, NOW).verdict.value) for r, _ in stream]
    expected = [(r.partition, r.offset, verdict) for r, verdict in stream]
    assert got == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_stream())
def test_state_saved_and_restored_after_every_record_changes_no_verdict(stream):
    """The codec is lossless: a worker that restores after each record judges identically."""
    steady = DataIntegrityValidator()
    restarted = DataIntegrityValidator()
    for record, _ in stream:
        got, want = restarted.validate(record, NOW), steady.validate(record, NOW)
        assert (got.verdict, got.fatal) == (want.verdict, want.fatal)
        saved = restarted.partition(record.topic, record.partition)
        producers = {}
        for guid, packed_or_not in saved.tracker.segments.items():
            segment = as_segment(packed_or_not)
            raw = encode_segment(segment)
            # The Venice fields, the ring of recent CRCs, and a gap or two of this stream.
            assert len(raw) <= 200 + 8 * restarted.window + 150
            producers[guid] = decode_segment(raw)
            assert producers[guid] == segment
        state = decode_partition(encode_partition(saved))
        assert (state.in_push, state.push_failed, state.last_offset, state.counts, state.holes, state.holes_from) == (
            saved.in_push,
            saved.push_failed,
            saved.last_offset,
            saved.counts,
            saved.holes,
            saved.holes_from,
        )
        restarted.restore_partition(record.topic, record.partition, state, producers)


def test_the_strategy_injects_every_fault_class():
    """Guard against an oracle that silently stopped injecting anything."""
    seen = set()

    @settings(max_examples=200, deadline=None, database=None)
    @given(faulty_stream())
    def collect(stream):
        seen.update(v for _, v in stream)

    collect()
    assert {"MISSING", "DUPLICATE", "CORRUPT", "LATE"} <= seen


def test_stream_kinds_are_decodable():
    out = DivStamper(max_records_per_segment=2).data(TOPIC, 0, b"k", b"v", NOW)
    assert [decode(r.headers[-1][1]).kind for r in out] == [Kind.START_OF_SEGMENT, Kind.DATA]
