"""TiCDC row checksums (shared/spec/ticdc-checksum.md): the spec's worked examples, one vector per
column type built by hand from the rule text, the Avro protocol's verdicts, and properties.

Expected CRCs are computed here from the byte rules (8-byte little-endian integers mod 2^64,
4-byte little-endian lengths, binary64 floats), never with kdiv's own encoders.
"""

from __future__ import annotations

import datetime
import io
import json
import math
import struct
import zlib
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdiv.ticdc.avro import AvroChecksumVerifier, verify_avro
from kdiv.ticdc.checksum import ChecksumVerdict, RowImage, SkipReason, parse_allowed
from kdiv.ticdc.simple import verify_simple

# Byte rules of section 3, written out independently of kdiv.ticdc.checksum.


def u64(number: int) -> bytes:
    return (number % 2**64).to_bytes(8, "little")


def lp(data: bytes) -> bytes:
    return len(data).to_bytes(4, "little") + data


def f64(number: float) -> bytes:
    return struct.pack("<d", number)


def crc(*parts: bytes) -> int:
    return zlib.crc32(b"".join(parts))


# TiCDC Avro value schemas -------------------------------------------------------------------------

EXTENSION_FIELDS: list[dict[str, Any]] = [
    {"name": "_tidb_op", "type": "string", "default": ""},
    {"name": "_tidb_commit_ts", "type": "long", "default": 0},
    {"name": "_tidb_commit_physical_time", "type": "long", "default": 0},
    {"name": "_tidb_row_level_checksum", "type": "string", "default": ""},
    {"name": "_tidb_corrupted", "type": "boolean", "default": False},
    {"name": "_tidb_checksum_version", "type": "int", "default": 0},
]


def col(avro_type: str, tidb_type: str, **parameters: str) -> dict[str, Any]:
    return {"type": avro_type, "connect.parameters": {"tidb_type": tidb_type, **parameters}}


def value_schema(*columns: tuple[str, Any], table: str = "t", namespace: str = "default.test") -> dict[str, Any]:
    fields = []
    for name, column_type in columns:
        avro_field: dict[str, Any] = {"name": name, "type": column_type}
        if isinstance(column_type, list):
            avro_field["default"] = None
        fields.append(avro_field)
    return {"type": "record", "name": table, "namespace": namespace, "fields": fields + EXTENSION_FIELDS}


def nullable(column_type: dict[str, Any]) -> list[Any]:
    return ["null", column_type]


COMMIT_TS = 449872367820832769


def row(checksum: int | str, corrupted: bool = False, op: str = "c", **columns: Any) -> dict[str, Any]:
    return {
        **columns,
        "_tidb_op": op,
        "_tidb_commit_ts": COMMIT_TS,
        "_tidb_commit_physical_time": COMMIT_TS >> 18,
        "_tidb_row_level_checksum": str(checksum),
        "_tidb_corrupted": corrupted,
        "_tidb_checksum_version": 0,
    }


def avro_round_trip(value: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The value as a consumer sees it: encoded by fastavro and decoded again."""
    parsed = fastavro.parse_schema(schema)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, value)
    decoded = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), parsed, None)
    assert isinstance(decoded, dict)
    return decoded


# Worked examples (section 8) ----------------------------------------------------------------------

ORDERS_SCHEMA = value_schema(
    ("id", col("int", "INT")),
    ("name", col("string", "TEXT")),
    ("amount", col("string", "DECIMAL")),
    ("note", nullable(col("string", "TEXT"))),
    table="orders",
)
EXAMPLE_A_FRAME = bytes.fromhex(
    "00 00 00 00 07 02 06 61 62 63 0a 31 32 2e 35 30 00 02 63"
    " 82 80 cc e3 9e a2 a2 be 0c 9c f6 91 92 f2 63 14 32 39 36 30 39 37 31 34 35 31 00 00"
)


def test_crc_is_ieee_with_the_spec_check_value() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926


def test_example_a_bytes_are_the_rule_text() -> None:
    expected = crc(u64(1), lp(b"abc"), lp(b"12.50"))
    assert expected == 2960971451 == 0xB07CD6BB


def test_example_a_framed_avro_insert_verifies() -> None:
    assert len(EXAMPLE_A_FRAME) == 47
    assert EXAMPLE_A_FRAME[0] == 0 and int.from_bytes(EXAMPLE_A_FRAME[1:5], "big") == 7
    value = fastavro.schemaless_reader(io.BytesIO(EXAMPLE_A_FRAME[5:]), fastavro.parse_schema(ORDERS_SCHEMA), None)
    assert isinstance(value, dict)
    assert value["_tidb_commit_physical_time"] == 1716126891406
    result = verify_avro(value, ORDERS_SCHEMA, key={"id": 1})
    assert result.verdict is ChecksumVerdict.OK
    assert result.expected == result.computed == 2960971451
    assert result.table == "test.orders"
    assert result.commit_ts == 449872367820832769
    assert dict(result.key) == {"id": 1}
    assert result.image is RowImage.CURRENT


def test_example_a_any_changed_value_is_a_mismatch() -> None:
    value = row(2960971451, id=1, name="abc", amount="12.50", note=None)
    for changed in ({"id": 2}, {"name": "abd"}, {"amount": "12.5"}, {"note": ""}, {"note": "x"}):
        result = verify_avro({**value, **changed}, ORDERS_SCHEMA)
        assert result.verdict is ChecksumVerdict.CHECKSUM_MISMATCH, changed
        assert result.expected == 2960971451 and result.computed != 2960971451
        assert "mismatch" in result.detail


EXAMPLE_B_SCHEMA = value_schema(
    ("a", col("int", "INT")),
    ("b", col("string", "BIGINT UNSIGNED")),
    ("c", col("float", "FLOAT")),
    ("d", col("string", "ENUM", allowed="x,y,z")),
    ("e", col("string", "SET", allowed="a,b,c")),
    ("f", col("bytes", "BIT", length="10")),
    ("g", col("int", "YEAR")),
)


def test_example_b_bytes_are_the_rule_text() -> None:
    expected = crc(
        bytes.fromhex("ff ff ff ff ff ff ff ff"),
        bytes.fromhex("ff ff ff ff ff ff ff ff"),
        bytes.fromhex("00 00 00 60 b8 1e 09 40"),
        bytes.fromhex("02 00 00 00 00 00 00 00"),
        bytes.fromhex("05 00 00 00 00 00 00 00"),
        bytes.fromhex("02 01 00 00 00 00 00 00"),
        bytes.fromhex("e8 07 00 00 00 00 00 00"),
    )
    assert expected == 4257891989 == 0xFDCA4695


def test_example_b_avro_conversions_verify_after_a_fastavro_round_trip() -> None:
    value = row(4257891989, a=-1, b="18446744073709551615", c=3.14, d="y", e="a,c", f=b"\x01\x02", g=2024)
    decoded = avro_round_trip(value, EXAMPLE_B_SCHEMA)
    assert decoded["c"] == 3.140000104904175  # the float32 widened, as fastavro returns it
    result = verify_avro(decoded, EXAMPLE_B_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK, result.detail
    assert result.computed == 4257891989


EXAMPLE_C_MESSAGE = (
    '{"version":1,"database":"test","table":"t_c","tableID":110,"type":"INSERT",'
    '"commitTs":449872367820832769,"buildTs":1716126891500,"schemaVersion":449872360000000000,'
    '"checksum":{"version":0,"corrupted":false,"current":1722400318,"previous":0},'
    '"data":{"dt":"2024-03-01 08:00:00","id":"7","j":"{\\"k\\": [1, 2]}","t":"-12:30:00",'
    '"ts":{"location":"Asia/Shanghai","value":"2024-03-01 08:00:00.500"},"vb":"AP8="}}'
)


def simple_column(name: str, mysql_type: str, **data_type: Any) -> dict[str, Any]:
    return {"name": name, "dataType": {"mysqlType": mysql_type, **data_type}, "nullable": True, "default": None}


EXAMPLE_C_SCHEMA = {
    "database": "test",
    "table": "t_c",
    "tableID": 110,
    "version": 449872360000000000,
    "columns": [
        simple_column("id", "int"),
        simple_column("ts", "timestamp"),
        simple_column("dt", "datetime"),
        simple_column("t", "time"),
        simple_column("j", "json"),
        simple_column("vb", "varbinary"),
    ],
    "indexes": [{"name": "primary", "unique": True, "primary": True, "nullable": False, "columns": ["id"]}],
}


def test_example_c_bytes_are_the_rule_text() -> None:
    tail = lp(b"2024-03-01 08:00:00") + lp(b"-12:30:00") + lp(b'{"k": [1, 2]}') + lp(b"\x00\xff")
    assert crc(u64(7), lp(b"2024-03-01 00:00:00.500"), tail) == 1722400318 == 0x66A9BE3E
    assert crc(u64(7), lp(b"2024-03-01 08:00:00.500"), tail) == 3221976997 == 0xC00B77A5


def test_example_c_simple_json_insert_verifies_in_utc() -> None:
    (result,) = verify_simple(EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK, result.detail
    assert result.expected == result.computed == 1722400318
    assert result.table == "test.t_c"
    assert dict(result.key) == {"id": "7"}
    assert result.commit_ts == 449872367820832769


def test_example_c_hashed_as_sent_is_the_pre_7_1_4_rule() -> None:
    (utc,) = verify_simple(EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA, timestamp_mode="utc")
    (as_sent,) = verify_simple(EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA, timestamp_mode="as_sent")
    assert utc.verdict is ChecksumVerdict.OK
    assert as_sent.verdict is ChecksumVerdict.CHECKSUM_MISMATCH
    assert as_sent.computed == 3221976997


# One vector per column type (Avro) ----------------------------------------------------------------

# (tidb_type, Avro type, parameters, value as sent, bytes by the rule text)
AVRO_TYPE_VECTORS: list[tuple[str, str, dict[str, str], Any, bytes]] = [
    ("INT", "int", {}, -128, bytes.fromhex("80 ff ff ff ff ff ff ff")),  # TINYINT
    ("INT", "int", {}, 1, bytes.fromhex("01 00 00 00 00 00 00 00")),  # BOOL
    ("INT", "int", {}, -32768, u64(2**64 - 32768)),  # SMALLINT
    ("INT", "int", {}, 8388607, u64(8388607)),  # MEDIUMINT
    ("INT", "int", {}, -(2**31), u64(2**64 - 2**31)),  # INT
    ("INT UNSIGNED", "int", {}, 255, u64(255)),  # TINYINT UNSIGNED
    ("INT UNSIGNED", "long", {}, 4294967295, bytes.fromhex("ff ff ff ff 00 00 00 00")),  # INT UNSIGNED
    ("BIGINT", "long", {}, -(2**63), bytes.fromhex("00 00 00 00 00 00 00 80")),
    ("BIGINT", "long", {}, 0x0123456789ABCDEF, bytes.fromhex("ef cd ab 89 67 45 23 01")),
    ("BIGINT UNSIGNED", "string", {}, "18446744073709551615", b"\xff" * 8),
    ("BIGINT UNSIGNED", "string", {}, "9223372036854775808", bytes.fromhex("00 00 00 00 00 00 00 80")),
    ("BIGINT UNSIGNED", "long", {}, -1, b"\xff" * 8),  # avro-bigint-unsigned-handling-mode=long
    ("YEAR", "int", {}, 1901, u64(1901)),
    ("FLOAT", "float", {}, 0.5, f64(0.5)),
    ("FLOAT", "float", {}, -0.0, bytes.fromhex("00 00 00 00 00 00 00 80")),
    ("FLOAT", "float", {}, math.inf, bytes(8)),
    ("DOUBLE", "double", {}, 602214076000000000000000.0, f64(6.02214076e23)),
    ("DOUBLE", "double", {}, -0.0, bytes.fromhex("00 00 00 00 00 00 00 80")),
    ("DOUBLE", "double", {}, math.nan, bytes(8)),
    ("DOUBLE", "double", {}, -math.inf, bytes(8)),
    ("DECIMAL", "string", {}, "-12.500", lp(b"-12.500")),
    ("TEXT", "string", {}, "", bytes(4)),  # empty is not NULL
    ("TEXT", "string", {}, "héllo", lp("héllo".encode())),  # CHAR/VARCHAR/TEXT: UTF-8 bytes
    ("BLOB", "bytes", {}, b"\x00\xff\x10", lp(b"\x00\xff\x10")),  # BINARY/VARBINARY/BLOB
    ("DATE", "string", {}, "2024-02-29", lp(b"2024-02-29")),
    ("DATETIME", "string", {}, "2024-03-01 08:00:00.123456", lp(b"2024-03-01 08:00:00.123456")),
    ("TIME", "string", {}, "-838:59:59", lp(b"-838:59:59")),
    ("JSON", "string", {}, '{"a": [1, 2.5], "b": null}', lp(b'{"a": [1, 2.5], "b": null}')),
    ("TIMESTAMP", "string", {}, "2024-03-01 08:00:00.500", lp(b"2024-03-01 08:00:00.500")),  # zone UTC
    ("TIMESTAMP", "string", {}, "0000-00-00 00:00:00", lp(b"0000-00-00 00:00:00")),
    ("ENUM", "string", {"allowed": "x,y,z"}, "z", u64(3)),
    ("ENUM", "string", {"allowed": "a\\,b,c"}, "a,b", u64(1)),  # a member with a comma, escaped
    ("ENUM", "string", {"allowed": "a\\,b,c"}, "c", u64(2)),
    ("ENUM", "string", {"allowed": "Y,y"}, "y", u64(2)),  # case-sensitive
    ("SET", "string", {"allowed": "a,b,c,d"}, "", u64(0)),
    ("SET", "string", {"allowed": "a,b,c,d"}, "b,d", u64(0b1010)),
    ("SET", "string", {"allowed": "a,b,c,d"}, "a,b,c,d", u64(0b1111)),
    ("BIT", "bytes", {"length": "1"}, b"\x00", u64(0)),
    ("BIT", "bytes", {"length": "64"}, b"\xff" * 8, b"\xff" * 8),
    ("BIT", "bytes", {"length": "64"}, b"\x00\x00\x01", u64(1)),  # leading zero bytes dropped
    ("TiDBVECTORFloat32", "string", {}, "[1,2.5]", bytes.fromhex("02000000 0000803f 00002040")),
    ("TiDBVECTORFloat32", "string", {}, "[]", bytes(4)),
]


@pytest.mark.parametrize(
    ("tidb_type", "avro_type", "parameters", "value", "encoded"),
    AVRO_TYPE_VECTORS,
    ids=[f"{v[0]}-{v[3]!r}"[:60] for v in AVRO_TYPE_VECTORS],
)
def test_avro_column_bytes_follow_the_rule(
    tidb_type: str, avro_type: str, parameters: dict[str, str], value: Any, encoded: bytes
) -> None:
    # Between an integer before and a text after, so that the column's bytes sit mid-row.
    schema = value_schema(
        ("before", col("long", "BIGINT")),
        ("c", col(avro_type, tidb_type, **parameters)),
        ("after", col("string", "TEXT")),
    )
    expected = crc(u64(42), encoded, lp(b"end"))
    result = verify_avro(row(expected, before=42, c=value, after="end"), schema)
    assert result.verdict is ChecksumVerdict.OK, result.detail
    # And one bit off in the carried value fails it.
    flipped = verify_avro(row(expected ^ 1, before=42, c=value, after="end"), schema)
    assert flipped.verdict is ChecksumVerdict.CHECKSUM_MISMATCH
    assert flipped.computed == expected


def test_geometry_and_null_append_nothing() -> None:
    schema = value_schema(
        ("a", col("long", "BIGINT")),
        ("g", nullable(col("bytes", "GEOMETRY"))),
        ("n", nullable(col("string", "TEXT"))),
    )
    expected = crc(u64(5))
    assert verify_avro(row(expected, a=5, g=b"\x01\x02", n=None), schema).verdict is ChecksumVerdict.OK
    assert verify_avro(row(expected, a=5, g=None, n=None), schema).verdict is ChecksumVerdict.OK
    # NULL and "" differ: the empty string appends its 4-byte zero length.
    assert verify_avro(row(expected, a=5, g=None, n=""), schema).verdict is ChecksumVerdict.CHECKSUM_MISMATCH
    assert verify_avro(row(crc(u64(5), bytes(4)), a=5, g=None, n=""), schema).verdict is ChecksumVerdict.OK


def test_nullable_union_in_either_order_reads_the_object_branch() -> None:
    schema = value_schema(
        ("a", nullable(col("int", "INT"))),
        ("b", [col("string", "TEXT"), "null"]),
    )
    schema["fields"][1]["default"] = "dflt"
    expected = crc(u64(3), lp(b"x"))
    decoded = avro_round_trip(row(expected, a=3, b="x"), schema)
    assert verify_avro(decoded, schema).verdict is ChecksumVerdict.OK


def test_order_is_the_schema_order_not_the_name_order_nor_the_dict_order() -> None:
    schema = value_schema(("z", col("int", "INT")), ("a", col("int", "INT")))
    in_schema_order = crc(u64(1), u64(2))
    value = row(in_schema_order, a=2, z=1)  # dict order a, z
    assert verify_avro(value, schema).verdict is ChecksumVerdict.OK
    assert verify_avro(row(crc(u64(2), u64(1)), a=2, z=1), schema).verdict is ChecksumVerdict.CHECKSUM_MISMATCH


def test_columns_end_at_the_first_tidb_op_field() -> None:
    schema = value_schema(("a", col("int", "INT")))
    expected = crc(u64(9))
    value = row(expected, a=9)
    value["_tidb_op"] = "u"  # an UPDATE: the new row only
    result = verify_avro(value, schema)
    assert result.verdict is ChecksumVerdict.OK
    assert result.image is RowImage.CURRENT


def test_fastavro_parsed_schema_and_json_text_give_the_same_plan() -> None:
    value = row(2960971451, id=1, name="abc", amount="12.50", note=None)
    parsed: Any = fastavro.parse_schema(ORDERS_SCHEMA)  # typed as a union of schema shapes
    for schema in (ORDERS_SCHEMA, parsed, json.dumps(ORDERS_SCHEMA)):
        result = verify_avro(value, schema)
        assert result.verdict is ChecksumVerdict.OK
        assert result.table == "test.orders"


def test_plans_are_cached_per_schema_object_and_shared_between_equal_schemas() -> None:
    verifier = AvroChecksumVerifier()
    copy = json.loads(json.dumps(ORDERS_SCHEMA))
    assert verifier.plan(ORDERS_SCHEMA) is verifier.plan(ORDERS_SCHEMA)
    assert verifier.plan(copy) is verifier.plan(ORDERS_SCHEMA)
    different = value_schema(("id", col("long", "BIGINT")), table="orders")
    assert verifier.plan(different) is not verifier.plan(ORDERS_SCHEMA)


def test_enum_member_listed_with_quotes_folded_is_found() -> None:
    # TiCDC lists the member a''b as a'b (escapeEnumAndSetOptions) but sends the value as stored.
    schema = value_schema(("e", col("string", "ENUM", allowed="x,a'b")))
    assert verify_avro(row(crc(u64(2)), e="a''b"), schema).verdict is ChecksumVerdict.OK


def test_parse_allowed_splits_on_unescaped_commas_only() -> None:
    assert parse_allowed("a,b") == ["a", "b"]
    assert parse_allowed("a\\,b,c") == ["a,b", "c"]
    assert parse_allowed("") == [""]
    assert parse_allowed("x\\y,z") == ["x\\y", "z"]


# Verdict precedence and skips --------------------------------------------------------------------


def test_tombstone_is_skipped_with_its_key() -> None:
    result = verify_avro(None, ORDERS_SCHEMA, key={"id": 5})
    assert result.verdict is ChecksumVerdict.SKIPPED
    assert result.skip_reason is SkipReason.TOMBSTONE
    assert dict(result.key) == {"id": 5}
    assert result.table == "test.orders"
    assert not result.is_fault
    assert verify_avro(None, None).skip_reason is SkipReason.TOMBSTONE


@pytest.mark.parametrize("carried", ["", None])
def test_absent_checksum_is_skipped_not_ok(carried: str | None) -> None:
    value = row(0, id=1, name="abc", amount="12.50", note=None)
    value["_tidb_row_level_checksum"] = carried
    result = verify_avro(value, ORDERS_SCHEMA)
    assert result.verdict is ChecksumVerdict.SKIPPED
    assert result.skip_reason is SkipReason.CHECKSUM_ABSENT


def test_schema_without_integrity_fields_is_skipped() -> None:
    schema = value_schema(("a", col("int", "INT")))
    schema["fields"] = schema["fields"][:4]  # columns, _tidb_op, commit ts, physical time
    value = {"a": 1, "_tidb_op": "c", "_tidb_commit_ts": 1, "_tidb_commit_physical_time": 0}
    result = verify_avro(value, schema)
    assert result.skip_reason is SkipReason.CHECKSUM_ABSENT
    assert result.commit_ts == 1


def test_zero_checksum_is_skipped_even_for_an_all_null_row() -> None:
    schema = value_schema(("a", nullable(col("int", "INT"))))
    result = verify_avro(row(0, a=None), schema)
    assert result.verdict is ChecksumVerdict.SKIPPED
    assert result.skip_reason is SkipReason.CHECKSUM_ZERO
    # An all-NULL row hashes to 0, which is indistinguishable from "disabled".
    assert crc() == 0
    # Zero is skipped whatever the row holds.
    assert verify_avro(row(0, a=7), schema).skip_reason is SkipReason.CHECKSUM_ZERO


def test_corrupted_flag_wins_over_a_matching_checksum() -> None:
    value = row(2960971451, corrupted=True, id=1, name="abc", amount="12.50", note=None)
    result = verify_avro(value, ORDERS_SCHEMA)
    assert result.verdict is ChecksumVerdict.CORRUPTED_FLAG
    assert result.expected == result.computed == 2960971451
    assert result.is_fault


def test_corrupted_flag_wins_over_zero_absent_and_unhashable() -> None:
    for carried in ("0", "", "garbage"):
        value = row(0, corrupted=True, id="not an int", name="abc", amount="12.50", note=None)
        value["_tidb_row_level_checksum"] = carried
        result = verify_avro(value, ORDERS_SCHEMA)
        assert result.verdict is ChecksumVerdict.CORRUPTED_FLAG, carried
        assert result.computed is None


def test_tombstone_wins_over_everything() -> None:
    assert verify_avro(None, "not a schema").verdict is ChecksumVerdict.SKIPPED


# Malformed input: a verdict naming what is wrong, never an exception ------------------------------


def test_malformed_values_name_the_problem() -> None:
    good = row(2960971451, id=1, name="abc", amount="12.50", note=None)
    cases: list[tuple[Any, Any, str]] = [
        ([1, 2], ORDERS_SCHEMA, "not a decoded Avro record"),
        ({**good, "_tidb_row_level_checksum": "abc"}, ORDERS_SCHEMA, "not a decimal uint32"),
        ({**good, "_tidb_row_level_checksum": "4294967296"}, ORDERS_SCHEMA, "uint32"),
        ({**good, "_tidb_row_level_checksum": "-5"}, ORDERS_SCHEMA, "not a decimal uint32"),
        ({**good, "_tidb_row_level_checksum": 12.5}, ORDERS_SCHEMA, "not a decimal uint32"),
        ({**good, "_tidb_corrupted": "yes"}, ORDERS_SCHEMA, "not a boolean"),
        ({**good, "id": "1"}, ORDERS_SCHEMA, "column 'id' (INT)"),
        ({**good, "name": b"abc"}, ORDERS_SCHEMA, "column 'name' (TEXT)"),
        ({**good, "name": None}, ORDERS_SCHEMA, "NULL but its schema type is not nullable"),
        ({k: v for k, v in good.items() if k != "amount"}, ORDERS_SCHEMA, "'amount' (DECIMAL) is missing"),
        ({**good, "note": 5}, ORDERS_SCHEMA, "column 'note' (TEXT)"),
        (good, {"type": "enum", "symbols": []}, "not an Avro record"),
        (good, "{not json", "not JSON"),
        (good, 42, "not an Avro record"),
        (good, None, "no writer schema"),
        (good, {"type": "record", "name": "t", "fields": "x"}, "no list of fields"),
    ]
    for value, schema, fragment in cases:
        result = verify_avro(value, schema)
        assert result.verdict is ChecksumVerdict.MALFORMED, (value, schema)
        assert fragment in result.detail, (fragment, result.detail)
        assert result.is_fault


@pytest.mark.parametrize(
    ("column_type", "value", "fragment"),
    [
        (col("string", "BIGINT UNSIGNED"), "+5", "not base-10 digits"),
        (col("string", "BIGINT UNSIGNED"), "-1", "not base-10 digits"),
        (col("string", "BIGINT UNSIGNED"), "18446744073709551616", "'c' (BIGINT UNSIGNED)"),
        (col("string", "BIGINT UNSIGNED"), "１２", "not base-10 digits"),  # full-width digits
        (col("string", "ENUM", allowed="x,y"), "z", "not a member of ENUM"),
        (col("string", "ENUM", allowed="x,y"), "X", "not a member of ENUM"),
        (col("string", "SET", allowed="x,y"), "x,w", "'w' is not a member of SET"),
        (col("bytes", "BIT", length="64"), b"\x01" * 9, "'c' (BIT)"),
        (col("string", "TiDBVECTORFloat32"), "1,2", "not a vector text"),
        (col("string", "TiDBVECTORFloat32"), "[1,x]", "'c' (TiDBVECTORFloat32)"),
        (col("float", "FLOAT"), "1.5", "expected a floating-point number"),
    ],
)
def test_malformed_column_values_name_the_column(column_type: dict[str, Any], value: Any, fragment: str) -> None:
    schema = value_schema(("c", column_type))
    result = verify_avro(row(123, c=value), schema)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert fragment in result.detail, result.detail
    assert result.expected == 123 and result.computed is None


@pytest.mark.parametrize(
    ("column_type", "fragment"),
    [
        (
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 10,
                "scale": 2,
                "connect.parameters": {"tidb_type": "DECIMAL"},
            },
            "avro-decimal-handling-mode=precise",
        ),
        (col("string", "POINT"), "tidb_type 'POINT'"),
        (col("int", "TEXT"), "with Avro type 'int'"),
        ({"type": "int"}, "no connect.parameters"),
        ({"type": "int", "connect.parameters": {}}, "no connect.parameters.tidb_type"),
        ("int", "not a TiCDC column type"),
        (["null", "int", col("int", "INT")], "not a TiCDC column type"),
        (col("string", "ENUM"), "with Avro type 'string'"),  # no `allowed`
    ],
)
def test_schemas_that_cannot_be_followed_are_malformed_when_a_checksum_is_carried(
    column_type: Any, fragment: str
) -> None:
    schema = value_schema(("c", column_type))
    result = verify_avro(row(123, c=None), schema)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert fragment in result.detail, result.detail
    # Without a checksum there is nothing to verify: skipped, not malformed.
    assert verify_avro(row("", c=None), schema).skip_reason is SkipReason.CHECKSUM_ABSENT


def test_checksum_field_without_the_op_field_is_malformed() -> None:
    schema = value_schema(("a", col("int", "INT")))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "_tidb_op"]
    value = row(crc(u64(1)), a=1)
    del value["_tidb_op"]
    result = verify_avro(value, schema)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert "_tidb_op" in result.detail


def test_settings_errors_raise_at_once() -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        AvroChecksumVerifier(time_zone="Mars/Olympus_Mons")
    with pytest.raises(ValueError, match="timestamp_mode"):
        AvroChecksumVerifier(timestamp_mode="local")


def test_checksum_helper_raises_with_the_column_named() -> None:
    verifier = AvroChecksumVerifier()
    assert verifier.checksum(row(0, id=1, name="abc", amount="12.50", note=None), ORDERS_SCHEMA) == 2960971451
    with pytest.raises(ValueError, match="'id'"):
        verifier.checksum(row(0, id="x", name="abc", amount="12.50", note=None), ORDERS_SCHEMA)


# Properties --------------------------------------------------------------------------------------

ALL_TYPES_SCHEMA = value_schema(
    ("i", col("int", "INT")),
    ("iu", col("long", "INT UNSIGNED")),
    ("bi", col("long", "BIGINT")),
    ("bu", col("string", "BIGINT UNSIGNED")),
    ("y", col("int", "YEAR")),
    ("f", col("float", "FLOAT")),
    ("d", col("double", "DOUBLE")),
    ("dec", col("string", "DECIMAL")),
    ("s", nullable(col("string", "TEXT"))),
    ("b", nullable(col("bytes", "BLOB"))),
    ("dt", col("string", "DATETIME")),
    ("ts", col("string", "TIMESTAMP")),
    ("e", col("string", "ENUM", allowed="red,green,blue")),
    ("st", col("string", "SET", allowed="p,q,r,s")),
    ("bit", col("bytes", "BIT", length="16")),
    ("j", nullable(col("string", "JSON"))),
    ("v", nullable(col("string", "TiDBVECTORFloat32"))),
)
ENUM_MEMBERS = ["red", "green", "blue"]
SET_MEMBERS = ["p", "q", "r", "s"]

float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)
texts = st.text(max_size=12)
timestamps = st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2038, 1, 1)).map(
    lambda moment: moment.strftime("%Y-%m-%d %H:%M:%S")
)
vector_texts = st.lists(st.integers(-1000, 1000), max_size=4).map(lambda xs: "[" + ",".join(map(str, xs)) + "]")


def vector_bytes(text: str) -> bytes:
    elements = [float(x) for x in text[1:-1].split(",") if x]
    return len(elements).to_bytes(4, "little") + b"".join(struct.pack("<f", x) for x in elements)


@st.composite
def all_types_rows(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A row of ALL_TYPES_SCHEMA and its checksum, built from the rule text."""
    values: dict[str, Any] = {
        "i": draw(st.integers(-(2**31), 2**31 - 1)),
        "iu": draw(st.integers(0, 2**32 - 1)),
        "bi": draw(st.integers(-(2**63), 2**63 - 1)),
        "bu": str(draw(st.integers(0, 2**64 - 1))),
        "y": draw(st.integers(1901, 2155)),
        "f": draw(float32s),
        "d": draw(st.floats(allow_nan=False, allow_infinity=False)),
        "dec": f"{draw(st.integers(-(10**6), 10**6))}.{draw(st.integers(0, 99)):02d}",
        "s": draw(st.none() | texts),
        "b": draw(st.none() | st.binary(max_size=12)),
        "dt": draw(timestamps),
        "ts": draw(timestamps),
        "e": draw(st.sampled_from(ENUM_MEMBERS)),
        "st": ",".join(draw(st.lists(st.sampled_from(SET_MEMBERS), unique=True).map(lambda m: sorted(m)))),
        "bit": draw(st.integers(0, 2**16 - 1)).to_bytes(2, "big"),
        "j": draw(st.none() | st.just('{"k": [1, 2]}')),
        "v": draw(st.none() | vector_texts),
    }
    parts = [
        u64(values["i"]),
        u64(values["iu"]),
        u64(values["bi"]),
        u64(int(values["bu"])),
        u64(values["y"]),
        f64(values["f"]),
        f64(values["d"]),
        lp(values["dec"].encode()),
        b"" if values["s"] is None else lp(values["s"].encode()),
        b"" if values["b"] is None else lp(values["b"]),
        lp(values["dt"].encode()),
        lp(values["ts"].encode()),
        u64(ENUM_MEMBERS.index(values["e"]) + 1),
        u64(sum(1 << SET_MEMBERS.index(m) for m in values["st"].split(",") if m)),
        u64(int.from_bytes(values["bit"], "big")),
        b"" if values["j"] is None else lp(values["j"].encode()),
        b"" if values["v"] is None else vector_bytes(values["v"]),
    ]
    return values, crc(*parts)


def _changed(name: str, value: Any) -> Any:
    """A different value of the same column whose bytes differ."""
    if name in ("i", "iu", "y"):
        return value - 1 if value > 0 else value + 1
    if name == "bi":
        return value ^ 1
    if name == "bu":
        return str(int(value) ^ 1)
    if name in ("f", "d"):
        return value + 1.0 if abs(value) < 1e6 else value / 2
    if name in ("s", "j") and value is None:
        return "x"
    if name in ("dt", "ts"):  # another second
        return value[:-1] + ("1" if value[-1] != "1" else "2")
    if name in ("dec", "s", "j"):
        return value + "0"
    if name == "b":
        return b"\x00" if value is None else value + b"\x00"
    if name == "e":
        return ENUM_MEMBERS[(ENUM_MEMBERS.index(value) + 1) % 3]
    if name == "st":
        return "" if value else "p"
    if name == "bit":
        return (int.from_bytes(value, "big") ^ 1).to_bytes(2, "big")
    if name == "v":
        return "[]" if value not in (None, "[]") else "[1]"
    raise AssertionError(name)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(all_types_rows(), st.sampled_from([f["name"] for f in ALL_TYPES_SCHEMA["fields"][:17]]))
def test_every_row_verifies_and_every_changed_value_is_a_mismatch(case: tuple[dict[str, Any], int], name: str) -> None:
    values, expected = case
    decoded = avro_round_trip(row(expected, **values), ALL_TYPES_SCHEMA)
    result = verify_avro(decoded, ALL_TYPES_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK, result.detail
    assert result.computed == expected

    changed = dict(decoded, **{name: _changed(name, decoded[name])})
    if name == "f":  # the change must survive the float32 rounding of the Avro encoding
        changed = avro_round_trip(changed, ALL_TYPES_SCHEMA)
    mismatch = verify_avro(changed, ALL_TYPES_SCHEMA)
    assert mismatch.verdict is ChecksumVerdict.CHECKSUM_MISMATCH, (name, decoded[name], changed[name])
    assert mismatch.expected == expected


@settings(max_examples=150, deadline=None)
@given(all_types_rows(), st.integers(0, 31))
def test_any_flipped_bit_of_the_carried_checksum_is_a_mismatch(case: tuple[dict[str, Any], int], bit: int) -> None:
    values, expected = case
    flipped = expected ^ (1 << bit)
    result = verify_avro(row(flipped, **values), ALL_TYPES_SCHEMA)
    if flipped == 0:
        assert result.skip_reason is SkipReason.CHECKSUM_ZERO
    else:
        assert result.verdict is ChecksumVerdict.CHECKSUM_MISMATCH
        assert result.computed == expected


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.data())
def test_any_flipped_bit_of_a_hashed_byte_string_is_a_mismatch(payload: bytes, data: st.DataObject) -> None:
    schema = value_schema(("b", col("bytes", "BLOB")))
    expected = crc(lp(payload))
    assert verify_avro(row(expected, b=payload), schema).verdict is ChecksumVerdict.OK
    position = data.draw(st.integers(0, len(payload) * 8 - 1))
    corrupted = bytearray(payload)
    corrupted[position // 8] ^= 1 << (position % 8)
    assert verify_avro(row(expected, b=bytes(corrupted)), schema).verdict is ChecksumVerdict.CHECKSUM_MISMATCH


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.binary(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([f["name"] for f in ALL_TYPES_SCHEMA["fields"]]), json_like))
def test_arbitrary_values_give_a_verdict_never_an_exception(value: dict[str, Any]) -> None:
    result = verify_avro(value, ALL_TYPES_SCHEMA)
    assert isinstance(result.verdict, ChecksumVerdict)
    if result.verdict is ChecksumVerdict.MALFORMED:
        assert result.detail


@settings(max_examples=200, deadline=None)
@given(json_like, json_like)
def test_arbitrary_values_and_schemas_give_a_verdict_never_an_exception(value: Any, schema: Any) -> None:
    assert isinstance(verify_avro(value, schema).verdict, ChecksumVerdict)


def test_oversized_numbers_are_malformed_not_exceptions() -> None:
    schema = value_schema(("c", col("string", "BIGINT UNSIGNED")))
    result = verify_avro(row("9" * 5000, c="1"), schema)
    assert result.verdict is ChecksumVerdict.MALFORMED and "_tidb_row_level_checksum" in result.detail
    result = verify_avro(row(5, c="9" * 5000), schema)
    assert result.verdict is ChecksumVerdict.MALFORMED and "'c' (BIGINT UNSIGNED)" in result.detail
