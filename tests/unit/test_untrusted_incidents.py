"""Incidents read back from the incidents topic: anyone can write there, so every value is
checked field by field; what is not an incident is a ValueError naming why, never another
exception, and what is one renders in the views."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.worker.incidents import Incident
from kdiv.worker.web.shapes import incident_json

DIV = Incident(
    "orders", 3, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)
KINDS = {
    "div": DIV,
    "gap resolved": replace(DIV, resolved_at_ms=1_700_000_001_000),
    "schema": Incident(
        "orders", 0, "-", -1, -1, "SUBJECT_MISMATCH", 4, "warning", "d", 5, 6,
        schema_id=12, message_field="value", expected_subject="orders-value", registered_subjects=("other",),
    ),
    "checksum": Incident(
        "cdc", 1, "-", -1, 9, "CHECKSUM_MISMATCH", 9, "fatal", "d", 5, 6,
        table="t", row_key=(("id", 1), ("name", "x")), row_image="current", commit_ts=44,
        expected_checksum=1, computed_checksum=2,
    ),
    "trace": Incident(
        "orders", 0, "-", -1, 5, "LOST", 5, "fatal", "d", -1, 6, route="r", trace_id="cd" * 16, hop=0, group="g"
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_incident_reads_back_as_written(kind):
    incident = KINDS[kind]
    again = Incident.from_value(incident.value)
    assert again.to_json() == incident.to_json()
    assert again.key == incident.key


@pytest.mark.parametrize("raw", [b"[1,2,3]", b"null", b'"x"', b"42", b"{", b"\xff", b"[" * 50_000 + b"]" * 50_000])
def test_a_value_that_is_not_a_json_object_is_a_value_error(raw):
    with pytest.raises(ValueError, match="incident is JSON|not JSON|nests"):
        Incident.from_value(raw)


@pytest.mark.parametrize(
    ("field", "wrong", "message"),
    [
        ("detected_at_ms", "soon", "detected_at_ms is string 'soon', not an integer"),
        ("record_timestamp_ms", 1.5, "record_timestamp_ms is number 1.5, not an integer"),
        ("partition", True, "partition is boolean True, not an integer"),
        ("topic", ["a"], "topic is array"),
        ("detail", None, "detail is null"),
        ("registered_subjects", [1], "registered_subjects is [1], not a list of strings"),
        ("row_key", {"id": {"deep": 1}}, "row_key's column 'id' is object"),
        ("row_key", 7, "row_key is number 7"),
        ("resolved_at_ms", "later", "resolved_at_ms is string"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(field, wrong, message):
    fields = {**DIV.to_json(), field: wrong}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Incident.from_value(json.dumps(fields).encode())


def test_unknown_and_missing_fields_are_named():
    with pytest.raises(ValueError, match="unknown field.*'surprise'"):
        Incident.from_value(json.dumps({**DIV.to_json(), "surprise": 1}).encode())
    fields = DIV.to_json()
    del fields["offset"]
    with pytest.raises(ValueError, match="lacks field.*offset"):
        Incident.from_value(json.dumps(fields).encode())


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(KINDS)),
    st.dictionaries(st.sampled_from(sorted(DIV.to_json()) + ["row_key", "schema_id", "hop", "x"]), json_values),
    st.sets(st.sampled_from(sorted(DIV.to_json()))),
)
def test_a_mutated_incident_is_read_with_checked_types_or_refused_with_a_value_error(kind, changed, dropped):
    fields = {**KINDS[kind].to_json(), **changed}
    for name in dropped:
        fields.pop(name, None)
    try:
        incident = Incident.from_value(json.dumps(fields).encode())
    except ValueError:
        return
    for name in ("partition", "segment", "seq", "offset", "record_timestamp_ms", "detected_at_ms"):
        value = getattr(incident, name)
        assert isinstance(value, int) and not isinstance(value, bool)
    assert all(isinstance(getattr(incident, n), str) for n in ("topic", "producer", "verdict", "severity", "detail"))
    # What was read renders: the views serialise it whatever its times.
    json.dumps(incident_json(incident))
    assert incident.key


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_an_incident_or_a_value_error(raw):
    try:
        Incident.from_value(raw)
    except ValueError:
        pass
