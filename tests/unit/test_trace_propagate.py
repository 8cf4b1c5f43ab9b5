from kdiv.div.wire import HEADER_NAME
from kdiv.trace.header import TRACE_HEADER, TraceStamp, encode_trace, find_trace
from kdiv.trace.propagate import forward

TRACE = encode_trace(TraceStamp(b"t" * 16, 42))
OTHER_TRACE = encode_trace(TraceStamp(b"o" * 16, 7))
DIV_IN = b"d" * 38


def test_copies_only_the_trace_header():
    incoming = [(HEADER_NAME, DIV_IN), ("content-type", b"json"), (TRACE_HEADER, TRACE), ("x", None)]
    assert forward(incoming) == [(TRACE_HEADER, TRACE)]
    assert find_trace(forward(incoming)) == TraceStamp(b"t" * 16, 42)
    assert incoming[0] == (HEADER_NAME, DIV_IN)  # the input is left alone


def test_keeps_output_headers_and_replaces_their_trace_header():
    output = [("a", b"1"), (TRACE_HEADER, OTHER_TRACE), ("b", b"2")]
    assert forward([(TRACE_HEADER, TRACE)], output) == [("a", b"1"), ("b", b"2"), (TRACE_HEADER, TRACE)]


def test_untraced_input_leaves_the_output_alone():
    output = [("a", b"1"), (TRACE_HEADER, OTHER_TRACE)]
    assert forward([(HEADER_NAME, DIV_IN), ("x", b"y")], output) == output
    assert forward([]) == []


def test_never_forwards_the_inputs_div_header():
    incoming = {HEADER_NAME: DIV_IN, TRACE_HEADER: TRACE}
    # Passing the input's headers through as output (a common Faust mistake) drops its div stamp.
    assert forward(incoming, incoming) == [(TRACE_HEADER, TRACE)]
    own_div = b"e" * 38
    assert forward(incoming, [(HEADER_NAME, own_div)]) == [(HEADER_NAME, own_div), (TRACE_HEADER, TRACE)]


def test_mapping_input_and_output():
    assert forward({TRACE_HEADER: TRACE, "k": b"v"}, {"a": b"1", TRACE_HEADER: OTHER_TRACE}) == [
        ("a", b"1"),
        (TRACE_HEADER, TRACE),
    ]


def test_malformed_trace_header_is_forwarded_as_is():
    assert forward([(TRACE_HEADER, b"\x07junk")]) == [(TRACE_HEADER, b"\x07junk")]
    assert forward({TRACE_HEADER: None}) == [(TRACE_HEADER, b"")]


def test_no_headers_at_all_as_confluent_kafka_gives_them():
    # confluent-kafka's Message.headers() is None for a record without headers.
    assert forward(None) == []
    assert forward(None, [("a", b"1")]) == [("a", b"1")]
    assert forward([(TRACE_HEADER, TRACE)], None) == [(TRACE_HEADER, TRACE)]
