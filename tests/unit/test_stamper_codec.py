"""Producer-side segment management and the producer-state codec."""

import pytest

from kdiv.div.segment import Segment
from kdiv.div.stamper import DivStamper
from kdiv.div.wire import ChecksumType, Kind, decode, record_crc
from kdiv.state.codec import StateDecodeError, decode_segment, encode_segment
from tests.harness.streams import GUID_A


def headers(records):
    return [decode(r.headers[-1][1]) for r in records]


def test_first_record_opens_segment_zero_with_start_of_segment():
    out = DivStamper(GUID_A).data("t", 0, b"k", b"v", 0)
    assert [(h.kind, h.segment, h.seq) for h in headers(out)] == [(Kind.START_OF_SEGMENT, 0, 0), (Kind.DATA, 0, 1)]
    assert headers(out)[0].checksum_type == ChecksumType.ADHASH
    assert out[0].key == GUID_A + bytes(8) and out[0].value == b""  # unique key, never a tombstone


def test_rollover_by_record_count_closes_with_the_adhash_of_the_segment():
    st = DivStamper(GUID_A, max_records_per_segment=2)
    out = []
    for i in range(3):
        out += st.data("t", 0, b"k%d" % i, b"v", 0)
    kinds = [(h.kind.name, h.segment, h.seq) for h in headers(out)]
    assert kinds == [
        ("START_OF_SEGMENT", 0, 0),
        ("DATA", 0, 1),
        ("DATA", 0, 2),
        ("END_OF_SEGMENT", 0, 3),
        ("START_OF_SEGMENT", 1, 0),
        ("DATA", 1, 1),
    ]
    eos = headers(out)[3]
    expected = sum(record_crc(h.kind, r.key, r.value) for h, r in zip(headers(out[:3]), out[:3], strict=False)) % 2**64
    assert eos.segment_checksum == expected and eos.final_segment is False


def test_rollover_by_age_only_when_strictly_older():
    st = DivStamper(GUID_A, max_segment_age_ms=1000)
    st.data("t", 0, b"k", b"v", 0)
    assert len(st.data("t", 0, b"k", b"v", 1000)) == 1
    rolled = headers(st.data("t", 0, b"k", b"v", 1001))
    assert [(h.kind.name, h.segment) for h in rolled] == [("END_OF_SEGMENT", 0), ("START_OF_SEGMENT", 1), ("DATA", 1)]


def test_age_rollover_disabled_with_non_positive_limit():
    st = DivStamper(GUID_A, max_segment_age_ms=0)
    st.data("t", 0, b"k", b"v", 0)
    assert len(st.data("t", 0, b"k", b"v", 10**12)) == 1


def test_segments_are_per_topic_partition_and_end_segment_is_idempotent():
    st = DivStamper(GUID_A, checksum_type=ChecksumType.NONE)
    st.data("t", 0, b"k", b"v", 0)
    st.data("t", 1, b"k", b"v", 0)
    st.data("u", 0, b"k", b"v", 0)
    assert sorted(st.open_partitions()) == [("t", 0), ("t", 1), ("u", 0)]
    assert st.open_partitions("u") == [("u", 0)]
    (eos,) = headers(st.end_segment("t", 1, True, 0))
    assert eos.final_segment and eos.segment_checksum == 0  # NONE writes 0
    assert st.end_segment("t", 1, True, 0) == [] and st.end_segment("t", 9, True, 0) == []
    # The next write to an ended partition opens the next segment.
    assert next((h.kind.name, h.segment) for h in headers(st.data("t", 1, b"k", b"v", 0))) == ("START_OF_SEGMENT", 1)


def test_a_caller_cannot_smuggle_its_own_div_header():
    with pytest.raises(ValueError, match="already carries a 'div' header"):
        DivStamper().data("t", 0, b"k", b"v", 0, headers=(("div", b"x"),))


def test_new_guid_per_stamper():
    assert DivStamper().guid != DivStamper().guid and len(DivStamper().guid) == 16


def test_codec_round_trips_every_field_including_a_sum_above_2_63():
    segment = Segment(7, 123, ChecksumType.ADHASH)
    segment.checksum = 2**64 - 5
    segment.checksum_finalized = segment.registered = segment.ended = segment.final_segment = True
    segment.new_segment = False
    segment.last_offset = 10**12
    segment.last_producer_ts = -3
    raw = encode_segment(segment)
    assert len(raw) <= 200
    assert decode_segment(raw) == segment


@pytest.mark.parametrize(
    "raw,message", [(b"", "empty"), (b"\x09abc", "does not decode"), (b"\x02\x02", "does not decode")]
)
def test_codec_rejects_bad_state_with_a_clear_error(raw, message):
    with pytest.raises(StateDecodeError, match=message):
        decode_segment(raw)


def test_partition_state_round_trips_and_rejects_unknown_verdicts():
    from kdiv.div.faults import Verdict
    from kdiv.div.validator import PartitionValidation
    from kdiv.state.codec import decode_partition, encode_partition

    state = PartitionValidation(
        in_push=True,
        push_failed=True,
        last_offset=41,
        records=50,
        verdict_counts={Verdict.MISSING: 2, Verdict.MALFORMED: 1},
        checkpoint_anchor_ms=99,
    )
    back = decode_partition(encode_partition(state))
    assert (
        back.in_push,
        back.push_failed,
        back.last_offset,
        back.records,
        back.verdict_counts,
        back.checkpoint_anchor_ms,
    ) == (True, True, 41, 50, {Verdict.MISSING: 2, Verdict.MALFORMED: 1}, 99)
    assert back.counts[Verdict.OK] == 47
    import io

    import fastavro

    from kdiv.state.codec import PARTITION_STATE_NAME, STATE_SCHEMA, StateDecodeError

    out = io.BytesIO()
    fastavro.schemaless_writer(
        out, STATE_SCHEMA, (PARTITION_STATE_NAME, {"inPush": False, "verdictCounts": {"LOST": 1}})
    )
    with pytest.raises(StateDecodeError, match="unknown verdict"):
        decode_partition(out.getvalue())
