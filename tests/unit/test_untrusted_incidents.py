"""Incidents read back from the incidents topic: anyone can write there, so every value is
checked field by field; what is not an incident is a ValueError naming why, never another
exception, and what is one renders in the views."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.incident.shape import Incident
from kdiv.worker.web.shapes import incident_json

DIV = Incident(
    "orders", 3, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)
KINDS = {
    "div": DIV,
    "gap resolved": replace(DIV, resolved_at_ms=1_700_000_001_000),
    "schema": Incident(
        "orders", 0, None, None, None, "SUBJECT_MISMATCH", 4, "warning", "d", 5, 6,
        schema_id=12, message_field="value", expected_subject="orders-value", registered_subjects=("other",),
    ),
    "checksum": Incident(
        "cdc", 1, None, None, None, "CHECKSUM_MISMATCH", 9, "fatal", "d", 5, 6,
        table="t", row_key=(("id", 1), ("name", "x")), row_image="current", commit_ts=44,
        expected_checksum=1, computed_checksum=2,
    ),
    "trace": Incident(
        "orders", 0, None, None, None, "LOST", 5, "fatal", "d", 4, 6, route="r", trace_id="cd" * 16, hop=0, group="g"
    ),
    "partition": Incident("orders", 2, None, None, None, "LOG_REWOUND", 30, "fatal", "d", None, 6),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_incident_reads_back_as_written(kind):
    incident = KINDS[kind]
    again = Incident.from_value(incident.value)
    assert again.to_json() == incident.to_json()
    assert again.key == incident.key


# Values as releases before the versioned shape wrote them: -1 for no time or segment, "-" for
# no producer (its seq the offset), {} as a trace incident's row key, absent fields left out.
VERSION_1 = {
    "div": b'{"topic":"orders","partition":3,"producer":"abababababababababababababababab","segment":1,"seq":7,'
    b'"verdict":"MISSING","offset":120,"severity":"fatal","detail":"seq 5..6 missing","record_timestamp_ms":1700000000000,'
    b'"detected_at_ms":1700000000500}',
    "partition": b'{"topic":"orders","partition":2,"producer":"-","segment":-1,"seq":30,"verdict":"LOG_REWOUND",'
    b'"offset":30,"severity":"fatal","detail":"d","record_timestamp_ms":-1,"detected_at_ms":6}',
    "checksum": b'{"topic":"cdc","partition":1,"producer":"-","segment":-1,"seq":9,"verdict":"CHECKSUM_MISMATCH",'
    b'"offset":9,"severity":"fatal","detail":"d","record_timestamp_ms":5,"detected_at_ms":6,"table":"t",'
    b'"row_key":[["id",1],["name","x"]],"row_image":"current","commit_ts":44,"expected_checksum":1,'
    b'"computed_checksum":2}',
    "trace": b'{"topic":"orders","partition":0,"producer":"-","segment":-1,"seq":5,"verdict":"LOST","offset":5,'
    b'"severity":"fatal","detail":"d","record_timestamp_ms":-1,"detected_at_ms":6,"row_key":{},"route":"r",'
    b'"trace_id":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","hop":0,"group":"g"}',
}


@pytest.mark.parametrize("kind", sorted(VERSION_1))
def test_a_version_1_value_is_read_normalised_under_the_key_it_was_written_with(kind):
    incident = Incident.from_value(VERSION_1[kind])
    shown = incident.to_json()
    assert shown["incident_version"] == 2
    assert -1 not in shown.values() and "-" not in shown.values() and shown["row_key"] != {}
    if kind == "trace":
        assert replace(incident, record_timestamp_ms=4) == KINDS["trace"]
    else:
        assert incident == KINDS[kind]
    # The key is the one earlier releases wrote, so the compacted topic keeps the fault once.
    assert incident.key == KINDS[kind].key


def test_keys_are_those_earlier_releases_wrote():
    assert KINDS["partition"].key == (
        b'{"topic":"orders","partition":2,"producer":"-","segment":-1,"seq":30,"class":"LOG_REWOUND"}'
    )
    assert KINDS["trace"].key == b'{"route":"r","trace":"' + b"cd" * 16 + b'","hop":0,"class":"LOST"}'


def test_an_unknown_incident_version_or_severity_is_a_value_error():
    with pytest.raises(ValueError, match="incident_version is 3"):
        Incident.from_value(json.dumps({**DIV.to_json(), "incident_version": 3}).encode())
    with pytest.raises(ValueError, match="severity is 'bad'"):
        Incident.from_value(json.dumps({**DIV.to_json(), "severity": "bad"}).encode())


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
    for name in ("partition", "offset", "detected_at_ms"):
        value = getattr(incident, name)
        assert isinstance(value, int) and not isinstance(value, bool)
    for name in ("segment", "seq", "record_timestamp_ms"):
        value = getattr(incident, name)
        assert value is None or (isinstance(value, int) and not isinstance(value, bool))
    assert all(isinstance(getattr(incident, n), str) for n in ("topic", "verdict", "severity", "detail"))
    assert incident.producer is None or isinstance(incident.producer, str)
    assert incident.severity in ("fatal", "warning")
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
