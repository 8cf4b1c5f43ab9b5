"""Untrusted JSON: bounded depth and size, one error type, never RecursionError; `kdiv check`
answers a deeply nested line as a bad line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.untrusted import (
    JSON_STRING,
    JSON_STRINGS,
    MAX_BYTES,
    MAX_DEPTH,
    UntrustedJSONError,
    json_object,
    nesting_depth,
    parse_json,
    preview,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def depth_of(value) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_nesting_far_past_the_interpreters_limit_is_a_clear_error_not_recursion(opening):
    closing = "]" if opening == "[" else "}"
    deep = opening * 100_000 + "1" + closing * 100_000
    with pytest.raises(UntrustedJSONError, match=f"nests 100000 levels deep, more than the {MAX_DEPTH}"):
        parse_json(deep)
    with pytest.raises(UntrustedJSONError):
        parse_json(deep.encode())


def test_nesting_up_to_the_bound_parses_and_brackets_inside_strings_do_not_count():
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(UntrustedJSONError):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    text = json.dumps({"detail": "[" * 1000 + '\\"{' * 500, "list": [1, [2]]})
    assert nesting_depth(text) == 3  # the object, its list, the list inside
    assert parse_json(text)["list"] == [1, [2]]


def test_size_bound_and_every_other_failure_is_one_error_type():
    with pytest.raises(UntrustedJSONError, match="larger than"):
        parse_json(b" " * (MAX_BYTES + 1))
    for bad in (b"\xff\xfe{", b"{not json", b"9" * 5000, b"", b"[1,2"):
        with pytest.raises(UntrustedJSONError, match="not JSON"):
            parse_json(bad)


@pytest.mark.parametrize("raw", [b"[1,2,3]", b"null", b'"x"', b"17", b"true"])
def test_an_object_is_asked_for_by_name(raw):
    with pytest.raises(UntrustedJSONError, match="incident is JSON .*, not an object"):
        json_object(raw, "incident")


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_parses_as_json_loads_does_and_its_depth_is_counted(value):
    text = json.dumps(value)
    assert nesting_depth(text) == depth_of(value)
    assert nesting_depth(text.encode()) == depth_of(value)
    assert parse_json(text) == json.loads(text)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300) | st.text(alphabet='[]{}",:\\ 0123456789aeflnrstu', max_size=300))
def test_arbitrary_input_parses_or_raises_the_one_error(raw):
    try:
        parse_json(raw)
    except UntrustedJSONError:
        pass


def depth_byte_by_byte(raw: bytes) -> int:
    """What `nesting_depth` must compute, whatever the input: the depth of the text as
    json.loads reads bytes (UTF-8, -16 or -32), counted by `depth_of_utf8`."""
    encoding = json.detect_encoding(raw)
    return depth_of_utf8(raw if encoding.startswith("utf-8") else raw.decode(encoding, "replace").encode())


def depth_of_utf8(raw: bytes) -> int:
    """The nesting depth by a state machine reading one byte per step (in a string, after a
    backslash, or counting brackets)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


# The shapes that cost most: runs of quotes and escapes, unclosed strings, brackets inside
# and outside strings, multi-byte characters, behind enough brackets to be counted.
_PIECES = [b'"', b'\\"', b"\\", b"\\\\", b"[", b"]", b"{", b"}", b'""', b'"a"', b",", b":", b"1", b" ", b"\n"]
_PIECES += [b'"\\u005b"', "\u00e9".encode(), "\u20ac".encode(), b'{"k":', b"[1,", b'"[{"']
adversarial = st.builds(
    lambda opening, k, middle, closing, j: opening * k + b"".join(middle) + closing * j,
    st.sampled_from([b"[", b'{"a":', b"[{}, "]),
    st.integers(0, MAX_DEPTH + 8),
    st.lists(st.sampled_from(_PIECES), max_size=60),
    st.sampled_from([b"]", b"}"]),
    st.integers(0, MAX_DEPTH + 8),
)
any_input = adversarial | st.binary(max_size=200) | st.text(alphabet='[]{}",:\\ 0123456789aeflnrstu', max_size=200)


@settings(max_examples=1000, deadline=None)
@given(any_input)
def test_depth_is_what_a_byte_at_a_time_state_machine_counts(raw):
    as_bytes = raw.encode() if isinstance(raw, str) else raw
    assert nesting_depth(raw) == depth_byte_by_byte(as_bytes)
    if isinstance(raw, str):
        assert nesting_depth(as_bytes) == depth_byte_by_byte(as_bytes)


def loaded(raw):
    """(True, the value) when json.loads takes `raw`, (False, None) when it does not."""
    try:
        return True, json.loads(raw)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, too many digits
        return False, None


@settings(max_examples=1000, deadline=None)
@given(any_input)
def test_parse_json_agrees_with_json_loads_within_the_bound_and_refuses_deeper(raw):
    depth = depth_byte_by_byte(raw.encode() if isinstance(raw, str) else raw)
    if depth > MAX_DEPTH:
        with pytest.raises(
            UntrustedJSONError, match=f"^JSON nests {depth} levels deep, more than the {MAX_DEPTH} read$"
        ):
            parse_json(raw)
        return
    ok, expected = loaded(raw)
    try:
        parsed = parse_json(raw)
    except UntrustedJSONError as bad:
        assert not ok, f"json.loads takes it, parse_json says {bad}"
        return
    assert ok
    assert repr(parsed) == repr(expected)  # repr: NaN is not equal to itself


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(MAX_DEPTH - 6, MAX_DEPTH + 6), st.sampled_from(["[", '{"k":']))
def test_valid_json_around_the_bound_parses_exactly_when_it_is_within_it(value, wrappers, opening):
    closing = "]" if opening == "[" else "}"
    text = opening * wrappers + json.dumps(value) + closing * wrappers
    depth = wrappers + depth_of(value)
    assert nesting_depth(text) == depth
    if depth <= MAX_DEPTH:
        assert repr(parse_json(text.encode())) == repr(json.loads(text))
    else:
        with pytest.raises(
            UntrustedJSONError, match=f"^JSON nests {depth} levels deep, more than the {MAX_DEPTH} read$"
        ):
            parse_json(text.encode())


@settings(max_examples=500, deadline=None)
@given(any_input)
def test_the_depth_scan_reads_each_byte_a_bounded_number_of_times(raw):
    """Linear cost, counted rather than timed: the string patterns match from every quote, so
    the scan never fails at a quote and starts again from the next byte (what made unclosed
    runs of \\" quadratic); their matches, possessive, are disjoint, and what the scan reads
    past a match is at most the non-bracket bytes up to the next quote or bracket."""
    data = raw.encode() if isinstance(raw, str) else raw
    for at in (i for i, byte in enumerate(data) if byte == 0x22):
        assert JSON_STRING.match(data, at) is not None, f"no match from the quote at {at}"
        assert JSON_STRINGS.match(data, at) is not None, f"no match from the quote at {at}"
    read = position = 0
    while (quote := data.find(b'"', position)) >= 0:
        match = JSON_STRINGS.match(data, quote)
        assert match is not None
        end = match.end()
        # What it read past its end and gave back: bytes that are neither a quote nor a bracket.
        given_back = len(data[end:]) - len(data[end:].lstrip(bytes(b for b in range(256) if b not in b'"[]{}')))
        read += end - quote + given_back
        position = end
    assert read <= 2 * len(data)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([b"[", b"{", b"]", b"}", b"[]", b'"[{', b'"', b"\\"]), st.integers(1, 6000)),
        max_size=12,
    )
)
def test_depth_of_long_runs_across_chunks_is_the_state_machines(runs):
    """Runs of brackets thousands long: chunks that only open, only close, or do both."""
    raw = b"".join(piece * count for piece, count in runs)
    assert nesting_depth(raw) == depth_byte_by_byte(raw)


def test_the_shapes_once_quadratic_are_counted_right():
    escapes = b"[" * 65 + b'"' + b'\\"' * 20_000  # 40 KB: 12.7 s before, one pass now
    with pytest.raises(UntrustedJSONError, match="^JSON nests 65 levels deep, more than the 64 read$"):
        parse_json(escapes)
    quotes = b"[" * 65 + b'"' * 40_001  # the last string is unclosed
    assert nesting_depth(quotes) == 65
    assert nesting_depth(b"[" * 65 + b'"' + b"\\" * 20_000 + b"\\") == 65
    assert nesting_depth(b"[" * 65 + b'"a\\') == 65  # ends inside an escape


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32"])
def test_json_in_utf16_or_utf32_is_counted_as_text_not_bytes(encoding):
    # Read byte by byte, the UTF-16 of \\" is a backslash, a zero byte and a quote that
    # ends the string early; its real closing quote then opens one that hides the rest.
    deep: list = []  # MAX_DEPTH levels: parses alone
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    value = ['"', deep]
    text = json.dumps(value)
    raw = text.encode(encoding)
    assert depth_of_utf8(raw) == 1  # what a count of the bytes would say
    assert nesting_depth(raw) == depth_of(value) == MAX_DEPTH + 1
    with pytest.raises(UntrustedJSONError, match=f"nests {MAX_DEPTH + 1} levels deep"):
        parse_json(raw)
    assert parse_json(json.dumps(value[1]).encode(encoding)) == deep


def test_preview_cuts_an_outside_value_and_says_how_long_it_was():
    key = b"\xff" * (1 << 20)
    shown = preview(key)
    assert len(shown) < 400
    assert shown.startswith("b'\\xff\\xff") and shown.endswith("... (1,048,576 bytes)")
    assert preview("x" * 100, limit=10) == "'xxxxxxxxxx'... (100 characters)"
    assert preview(b"short") == "b'short'"
    assert preview(bytearray(b"ab")) == "b'ab'"


def test_kdiv_check_answers_a_deeply_nested_line_as_a_bad_input_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "kdiv", "check", str(path)], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr  # 2: bad input; 1 would say "faults found"
    assert f"{path}:1: JSON nests 100000 levels deep" in done.stderr
