import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdiv.trace.header import (
    TRACE_HEADER,
    TraceHeaderError,
    TraceStamp,
    decode_trace,
    encode_trace,
    find_trace,
    new_trace_id,
)

ID = bytes(range(16))
STAMP = TraceStamp(ID, 1_700_000_000_123)
RAW = encode_trace(STAMP)


@given(st.binary(min_size=16, max_size=16), st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_round_trip_is_exact_and_25_bytes(trace_id, origin_ms):
    raw = encode_trace(TraceStamp(trace_id, origin_ms))
    assert raw == b"\x01" + trace_id + struct.pack(">q", origin_ms)
    assert decode_trace(raw) == TraceStamp(trace_id, origin_ms)


def test_trace_id_hex_and_new_ids():
    assert STAMP.trace_id_hex == "000102030405060708090a0b0c0d0e0f"
    first, second = new_trace_id(), new_trace_id()
    assert len(first) == 16 and len(second) == 16 and first != second


@pytest.mark.parametrize("trace_id", [bytes(15), bytes(17), b""])
def test_encode_refuses_ids_that_are_not_16_bytes(trace_id):
    with pytest.raises(ValueError, match=f"16 bytes, got {len(trace_id)}"):
        encode_trace(TraceStamp(trace_id, 0))


def test_encode_refuses_origin_outside_int64():
    with pytest.raises(ValueError, match="64-bit"):
        encode_trace(TraceStamp(ID, 1 << 63))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "kdiv-trace header is empty"),
        (b"\x02" + bytes(24), "version 2 is unknown"),
        (b"\x00", "version 0 is unknown"),
        (RAW[:-1], "is 24 bytes; version 1 is 25 bytes"),
        (RAW + b"\x00", "is 26 bytes; version 1 is 25 bytes"),
        ("not bytes", "is a str, not bytes"),
    ],
)
def test_decode_names_what_is_wrong(raw, message):
    with pytest.raises(TraceHeaderError, match=message):
        decode_trace(raw)
    assert issubclass(TraceHeaderError, ValueError)


def test_find_trace_over_pairs():
    assert find_trace([("div", b"x" * 38), (TRACE_HEADER, RAW), ("other", None)]) == STAMP
    assert find_trace((("div", b"x"),)) is None
    assert find_trace([]) is None
    # Several identical trace headers are one trace.
    assert find_trace([(TRACE_HEADER, RAW), (TRACE_HEADER, RAW)]) == STAMP


def test_find_trace_over_a_mapping():
    assert find_trace({"div": b"x", TRACE_HEADER: RAW}) == STAMP
    assert find_trace({"div": b"x"}) is None
    assert find_trace({}) is None


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([(TRACE_HEADER, None)], "null value"),
        ({TRACE_HEADER: None}, "null value"),
        ([(TRACE_HEADER, RAW[:10])], "10 bytes"),
        ({TRACE_HEADER: b"\x09" + RAW[1:]}, "version 9"),
        ([(TRACE_HEADER, RAW), (TRACE_HEADER, encode_trace(TraceStamp(bytes(16), 0)))], "different values"),
    ],
)
def test_find_trace_raises_on_malformed_headers(headers, message):
    with pytest.raises(TraceHeaderError, match=message):
        find_trace(headers)
