"""`kdiv check --ticdc` over recorded changefeeds: Simple-protocol lines built here (through the
CLI) and the demo source's Avro messages with a registry stand-in (through kdiv.offline.changefeed)."""

from __future__ import annotations

import io
import json
from collections.abc import Collection
from typing import Any

import pytest
from click.testing import CliRunner

from kdiv.cli import main
from kdiv.dev.changefeed import KEY_SCHEMA, VALUE_SCHEMA, ChangefeedMessages
from kdiv.div.record import ConsumedRecord
from kdiv.offline.changefeed import SchemaUnavailable, check_changefeed
from kdiv.offline.jsonl import record_to_line
from kdiv.registry.client import RegistryUnavailable
from kdiv.ticdc.checksum import ChecksumVerdict, SkipReason
from tests.unit.test_ticdc_checksum import EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA
from tests.unit.test_ticdc_simple import ORDERS, bootstrap, dml, orders_checksum

TOPIC = "cdc"


def line(partition: int, offset: int, value: bytes | None, key: bytes | None = None) -> str:
    return record_to_line(ConsumedRecord(TOPIC, partition, offset, 1_000 + offset, key, value)) + "\n"


def simple(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def insert(row_id: str, name: str, *, checksum_of: str | None = None, **options: Any) -> bytes:
    """An INSERT whose checksum is of `checksum_of` as the name (the row changed after it was taken)."""
    checksum = orders_checksum(row_id, checksum_of if checksum_of is not None else name, None)
    return simple(dml("INSERT", current=options.pop("current", checksum), data={"id": row_id, "name": name}, **options))


# Partition 0 learns its schema first; partition 1's first DMLs wait for its BOOTSTRAP; partition
# 2 never gets one. (partition, offset, value), interleaved as a dump of several partitions is.
SIMPLE_RECORDS: list[tuple[int, int, bytes]] = [
    (1, 0, insert("10", "ten", checksum_of="TEN")),
    (0, 0, simple(bootstrap(ORDERS))),
    (0, 1, insert("1", "one")),
    (0, 2, insert("2", "two", checksum_of="owt")),
    (
        0,
        3,
        simple(
            dml(
                "UPDATE",
                current=orders_checksum("1", "uno", None),
                previous=orders_checksum("1", "one", None),
                data={"id": "1", "name": "uno"},
                old={"id": "1", "name": "eins"},  # not the row the checksum was taken of
            )
        ),
    ),
    (2, 0, insert("20", "twenty", checksum_of="XX")),
    (1, 1, insert("11", "eleven")),
    (1, 2, simple(bootstrap(ORDERS))),
    (1, 3, b"not a TiCDC message"),
    (0, 4, insert("3", "three", corrupted=True)),
    (0, 5, simple(dml("DELETE", previous=orders_checksum("2", "two", None), old={"id": "2", "name": "two"}))),
    (0, 6, insert("4", "four", current=0)),
    (2, 1, insert("21", "twenty-one")),
]
# (partition, offset, verdict, image) of every fault planted above.
SIMPLE_FAULTS = {
    (0, 2, "CHECKSUM_MISMATCH", "current"),
    (0, 3, "CHECKSUM_MISMATCH", "previous"),
    (0, 4, "CORRUPTED_FLAG", "current"),
    (1, 0, "CHECKSUM_MISMATCH", "current"),
    (1, 3, "MALFORMED", "current"),
}


@pytest.fixture
def simple_dump(tmp_path):
    path = tmp_path / "cdc.jsonl"
    path.write_text("".join(line(p, o, v) for p, o, v in SIMPLE_RECORDS))
    return path


def run_check(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(main, ["check", *args], env=env)
    faults = [json.loads(text) for text in result.stdout.splitlines()]
    return result.exit_code, faults, result.stderr


def test_simple_changefeed_reports_exactly_the_planted_faults_and_counts_every_row(simple_dump):
    code, faults, err = run_check("--ticdc", "simple", str(simple_dump))

    assert code == 1, err
    assert {(f["partition"], f["offset"], f["verdict"], f["row_image"]) for f in faults} == SIMPLE_FAULTS
    assert len(faults) == len(SIMPLE_FAULTS)
    by_place = {(f["partition"], f["offset"]): f for f in faults}
    mismatch = by_place[(0, 2)]
    assert mismatch["topic"] == TOPIC and mismatch["record_timestamp_ms"] == 1_002
    assert mismatch["table"] == "shop.orders" and mismatch["row_key"] == {"id": "2"}
    assert mismatch["commit_ts"] == 449872367820832769
    assert mismatch["expected_checksum"] == orders_checksum("2", "owt", None)
    assert mismatch["computed_checksum"] == orders_checksum("2", "two", None)
    assert mismatch["detail"].startswith(
        f"shop.orders, current image: row checksum {mismatch['expected_checksum']} does not match "
        f"{mismatch['computed_checksum']} computed from the columns"
    )
    # Held until partition 1's BOOTSTRAP, then verified under its own offset.
    assert by_place[(1, 0)]["row_key"] == {"id": "10"} and by_place[(1, 0)]["record_timestamp_ms"] == 1_000
    assert by_place[(1, 3)]["detail"].startswith("unknown table, current image: the message cannot be verified")
    # Partition 2's DMLs never got their schema: given up at the end, counted, not faults.
    assert f"{len(SIMPLE_RECORDS)} records," in err
    assert "SKIPPED 3 (schema unknown 2, checksum 0 1)" in err
    assert "OK 4" in err and "CHECKSUM_MISMATCH 3" in err and "CORRUPTED_FLAG 1" in err and "MALFORMED 1" in err
    assert "5 faults; 0 bad input lines" in err


def test_simple_changefeed_from_stdin_without_faults_exits_0():
    clean = [(0, 0, simple(bootstrap(ORDERS))), (0, 1, insert("1", "one")), (0, 2, insert("2", "two"))]
    result = CliRunner().invoke(main, ["check", "--ticdc", "simple"], input="".join(line(*r) for r in clean))

    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "3 records, 2 rows (OK 2); 0 faults; 0 bad input lines" in result.stderr


def test_bad_lines_are_named_by_file_and_line_and_the_other_lines_still_checked(tmp_path):
    path = tmp_path / "damaged.jsonl"
    good = [line(p, o, v) for p, o, v in SIMPLE_RECORDS[1:4]]  # BOOTSTRAP, OK, mismatch at 0/2
    with path.open("wb") as out:
        out.write(good[0].encode())
        out.write(b'{"topic": "cdc", "partition": 0\n')
        out.write(good[1].encode())
        out.write(b'{"topic":"cdc","partition":0,"offset":9,"timestamp":1,"value":"%%%"}\n')
        out.write(b"\xff\xfe\n")
        out.write(good[2].encode())

    code, faults, err = run_check("--ticdc", "simple", str(path))

    assert code == 2
    assert [(f["partition"], f["offset"], f["verdict"]) for f in faults] == [(0, 2, "CHECKSUM_MISMATCH")]
    assert f"{path}:2: not JSON" in err
    assert f"{path}:4: value is not valid base64" in err
    assert f"{path}:5: not UTF-8" in err
    assert "3 bad input lines" in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--ticdc", "simple", "--phase", "push", "--seq-window", "4"], "--phase, --seq-window: DIV options"),
        (["--registry-url", "http://127.0.0.1:8081"], "--registry-url: only with --ticdc"),
        (["--timestamp-mode", "utc"], "--timestamp-mode: only with --ticdc"),
        (["--ticdc", "simple", "--time-zone", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["--ticdc", "simple", "--timestamp-mode", "local"], "timestamp_mode must be one of utc, as_sent"),
        (["--ticdc", "avro", "--registry-url", "none"], "its URL is none"),
        (["--ticdc", "avro", "--registry-url", "ftp://registry"], "is not an http(s):// URL"),
    ],
)
def test_options_of_the_other_check_and_bad_settings_are_usage_errors(simple_dump, args, named):
    code, faults, err = run_check(*args, str(simple_dump))
    assert code == 2
    assert faults == []
    assert named in err


def test_the_time_stamp_mode_and_zone_come_from_the_worker_variables_which_a_div_check_ignores(tmp_path):
    path = tmp_path / "example-c.jsonl"
    path.write_text(line(0, 0, simple(bootstrap(EXAMPLE_C_SCHEMA))) + line(0, 1, EXAMPLE_C_MESSAGE.encode()))

    assert run_check("--ticdc", "simple", str(path))[0] == 0
    # Example C hashed as TiCDC before v7.1.4 did: its TIMESTAMP as sent, not in UTC.
    for options, env in (
        (["--timestamp-mode", "as_sent"], {}),
        ([], {"KDIV_TICDC_TIMESTAMP_MODE": "as_sent"}),
    ):
        code, faults, err = run_check("--ticdc", "simple", *options, str(path), env=env)
        assert (code, [(f["offset"], f["verdict"]) for f in faults]) == (1, [(1, "CHECKSUM_MISMATCH")]), err
    code, _, err = run_check("--ticdc", "simple", str(path), env={"KDIV_TICDC_TIME_ZONE": "Mars/Olympus"})
    assert code == 2 and "unknown time zone 'Mars/Olympus'" in err
    # A DIV check ignores the variable; with no div header in the input it says so (exit 2).
    code, verdicts, err = run_check(str(path), env={"KDIV_TICDC_TIME_ZONE": "Mars/Olympus"})
    assert [v["verdict"] for v in verdicts] == ["UNTRACKED", "UNTRACKED"], err
    assert code == 2 and "Mars" not in err and "check them with --ticdc simple" in err, err


def test_the_choices_and_defaults_are_the_workers():
    from kdiv import cli
    from kdiv.config.settings import TICDC_PROTOCOLS, ChangefeedSettings

    assert TICDC_PROTOCOLS == cli.TICDC_PROTOCOLS
    worker = ChangefeedSettings()
    assert worker.time_zone == cli.TICDC_TIME_ZONE
    assert worker.timestamp_mode == cli.TICDC_TIMESTAMP_MODE


# Avro, with a stand-in for the registry -----------------------------------------------------------

KEY_ID, VALUE_ID = 11, 12
OTHER_KEY_ID, OTHER_VALUE_ID = 21, 22
AVRO_FAULTS = {(0, 3): "mismatch", (0, 17): "flag", (1, 0): "flag", (1, 9): "mismatch"}


def avro_dump(
    faults: dict[tuple[int, int], str] = AVRO_FAULTS, ids: dict[int, tuple[int, int]] | None = None
) -> tuple[bytes, int]:
    """Two partitions of 20 demo Avro messages each with `faults` planted, interleaved; and the deletes."""
    ids = ids or {0: (KEY_ID, VALUE_ID), 1: (KEY_ID, VALUE_ID)}
    sources = {p: ChangefeedMessages(*ids[p], seed=p, delete_rate=0.2) for p in (0, 1)}
    lines, deletes = [], 0
    for offset in range(20):
        for partition, messages in sources.items():
            message = messages.next(faults.get((partition, offset)))
            deletes += message.value is None
            lines.append(line(partition, offset, message.value, message.key))
    return "".join(lines).encode(), deletes


class Registry:
    """Schema texts by id; the ids in `down` cannot be read (the registry stopped answering)."""

    def __init__(self, known: dict[int, dict], down: Collection[int] = ()) -> None:
        self.known = {schema_id: json.dumps(schema) for schema_id, schema in known.items()}
        self.down = down
        self.asked: list[int] = []

    def __call__(self, schema_id: int) -> str | None:
        self.asked.append(schema_id)
        if schema_id in self.down:
            raise RegistryUnavailable(f"http://registry: cannot read schema id {schema_id}: ConnectError")
        return self.known.get(schema_id)


def check(data: bytes, registry: Registry) -> tuple[Any, list[dict], list[str]]:
    out = io.StringIO()
    reports: list[str] = []
    counts = check_changefeed(
        io.BytesIO(data).readlines(), "cdc.jsonl", "avro", out, schemas=registry, report=reports.append
    )
    return counts, [json.loads(text) for text in out.getvalue().splitlines()], reports


def test_avro_changefeed_faults_are_exactly_the_planted_ones_each_schema_asked_once():
    data, deletes = avro_dump()
    registry = Registry({KEY_ID: KEY_SCHEMA, VALUE_ID: VALUE_SCHEMA})

    counts, faults, reports = check(data, registry)

    assert deletes > 0
    verdicts = {"mismatch": "CHECKSUM_MISMATCH", "flag": "CORRUPTED_FLAG"}
    assert {(f["partition"], f["offset"]): f["verdict"] for f in faults} == {
        at: verdicts[kind] for at, kind in AVRO_FAULTS.items()
    }
    assert sorted(registry.asked) == [KEY_ID, VALUE_ID]
    assert reports == []
    assert counts.records == 40 and counts.faults == len(AVRO_FAULTS) and counts.exit_status == 1
    assert counts.skipped == {SkipReason.TOMBSTONE: deletes}
    assert counts.rows[ChecksumVerdict.OK] == 40 - deletes - len(AVRO_FAULTS)
    assert all(f["table"] == "shop.orders" and f["row_key"] == {"id": f["offset"]} for f in faults)


def test_a_schema_id_unknown_to_the_registry_makes_malformed_rows_and_fails_the_check():
    data, deletes = avro_dump()
    registry = Registry({KEY_ID: KEY_SCHEMA})

    counts, faults, reports = check(data, registry)

    # The worker's verdict for every row that has a value, and a failed check naming the id once.
    assert len(faults) == 40 - deletes
    assert {f["verdict"] for f in faults} == {"MALFORMED"}
    assert all(f"schema id {VALUE_ID} is unknown to the registry" in f["detail"] for f in faults)
    records = [json.loads(text) for text in data.splitlines()]
    lineno, first = next((n, r) for n, r in enumerate(records, 1) if r["value"] is not None)
    where = f"cdc.jsonl:{lineno}: cdc/{first['partition']}@{first['offset']}"
    assert reports == [f"{where}: schema id {VALUE_ID} is unknown to the registry"]
    assert counts.unknown_schemas == {VALUE_ID: where}
    assert counts.exit_status == 2
    assert f"schema ids unknown to the registry: {VALUE_ID}" in counts.summary()


def test_a_registry_that_cannot_answer_stops_the_check_where_a_record_needs_it():
    data, _ = avro_dump({(0, 0): "mismatch"}, ids={0: (KEY_ID, VALUE_ID), 1: (OTHER_KEY_ID, OTHER_VALUE_ID)})
    registry = Registry({KEY_ID: KEY_SCHEMA, VALUE_ID: VALUE_SCHEMA}, down={OTHER_KEY_ID, OTHER_VALUE_ID})
    out = io.StringIO()

    with pytest.raises(SchemaUnavailable) as stopped:
        check_changefeed(io.BytesIO(data).readlines(), "cdc.jsonl", "avro", out, schemas=registry)

    # Line 2 is partition 1's first record; line 1's fault was written before the registry was asked.
    assert str(stopped.value).startswith(f"cdc.jsonl:2: cdc/1@0: writer schema id {OTHER_KEY_ID}: http://registry:")
    assert registry.asked == [KEY_ID, VALUE_ID, OTHER_KEY_ID]
    assert [(f["partition"], f["offset"], f["verdict"]) for f in map(json.loads, out.getvalue().splitlines())] == [
        (0, 0, "CHECKSUM_MISMATCH")
    ]


def test_avro_needs_a_schema_lookup_and_the_protocol_is_checked():
    with pytest.raises(ValueError, match="needs a schema lookup"):
        check_changefeed([], "x", "avro", io.StringIO())
    with pytest.raises(ValueError, match="protocol must be one of avro, simple"):
        check_changefeed([], "x", "canal-json", io.StringIO(), schemas=Registry({}))
