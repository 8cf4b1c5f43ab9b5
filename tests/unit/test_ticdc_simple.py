"""TiCDC Simple protocol (spec sections 1 and 6): which images are verified, one vector per
mysqlType built by hand from the rule text, the Avro encoding, schema tracking, malformed input.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.ticdc.checksum import ChecksumVerdict, RowImage, SkipReason
from kdiv.ticdc.simple import SimpleChecksumVerifier, verify_simple
from tests.unit.test_ticdc_checksum import EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA, crc, f64, lp, simple_column, u64

SCHEMA_VERSION = 449872360000000000


def table_schema(*columns: tuple[str, str], indexes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "database": "shop",
        "table": "orders",
        "tableID": 120,
        "version": SCHEMA_VERSION,
        "columns": [simple_column(name, mysql_type) for name, mysql_type in columns],
        "indexes": indexes if indexes is not None else [],
    }


def dml(kind: str, *, current: int = 0, previous: int = 0, corrupted: bool = False, **fields: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "version": 1,
        "database": "shop",
        "table": "orders",
        "tableID": 120,
        "type": kind,
        "commitTs": 449872367820832769,
        "buildTs": 1716126891500,
        "schemaVersion": SCHEMA_VERSION,
        "checksum": {"version": 0, "corrupted": corrupted, "current": current, "previous": previous},
    }
    message.update(fields)
    return message


PK = [{"name": "primary", "unique": True, "primary": True, "nullable": False, "columns": ["id"]}]
ORDERS = table_schema(("id", "bigint"), ("name", "varchar"), ("note", "text"), indexes=PK)


def orders_checksum(id_text: str, name: str, note: str | None) -> int:
    return crc(u64(int(id_text)), lp(name.encode()), b"" if note is None else lp(note.encode()))


# One vector per mysqlType (JSON encoding) ---------------------------------------------------------

SIMPLE_TYPE_VECTORS: list[tuple[str, Any, bytes]] = [
    ("tinyint", "-128", bytes.fromhex("80 ff ff ff ff ff ff ff")),
    ("smallint", "32767", u64(32767)),
    ("mediumint", "-8388608", u64(2**64 - 8388608)),
    ("int", "2147483647", u64(2147483647)),
    ("bigint", "-9223372036854775808", bytes.fromhex("00 00 00 00 00 00 00 80")),
    ("bigint", "18446744073709551615", b"\xff" * 8),  # BIGINT UNSIGNED
    ("year", "2024", bytes.fromhex("e8 07 00 00 00 00 00 00")),
    ("float", "3.14", bytes.fromhex("00 00 00 60 b8 1e 09 40")),  # nearest binary32, widened
    ("float", "-0", bytes.fromhex("00 00 00 00 00 00 00 80")),
    ("double", "602214076000000000000000", f64(6.02214076e23)),
    ("double", "0.1", f64(0.1)),
    ("decimal", "12.50", lp(b"12.50")),
    ("char", "abc", lp(b"abc")),
    ("varchar", "héllo", lp("héllo".encode())),
    ("tinytext", "", bytes(4)),
    ("text", "t", lp(b"t")),
    ("mediumtext", "m", lp(b"m")),
    ("longtext", "l", lp(b"l")),
    ("binary", base64.b64encode(b"\x00\xff").decode(), lp(b"\x00\xff")),
    ("varbinary", "AP8=", lp(b"\x00\xff")),
    ("tinyblob", "", bytes(4)),
    ("blob", base64.b64encode(b"blob\x01").decode(), lp(b"blob\x01")),
    ("mediumblob", "AA==", lp(b"\x00")),
    ("longblob", "AQID", lp(b"\x01\x02\x03")),
    ("date", "2024-02-29", lp(b"2024-02-29")),
    ("datetime", "2024-03-01 08:00:00.5", lp(b"2024-03-01 08:00:00.5")),
    ("time", "-12:30:00", lp(b"-12:30:00")),
    ("json", '{"a": [1, 2.5], "b": null}', lp(b'{"a": [1, 2.5], "b": null}')),
    ("enum", "3", u64(3)),  # the index, no name mapping
    ("set", "13", u64(13)),  # the bitmask
    ("bit", "2748", u64(2748)),
    ("vector", "[1,2.5]", bytes.fromhex("02000000 0000803f 00002040")),
    ("geometry", "AAAAAAEBAAAA", b""),  # not in the checksum
    ("timestamp", {"location": "UTC", "value": "2024-03-01 08:00:00"}, lp(b"2024-03-01 08:00:00")),
]


@pytest.mark.parametrize(
    ("mysql_type", "value", "encoded"),
    SIMPLE_TYPE_VECTORS,
    ids=[v[0] + "-" + str(v[1])[:20] for v in SIMPLE_TYPE_VECTORS],
)
def test_simple_column_bytes_follow_the_rule(mysql_type: str, value: Any, encoded: bytes) -> None:
    schema = table_schema(("id", "int"), ("c", mysql_type), ("z", "varchar"))
    expected = crc(u64(1), encoded, lp(b"end"))
    message = dml("INSERT", current=expected, data={"id": "1", "c": value, "z": "end"})
    (result,) = verify_simple(message, schema)
    assert result.verdict is ChecksumVerdict.OK, result.detail
    (flipped,) = verify_simple(dml("INSERT", current=expected ^ 4, data=message["data"]), schema)
    assert flipped.verdict is ChecksumVerdict.CHECKSUM_MISMATCH
    assert flipped.computed == expected


def test_example_c_as_bytes_dict_and_text() -> None:
    for message in (EXAMPLE_C_MESSAGE, EXAMPLE_C_MESSAGE.encode(), json.loads(EXAMPLE_C_MESSAGE)):
        (result,) = verify_simple(message, EXAMPLE_C_SCHEMA)
        assert result.verdict is ChecksumVerdict.OK


# Which image is verified against which checksum ---------------------------------------------------


def test_update_verifies_data_against_current_and_old_against_previous() -> None:
    current = orders_checksum("1", "new", None)
    previous = orders_checksum("1", "old", "n")
    data = {"id": "1", "name": "new", "note": None}
    old = {"id": "1", "name": "old", "note": "n"}
    results = verify_simple(dml("UPDATE", current=current, previous=previous, data=data, old=old), ORDERS)
    assert [r.image for r in results] == [RowImage.CURRENT, RowImage.PREVIOUS]
    assert [r.verdict for r in results] == [ChecksumVerdict.OK, ChecksumVerdict.OK]
    assert [r.expected for r in results] == [current, previous]
    # Swapped images fail both.
    swapped = verify_simple(dml("UPDATE", current=current, previous=previous, data=old, old=data), ORDERS)
    assert [r.verdict for r in swapped] == [ChecksumVerdict.CHECKSUM_MISMATCH] * 2
    # A changed old row fails the previous image only.
    changed = verify_simple(
        dml("UPDATE", current=current, previous=previous, data=data, old={**old, "note": "m"}), ORDERS
    )
    assert [r.verdict for r in changed] == [ChecksumVerdict.OK, ChecksumVerdict.CHECKSUM_MISMATCH]
    assert "'old'" in changed[1].detail


def test_delete_verifies_the_full_old_row_against_previous() -> None:
    previous = orders_checksum("9", "gone", "bye")
    (result,) = verify_simple(dml("DELETE", previous=previous, old={"id": "9", "name": "gone", "note": "bye"}), ORDERS)
    assert result.verdict is ChecksumVerdict.OK
    assert result.image is RowImage.PREVIOUS
    assert dict(result.key) == {"id": "9"}


def test_insert_verifies_data_against_current_only() -> None:
    current = orders_checksum("2", "a", None)
    results = verify_simple(dml("INSERT", current=current, previous=12345, data={"id": "2", "name": "a"}), ORDERS)
    assert len(results) == 1
    assert results[0].verdict is ChecksumVerdict.OK
    assert dict(results[0].key) == {"id": "2"}


def test_zero_image_checksum_is_skipped_per_image() -> None:
    current = orders_checksum("1", "new", None)
    data = {"id": "1", "name": "new"}
    results = verify_simple(dml("UPDATE", current=current, previous=0, data=data, old={"id": "1", "name": "x"}), ORDERS)
    assert [r.verdict for r in results] == [ChecksumVerdict.OK, ChecksumVerdict.SKIPPED]
    assert results[1].skip_reason is SkipReason.CHECKSUM_ZERO


def test_absent_checksum_is_skipped_for_every_image() -> None:
    message = dml("UPDATE", data={"id": "1", "name": "a"}, old={"id": "1", "name": "b"})
    del message["checksum"]
    results = verify_simple(message, ORDERS)
    assert [r.skip_reason for r in results] == [SkipReason.CHECKSUM_ABSENT] * 2
    assert all(r.verdict is ChecksumVerdict.SKIPPED and not r.is_fault for r in results)


def test_corrupted_flag_wins_for_every_image() -> None:
    current = orders_checksum("1", "a", None)
    message = dml("UPDATE", current=current, previous=0, corrupted=True, data={"id": "1", "name": "a"}, old={"id": "1"})
    results = verify_simple(message, ORDERS)
    assert [r.verdict for r in results] == [ChecksumVerdict.CORRUPTED_FLAG] * 2
    assert results[0].computed == current  # reported, though it matches
    # The flag needs no schema.
    assert [r.verdict for r in verify_simple(message, None)] == [ChecksumVerdict.CORRUPTED_FLAG] * 2


def test_handle_key_only_and_claim_check_are_skipped() -> None:
    data = {"id": "1"}
    (key_only,) = verify_simple(dml("INSERT", current=77, handleKeyOnly=True, data=data), ORDERS)
    assert key_only.skip_reason is SkipReason.HANDLE_KEY_ONLY
    (claim,) = verify_simple(dml("DELETE", previous=77, claimCheckLocation="s3://b/k", old=data), ORDERS)
    assert claim.skip_reason is SkipReason.CLAIM_CHECK
    assert "s3://b/k" in claim.detail


def test_absent_columns_are_virtual_and_not_hashed() -> None:
    schema = table_schema(("id", "int"), ("v", "varchar"), ("s", "varchar"))
    expected = crc(u64(1), lp(b"x"))
    (result,) = verify_simple(dml("INSERT", current=expected, data={"id": "1", "s": "x"}), schema)
    assert result.verdict is ChecksumVerdict.OK
    # NULL is the same as absent; "" is not.
    (null,) = verify_simple(dml("INSERT", current=expected, data={"id": "1", "v": None, "s": "x"}), schema)
    assert null.verdict is ChecksumVerdict.OK
    (empty,) = verify_simple(dml("INSERT", current=expected, data={"id": "1", "v": "", "s": "x"}), schema)
    assert empty.verdict is ChecksumVerdict.CHECKSUM_MISMATCH


def test_order_is_the_table_schema_order() -> None:
    schema = table_schema(("b", "int"), ("a", "int"))
    (result,) = verify_simple(dml("INSERT", current=crc(u64(2), u64(1)), data={"a": "1", "b": "2"}), schema)
    assert result.verdict is ChecksumVerdict.OK


def test_key_is_the_primary_key_else_a_unique_not_null_index() -> None:
    unique = [
        {"name": "u_nullable", "unique": True, "primary": False, "nullable": True, "columns": ["name"]},
        {"name": "u_code", "unique": True, "primary": False, "nullable": False, "columns": ["code", "id"]},
    ]
    schema = table_schema(("id", "int"), ("name", "varchar"), ("code", "varchar"), indexes=unique)
    data = {"id": "3", "name": "n", "code": "c"}
    (result,) = verify_simple(dml("INSERT", current=crc(u64(3), lp(b"n"), lp(b"c")), data=data), schema)
    assert result.verdict is ChecksumVerdict.OK
    assert dict(result.key) == {"code": "c", "id": "3"}


def test_messages_that_are_not_dml_give_no_result() -> None:
    assert verify_simple({"version": 1, "type": "WATERMARK", "commitTs": 1}, ORDERS) == ()
    assert verify_simple({"version": 1, "type": "BOOTSTRAP", "tableSchema": ORDERS}, None) == ()


def test_unknown_schema_is_skipped() -> None:
    (result,) = verify_simple(dml("INSERT", current=5, data={"id": "1"}), None)
    assert result.skip_reason is SkipReason.SCHEMA_UNKNOWN
    assert "shop.orders" in result.detail


# Malformed ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (b"\xff\xfe not json", "not a JSON message"),
        ("{", "not a JSON message"),
        ("[1, 2]", "message is a list"),
        ({"payload": 5}, "payload is not a record"),
        (dml("INSERT", checksum=[1], data={"id": "1"}), "checksum is not an object"),
        (dml("INSERT", checksum={"corrupted": "no", "current": 5}, data={"id": "1"}), "checksum.corrupted is 'no'"),
        (dml("INSERT", checksum={"corrupted": False, "current": "x"}, data={"id": "1"}), "checksum.current"),
        (dml("INSERT", checksum={"corrupted": False, "current": -1}, data={"id": "1"}), "outside the uint32 range"),
        (dml("INSERT", checksum={"corrupted": False, "current": 2**32}, data={"id": "1"}), "outside the uint32 range"),
        (dml("INSERT", checksum={"corrupted": False, "current": 1.5}, data={"id": "1"}), "not a decimal uint32"),
        (dml("INSERT", current=5), "no 'data' object"),
        (dml("INSERT", current=5, data=["1"]), "'data' is not an object"),
        (dml("DELETE", previous=5, data={"id": "1"}), "no 'old' object"),
        (dml("INSERT", current=5, data={"id": "1.5"}), "data.id (bigint): cannot hash '1.5'"),
        (dml("INSERT", current=5, data={"id": " 1"}), "not a base-10 integer"),
        (dml("INSERT", current=5, data={"id": "18446744073709551616"}), "outside the 64-bit range"),
        (dml("INSERT", current=5, data={"id": 1.0}), "data.id (bigint)"),
        (dml("INSERT", current=5, data={"id": "1", "name": 7}), "data.name (varchar)"),
        (dml("INSERT", current=5, schemaVersion=1, data={"id": "1"}), "schemaVersion 1"),
    ],
)
def test_malformed_messages_name_the_problem(message: Any, fragment: str) -> None:
    results = verify_simple(message, ORDERS)
    assert results, message
    for result in results:
        assert result.verdict is ChecksumVerdict.MALFORMED
        assert fragment in result.detail, result.detail


@pytest.mark.parametrize(
    ("mysql_type", "value", "fragment"),
    [
        ("varbinary", "AP8", "data.c (varbinary)"),  # bad padding
        ("blob", "A*8=", "data.c (blob)"),
        ("float", "1e39", "data.c (float)"),  # beyond binary32
        ("float", "1_0", "not a number"),
        ("double", "x", "data.c (double)"),
        ("vector", "[1,", "not a vector text"),
        ("enum", "red", "not a base-10 integer"),
    ],
)
def test_malformed_values_name_the_column(mysql_type: str, value: str, fragment: str) -> None:
    schema = table_schema(("c", mysql_type))
    (result,) = verify_simple(dml("INSERT", current=5, data={"c": value}), schema)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert fragment in result.detail, result.detail


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        (table_schema(("c", "point")), "unsupported mysqlType 'point'"),
        ({**ORDERS, "columns": [{"name": "c"}]}, "column 0 has no name or dataType.mysqlType"),
        ({**ORDERS, "columns": "c"}, "no list of columns"),
    ],
)
def test_schemas_that_cannot_be_followed_are_malformed(schema: dict[str, Any], fragment: str) -> None:
    (result,) = verify_simple(dml("INSERT", current=5, data={"c": "1"}), schema)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert fragment in result.detail


# Following a topic: schemas from BOOTSTRAP and DDL, DMLs held until theirs arrives ---------------


def bootstrap(schema: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "type": "BOOTSTRAP", "buildTs": 1, "tableSchema": schema}


def test_feed_holds_dml_until_its_schema_arrives() -> None:
    verifier = SimpleChecksumVerifier()
    insert = dml("INSERT", current=orders_checksum("1", "a", None), data={"id": "1", "name": "a"})
    delete = dml("DELETE", previous=orders_checksum("1", "a", None), old={"id": "1", "name": "a"})
    assert verifier.feed(json.dumps(insert)) == []
    assert verifier.feed(delete) == []
    assert verifier.pending == 2
    assert verifier.feed({"version": 1, "type": "WATERMARK", "commitTs": 2}) == []
    released = verifier.feed(bootstrap(ORDERS))
    assert [(r.verdict, r.image) for r in released] == [
        (ChecksumVerdict.OK, RowImage.CURRENT),
        (ChecksumVerdict.OK, RowImage.PREVIOUS),
    ]
    assert verifier.pending == 0
    # Once known, DMLs are verified at once.
    (again,) = verifier.feed(insert)
    assert again.verdict is ChecksumVerdict.OK


def test_feed_keys_schemas_by_version_and_ddl_releases_its_own() -> None:
    verifier = SimpleChecksumVerifier()
    verifier.feed(bootstrap(ORDERS))
    newer = {**table_schema(("id", "bigint"), ("name", "varchar"), ("note", "text"), ("qty", "int")), "version": 7}
    message = dml(
        "INSERT", current=crc(u64(1), lp(b"a"), u64(2)), schemaVersion=7, data={"id": "1", "name": "a", "qty": "2"}
    )
    assert verifier.feed(message) == []  # schema version 7 not known yet
    ddl = {
        "version": 1,
        "type": "ALTER",
        "sql": "ALTER TABLE ...",
        "commitTs": 3,
        "tableSchema": newer,
        "preTableSchema": ORDERS,
    }
    (released,) = verifier.feed(ddl)
    assert released.verdict is ChecksumVerdict.OK
    # Version 5's schema is still there for DMLs still in flight.
    (old_version,) = verifier.feed(
        dml("INSERT", current=orders_checksum("1", "a", None), data={"id": "1", "name": "a"})
    )
    assert old_version.verdict is ChecksumVerdict.OK


def test_feed_does_not_hold_what_needs_no_schema() -> None:
    verifier = SimpleChecksumVerifier()
    unchecked = dml("INSERT", data={"id": "1"})
    del unchecked["checksum"]
    (absent,) = verifier.feed(unchecked)
    assert absent.skip_reason is SkipReason.CHECKSUM_ABSENT
    (corrupted,) = verifier.feed(dml("INSERT", current=5, corrupted=True, data={"id": "1"}))
    assert corrupted.verdict is ChecksumVerdict.CORRUPTED_FLAG
    (zero,) = verifier.feed(dml("INSERT", current=0, data={"id": "1"}))
    assert zero.skip_reason is SkipReason.CHECKSUM_ZERO
    assert verifier.pending == 0


def test_feed_gives_up_the_oldest_beyond_max_pending_and_flush_gives_up_the_rest() -> None:
    verifier = SimpleChecksumVerifier(max_pending=2)
    messages = [dml("INSERT", current=10 + n, data={"id": str(n)}) for n in range(3)]
    assert verifier.feed(messages[0]) == []
    assert verifier.feed(messages[1]) == []
    (given_up,) = verifier.feed(messages[2])
    assert given_up.skip_reason is SkipReason.SCHEMA_UNKNOWN and given_up.expected == 10
    flushed = verifier.flush()
    assert [r.expected for r in flushed] == [11, 12]
    assert all(r.skip_reason is SkipReason.SCHEMA_UNKNOWN for r in flushed)
    assert verifier.pending == 0


def test_feed_reports_malformed_messages_and_schemas() -> None:
    verifier = SimpleChecksumVerifier()
    (bad,) = verifier.feed(b"not json")
    assert bad.verdict is ChecksumVerdict.MALFORMED
    (anonymous,) = verifier.feed({"version": 1, "type": "BOOTSTRAP", "tableSchema": {"columns": []}})
    assert anonymous.verdict is ChecksumVerdict.MALFORMED and "no database, table or version" in anonymous.detail
    (not_object,) = verifier.feed({"version": 1, "type": "CREATE", "tableSchema": "x"})
    assert not_object.verdict is ChecksumVerdict.MALFORMED
    # A schema kdiv cannot follow is recorded: its DMLs are MALFORMED, not held forever.
    verifier.feed(bootstrap(table_schema(("c", "point"))))
    (dml_result,) = verifier.feed(dml("INSERT", current=5, data={"c": "1"}))
    assert dml_result.verdict is ChecksumVerdict.MALFORMED and "point" in dml_result.detail


# The Avro encoding of the Simple protocol --------------------------------------------------------

_NS = "com.pingcap.simple.avro"
_COLUMN_VALUE: list[Any] = [
    "null",
    "long",
    "float",
    "double",
    "string",
    "bytes",
    {
        "type": "record",
        "name": "Timestamp",
        "namespace": _NS,
        "fields": [{"name": "location", "type": "string"}, {"name": "value", "type": "string"}],
    },
    {"type": "record", "name": "UnsignedBigint", "namespace": _NS, "fields": [{"name": "value", "type": "long"}]},
]
# The second map names the records the first defined.
_COLUMN_VALUE_AGAIN: list[Any] = _COLUMN_VALUE[:6] + [f"{_NS}.Timestamp", f"{_NS}.UnsignedBigint"]
SIMPLE_AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Message",
    "namespace": _NS,
    "fields": [
        {
            "name": "payload",
            "type": [
                {
                    "type": "record",
                    "name": "Watermark",
                    "namespace": _NS,
                    "fields": [
                        {"name": "version", "type": "int"},
                        {"name": "type", "type": "string"},
                        {"name": "commitTs", "type": "long"},
                        {"name": "buildTs", "type": "long"},
                    ],
                },
                {
                    "type": "record",
                    "name": "DML",
                    "namespace": _NS,
                    "fields": [
                        {"name": "version", "type": "int"},
                        {"name": "database", "type": "string"},
                        {"name": "table", "type": "string"},
                        {"name": "tableID", "type": "long"},
                        {
                            "name": "type",
                            "type": {"type": "enum", "name": "DMLType", "symbols": ["INSERT", "UPDATE", "DELETE"]},
                        },
                        {"name": "commitTs", "type": "long"},
                        {"name": "buildTs", "type": "long"},
                        {"name": "schemaVersion", "type": "long"},
                        {"name": "claimCheckLocation", "type": ["null", "string"], "default": None},
                        {"name": "handleKeyOnly", "type": ["null", "boolean"], "default": None},
                        {
                            "name": "checksum",
                            "type": [
                                "null",
                                {
                                    "type": "record",
                                    "name": "Checksum",
                                    "fields": [
                                        {"name": "version", "type": "int"},
                                        {"name": "corrupted", "type": "boolean"},
                                        {"name": "current", "type": "long"},
                                        {"name": "previous", "type": "long"},
                                    ],
                                },
                            ],
                            "default": None,
                        },
                        {"name": "data", "type": ["null", {"type": "map", "values": _COLUMN_VALUE}], "default": None},
                        {
                            "name": "old",
                            "type": ["null", {"type": "map", "values": _COLUMN_VALUE_AGAIN}],
                            "default": None,
                        },
                    ],
                },
            ],
        }
    ],
}
AVRO_TYPES_SCHEMA = table_schema(
    ("i", "int"),
    ("bu", "bigint"),
    ("f", "float"),
    ("d", "double"),
    ("s", "varchar"),
    ("vb", "varbinary"),
    ("ts", "timestamp"),
    ("e", "enum"),
    ("st", "set"),
    ("bit", "bit"),
    ("n", "text"),
)


def avro_decoded(message: dict[str, Any]) -> dict[str, Any]:
    parsed = fastavro.parse_schema(SIMPLE_AVRO_SCHEMA)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, {"payload": message})
    decoded = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), parsed, None)
    assert isinstance(decoded, dict)
    return decoded


def test_avro_encoded_simple_message_verifies() -> None:
    data = {
        "i": -5,
        "bu": {"value": -1},  # UnsignedBigint: 2^64 - 1 as a two's-complement long
        "f": ("float", 3.14),  # Avro float
        "d": ("double", 0.1),
        "s": "héllo",
        "vb": b"\x00\xff",  # binary strings are bytes, not base64
        "ts": {"location": "Asia/Shanghai", "value": "2024-03-01 08:00:00.500"},
        "e": 2,
        "st": 5,
        "bit": 2748,
        "n": None,
    }
    expected = crc(
        u64(-5),
        b"\xff" * 8,
        bytes.fromhex("00 00 00 60 b8 1e 09 40"),
        f64(0.1),
        lp("héllo".encode()),
        lp(b"\x00\xff"),
        lp(b"2024-03-01 00:00:00.500"),
        u64(2),
        u64(5),
        u64(2748),
    )
    message = dml("UPDATE", current=expected, previous=expected, data=data, old=dict(data, i=-6))
    decoded = avro_decoded(message)
    assert "payload" in decoded and decoded["payload"]["data"]["bu"] == {"value": -1}
    current, previous = verify_simple(decoded, AVRO_TYPES_SCHEMA)
    assert current.verdict is ChecksumVerdict.OK, current.detail
    assert previous.verdict is ChecksumVerdict.CHECKSUM_MISMATCH  # old.i differs
    # The unwrapped payload and fastavro's (name, record) form are read the same way.
    assert verify_simple(decoded["payload"], AVRO_TYPES_SCHEMA)[0].verdict is ChecksumVerdict.OK
    named = {"payload": (f"{_NS}.DML", decoded["payload"])}
    assert verify_simple(named, AVRO_TYPES_SCHEMA)[0].verdict is ChecksumVerdict.OK


def test_avro_encoded_watermark_gives_no_result() -> None:
    decoded = avro_decoded({"version": 1, "type": "WATERMARK", "commitTs": 5, "buildTs": 6})
    assert verify_simple(decoded, AVRO_TYPES_SCHEMA) == ()


# Properties --------------------------------------------------------------------------------------

PROPERTY_SCHEMA = table_schema(
    ("id", "bigint"), ("qty", "int"), ("price", "double"), ("name", "varchar"), ("raw", "blob")
)


@st.composite
def rows(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    ident = draw(st.integers(-(2**63), 2**64 - 1))
    qty = draw(st.none() | st.integers(-(2**31), 2**31 - 1))
    price = draw(st.floats(allow_nan=False, allow_infinity=False))
    name = draw(st.none() | st.text(max_size=10))
    raw = draw(st.binary(max_size=10))
    data = {
        "id": str(ident),
        "qty": None if qty is None else str(qty),
        "price": repr(price),
        "name": name,
        "raw": base64.b64encode(raw).decode(),
    }
    parts = [
        u64(ident),
        b"" if qty is None else u64(qty),
        struct.pack("<d", price),
        b"" if name is None else lp(name.encode()),
        lp(raw),
    ]
    return data, crc(*parts)


@settings(max_examples=150, deadline=None)
@given(rows(), st.sampled_from(["id", "qty", "price", "name", "raw"]))
def test_every_simple_row_verifies_and_a_changed_value_is_a_mismatch(
    case: tuple[dict[str, Any], int], column: str
) -> None:
    data, expected = case
    (result,) = verify_simple(json.dumps(dml("INSERT", current=expected, data=data)), PROPERTY_SCHEMA)
    if expected == 0:
        assert result.skip_reason is SkipReason.CHECKSUM_ZERO
        return
    assert result.verdict is ChecksumVerdict.OK, result.detail
    value = data[column]
    if column in ("id", "qty"):
        changed = "0" if value is None else str(int(value) + 1 if int(value) < 2**63 - 1 else int(value) - 1)
    elif column == "price":
        changed = repr(float(value) + 1.0 if abs(float(value)) < 1e6 else float(value) / 2)
    elif column == "name":
        changed = "" if value is None else value + "!"
    else:
        changed = base64.b64encode(base64.b64decode(value) + b"\x01").decode()
    (mismatch,) = verify_simple(dml("INSERT", current=expected, data={**data, column: changed}), PROPERTY_SCHEMA)
    assert mismatch.verdict is ChecksumVerdict.CHECKSUM_MISMATCH, (column, value, changed)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
dml_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["INSERT", "UPDATE", "DELETE", "BOOTSTRAP", "X"])},
    optional={
        "database": json_values,
        "table": json_values,
        "schemaVersion": json_values,
        "checksum": json_values
        | st.fixed_dictionaries({"corrupted": json_values, "current": json_values, "previous": json_values}),
        "data": json_values | st.dictionaries(st.sampled_from(["id", "qty", "price", "name", "raw"]), json_values),
        "old": json_values,
        "handleKeyOnly": json_values,
        "claimCheckLocation": json_values,
        "tableSchema": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(dml_like | json_values)
def test_arbitrary_messages_give_verdicts_never_an_exception(message: Any) -> None:
    for result in verify_simple(message if isinstance(message, dict) else json.dumps(message), PROPERTY_SCHEMA):
        assert isinstance(result.verdict, ChecksumVerdict)
    verifier = SimpleChecksumVerifier(max_pending=3)
    for result in verifier.feed(message if isinstance(message, dict) else json.dumps(message)) + verifier.flush():
        assert isinstance(result.verdict, ChecksumVerdict)


def test_odd_message_shapes_give_verdicts_not_exceptions() -> None:
    assert verify_simple({"type": ["INSERT"]}, ORDERS) == ()
    assert SimpleChecksumVerifier().feed({"type": {"k": 1}}) == []
    (deep,) = verify_simple("[" * 100_000 + "]" * 100_000, ORDERS)
    assert deep.verdict is ChecksumVerdict.MALFORMED and "not a JSON message" in deep.detail
    (huge,) = verify_simple(dml("INSERT", checksum={"corrupted": False, "current": "9" * 5000}, data={}), ORDERS)
    assert huge.verdict is ChecksumVerdict.MALFORMED


def test_corrupted_flag_wins_over_an_unreadable_checksum_as_in_avro() -> None:
    message = dml("INSERT", checksum={"corrupted": True, "current": "garbage"}, data={"id": "1"})
    (result,) = verify_simple(message, ORDERS)
    assert result.verdict is ChecksumVerdict.CORRUPTED_FLAG
    assert result.expected is None
