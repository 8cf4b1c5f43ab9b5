"""The incident's bounds (kdiv.incident.bounds): the one parser refuses a value over any of
them, schema.json and docs/incidents.md state the same numbers, and every incident kdiv builds
fits them, whatever outside data it embeds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.div.faults import Verdict
from kdiv.div.record import ConsumedRecord
from kdiv.div.validator import ValidationResult
from kdiv.incident.bounds import (
    MAX_CHARS,
    MAX_COLUMN_CHARS,
    MAX_INCIDENT_BYTES,
    MAX_INT,
    MAX_REGISTERED_SUBJECTS,
    MAX_ROW_KEY_COLUMNS,
    MAX_ROW_KEY_VALUE_CHARS,
    MAX_SUBJECT_CHARS,
    fitted,
)
from kdiv.incident.builders import (
    checksum_incident,
    incident_for,
    partition_incident,
    schema_incident,
    trace_incident,
)
from kdiv.incident.schema import incident_schema
from kdiv.incident.shape import Incident
from kdiv.ticdc.checksum import ChecksumResult, ChecksumVerdict
from kdiv.trace.judge import TraceOutcome, TraceVerdict

VALIDATOR = jsonschema.Draft202012Validator(incident_schema())
DOCS = Path(__file__).resolve().parents[2] / "docs" / "incidents.md"
SMILE = "\U0001f600"  # JSON escapes it as a surrogate pair: 12 bytes for one character
HUGE = SMILE * 300_000

DIV = Incident(
    "orders", 3, "ab" * 16, 1, 7, "MISSING", 120, "fatal", "seq 5..6 missing", 1_700_000_000_000, 1_700_000_000_500
)
CHECKSUM = Incident(
    "cdc", 1, None, None, None, "CHECKSUM_MISMATCH", 9, "fatal", "d", 5, 6,
    table="t", row_key=(("id", 1), ("name", "x")), row_image="current", commit_ts=44,
    expected_checksum=1, computed_checksum=2,
)  # fmt: skip
SCHEMA = Incident(
    "orders", 0, None, None, None, "SUBJECT_MISMATCH", 4, "warning", "d", 5, 6,
    schema_id=12, message_field="value", expected_subject="orders-value", registered_subjects=("other",),
)  # fmt: skip
TRACE = Incident(
    "orders", 0, None, None, None, "LOST", 5, "fatal", "d", 4, 6, route="r", trace_id="cd" * 16, hop=0, group="g"
)


def fits(incident: Incident) -> None:
    """Within every bound: valid against schema.json, and read back as written."""
    shown = incident.to_json()
    errors = [f"{list(e.path)}: {e.message[:80]}" for e in VALIDATOR.iter_errors(shown)]
    assert not errors, errors
    assert len(incident.value) <= MAX_INCIDENT_BYTES
    assert Incident.from_value(incident.value) == incident


def refused(value: bytes, because: str) -> None:
    with pytest.raises(ValueError, match=because):
        Incident.from_value(value)


def with_fields(base: Incident, **fields) -> bytes:
    shown = base.to_json()
    shown.update(fields)
    return json.dumps(shown).encode()


# --- the parser -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MAX_CHARS))
def test_a_string_field_at_its_bound_is_read_and_one_character_more_is_refused(name):
    base = {"expected_subject": SCHEMA, "table": CHECKSUM, "route": TRACE, "group": TRACE}.get(name, DIV)
    limit = MAX_CHARS[name]
    letter = "X" if name == "verdict" else "x"
    at_bound = Incident.from_value(with_fields(base, **{name: letter * limit}))
    assert getattr(at_bound, name) == letter * limit
    refused(with_fields(base, **{name: letter * (limit + 1)}), f"{name} is {limit + 1:,} characters long")


def test_lists_and_row_keys_over_their_bounds_are_refused():
    subjects = ["s"] * (MAX_REGISTERED_SUBJECTS + 1)
    refused(with_fields(SCHEMA, registered_subjects=subjects), "registered_subjects has 17 items")
    refused(with_fields(SCHEMA, registered_subjects=["s" * (MAX_SUBJECT_CHARS + 1)]), "subject longer than")
    many = {f"c{i}": i for i in range(MAX_ROW_KEY_COLUMNS + 1)}
    refused(with_fields(CHECKSUM, row_key=many), "row_key has 17 columns")
    refused(with_fields(CHECKSUM, row_key={"c" * (MAX_COLUMN_CHARS + 1): 1}), "column name longer than")
    refused(with_fields(CHECKSUM, row_key={"id": "v" * (MAX_ROW_KEY_VALUE_CHARS + 1)}), "column 'id' is longer")
    refused(with_fields(CHECKSUM, row_key={"id": MAX_INT + 1}), "column 'id' is outside 64 bits")


@pytest.mark.parametrize("name", ["offset", "detected_at_ms", "commit_ts", "expected_checksum", "seq"])
def test_an_integer_outside_64_bits_is_refused(name):
    base = CHECKSUM if name in ("commit_ts", "expected_checksum") else DIV
    assert Incident.from_value(with_fields(base, **{name: MAX_INT})) is not None
    refused(with_fields(base, **{name: MAX_INT + 1}), f"{name} is outside 64 bits")


@pytest.mark.parametrize("producer", ["ab" * 15, "ab" * 17, "AB" * 16, "zz" * 16, "x", "ab" * 16 + "\n"])
def test_a_producer_that_is_not_a_guid_is_refused(producer):
    refused(with_fields(DIV, producer=producer), "producer is .*not 32 lowercase hex digits")


@pytest.mark.parametrize("verdict", ["missing", "MISS ING", "\U0001f600", "_X", "X\n"])
def test_a_verdict_that_is_not_a_class_name_is_refused(verdict):
    refused(with_fields(DIV, verdict=verdict), "verdict is .*not a class")


def test_a_trace_id_that_is_not_32_hex_digits_is_refused():
    refused(with_fields(TRACE, trace_id="trace"), "trace_id is 'trace', not 32 lowercase hex digits")


def test_a_value_larger_than_the_bound_is_refused_before_it_is_parsed():
    # Not JSON at all: refused for its size, so never handed to the parser.
    refused(b"[" * (MAX_INCIDENT_BYTES + 1), f"incident of {MAX_INCIDENT_BYTES + 1:,} bytes is larger")
    refused(with_fields(DIV, detail="x" * MAX_INCIDENT_BYTES), "larger than the 262,144 read")


def test_an_incident_at_every_bound_in_the_costliest_characters_fits_the_record_bound():
    widest = Incident(
        SMILE * MAX_CHARS["topic"], 0, None, None, None, "V" * MAX_CHARS["verdict"], MAX_INT, "fatal",
        SMILE * MAX_CHARS["detail"], MAX_INT, MAX_INT, resolved_at_ms=MAX_INT, schema_id=MAX_INT,
        message_field="value", expected_subject=SMILE * MAX_CHARS["expected_subject"],
        registered_subjects=tuple(f"{i:02}" + SMILE * (MAX_SUBJECT_CHARS - 2) for i in range(MAX_REGISTERED_SUBJECTS)),
        table=SMILE * MAX_CHARS["table"],
        row_key=tuple((f"{i:02}" + SMILE * (MAX_COLUMN_CHARS - 2), SMILE * MAX_ROW_KEY_VALUE_CHARS)
                      for i in range(MAX_ROW_KEY_COLUMNS)),
        row_image="previous", commit_ts=MAX_INT, expected_checksum=MAX_INT, computed_checksum=MAX_INT,
        route=SMILE * MAX_CHARS["route"], trace_id="ef" * 16, hop=MAX_INT, group=SMILE * MAX_CHARS["group"],
    )  # fmt: skip
    assert len(widest.value) > MAX_INCIDENT_BYTES // 2  # the bound is not many times what fits
    fits(widest)


# --- the documented numbers ---------------------------------------------------------------


def test_schema_json_states_the_bounds_the_parser_enforces():
    properties = incident_schema()["properties"]
    for name, limit in MAX_CHARS.items():
        assert properties[name]["maxLength"] == limit, name
    assert properties["registered_subjects"]["maxItems"] == MAX_REGISTERED_SUBJECTS
    assert properties["registered_subjects"]["items"]["maxLength"] == MAX_SUBJECT_CHARS
    row_key = properties["row_key"]
    assert row_key["maxProperties"] == MAX_ROW_KEY_COLUMNS
    assert row_key["propertyNames"]["maxLength"] == MAX_COLUMN_CHARS
    assert row_key["additionalProperties"]["maxLength"] == MAX_ROW_KEY_VALUE_CHARS
    for name, prop in properties.items():
        if "integer" in (prop.get("type") if isinstance(prop.get("type"), list) else [prop.get("type")]):
            assert prop["maximum"] == MAX_INT, name
    assert f"{MAX_INCIDENT_BYTES} bytes" in incident_schema()["description"]


def test_the_docs_table_states_the_bounds():
    docs = DOCS.read_text(encoding="utf-8")
    fields = docs.split("## Fields", 1)[1].split("\n## ", 1)[0]
    for name, limit in MAX_CHARS.items():
        rows = [line for line in fields.splitlines() if line.startswith("| `")]
        row = next(line for line in rows if f"`{name}`" in line.split("|")[1])
        assert f"{limit:,}" in row.split("|")[3], (name, row)
    assert f"{MAX_INCIDENT_BYTES:,} bytes" in docs


# --- what kdiv builds ---------------------------------------------------------------------


def test_builders_cut_outside_data_to_the_bounds_with_a_marker():
    record = ConsumedRecord("t" * 10_000, 0, 5, 1_700_000_000_000, b"k", b"v")
    div = incident_for(ValidationResult(record, Verdict.MALFORMED, detail=HUGE), 7)
    assert div is not None
    fits(div)
    kept = div.detail.split("…[")[0]
    assert len(div.detail) == MAX_CHARS["detail"] and HUGE.startswith(kept)
    assert div.detail.endswith(f"…[{len(HUGE) - len(kept)} more characters cut]")
    row = ChecksumResult(
        ChecksumVerdict.CHECKSUM_MISMATCH, MAX_INT + 1, 1 << 200, "db." + HUGE,
        {f"col{i}" + "c" * 100: (b"\xff" * 5000 if i % 2 else 1 << 300) for i in range(100)},
        -(1 << 80), detail=HUGE,
    )  # fmt: skip
    from kdiv.changefeed.verify import RowVerdict

    changefeed = checksum_incident(RowVerdict("cdc", 0, 9, 5, row), 7)
    fits(changefeed)
    assert changefeed.expected_checksum is None and changefeed.commit_ts is None
    assert "the row key has 100 columns, the first 16 listed" in changefeed.detail
    assert changefeed.row_key is not None and len(changefeed.row_key) == MAX_ROW_KEY_COLUMNS
    assert changefeed.table is not None and changefeed.table.endswith("more characters cut]")
    schema = schema_incident(
        "orders", 0, 4, "value", 12, "SUBJECT_MISMATCH", HUGE, tuple(HUGE[:i] for i in range(1, 200)), HUGE, None, 7
    )
    fits(schema)
    assert "registered under 199 subjects, the first 16 listed" in schema.detail
    fits(partition_incident(HUGE, 0, "LOG_REWOUND", 3, "fatal", HUGE, 7))
    trace = TraceVerdict(TraceOutcome.LOST, HUGE, bytes(16), 0, group=HUGE, source=("orders", 0, 5), detail=HUGE)
    fits(trace_incident(trace, 7))


def test_an_incident_within_the_bounds_is_built_unchanged():
    for incident in (DIV, CHECKSUM, SCHEMA, TRACE):
        assert fitted(incident) is incident


_TEXT = st.text(alphabet=st.sampled_from('ab"\\é\x00' + SMILE), max_size=6000)
_INTS = st.integers(min_value=-(1 << 70), max_value=1 << 70)


@settings(max_examples=60, deadline=None)
@given(
    text=_TEXT,
    subjects=st.lists(_TEXT, max_size=40),
    key=st.lists(
        st.tuples(_TEXT, st.one_of(_TEXT, _INTS, st.booleans(), st.none())), max_size=40, unique_by=lambda p: p[0]
    ),
    number=_INTS,
)
def test_fitted_fits_any_incident(text, subjects, key, number):
    wild = replace(
        CHECKSUM, topic=text or "t", detail=text, table=text, route=text, group=text,
        expected_subject=text, registered_subjects=tuple(subjects), row_key=tuple(key) or None, commit_ts=number,
        expected_checksum=number, record_timestamp_ms=number, schema_id=abs(number), hop=abs(number),
    )  # fmt: skip
    fits(fitted(wild))
