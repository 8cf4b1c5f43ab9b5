"""Untrusted JSON: bounded depth and size, one error type, never RecursionError; `kdiv check`
answers a deeply nested line as a bad line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.untrusted import MAX_BYTES, MAX_DEPTH, UntrustedJSONError, json_object, nesting_depth, parse_json

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


def test_kdiv_check_answers_a_deeply_nested_line_as_a_bad_input_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "kdiv", "check", str(path)], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr  # 2: bad input; 1 would say "faults found"
    assert f"{path}:1: JSON nests 100000 levels deep" in done.stderr
