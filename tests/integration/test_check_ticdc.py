"""`kdiv check --ticdc avro` over a `kdiv dump` of a demo changefeed: the corrupt rows planted
in Kafka are exactly the faults reported, writer schemas read from the development registry."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from click.testing import CliRunner

from kdiv.cli import main
from kdiv.config.settings import RegistrySettings
from kdiv.dev.changefeed import write_changefeed
from kdiv.dev.registry.process import free_port

FAULTS_AT = {0: "flag", 17: "mismatch", 18: "mismatch", 90: "flag", 151: "mismatch", 199: "mismatch"}
VERDICTS = {"mismatch": "CHECKSUM_MISMATCH", "flag": "CORRUPTED_FLAG"}


@pytest.fixture
def dumped_changefeed(bootstrap, registry_url, topic_factory, tmp_path):
    """A 2-partition demo changefeed with FAULTS_AT planted, dumped by `kdiv dump`: (topic,
    planted, dump file)."""
    topic = topic_factory(2)
    planted = asyncio.run(
        write_changefeed(
            bootstrap,
            topic,
            RegistrySettings(url=registry_url),
            rows=200,
            partitions=2,
            delete_rate=0.1,
            faults_at=FAULTS_AT,
            seed=11,
        )
    )
    path = tmp_path / "cdc.jsonl"
    dumped = CliRunner().invoke(main, ["dump", topic, "--bootstrap", bootstrap, "-o", str(path)])
    assert dumped.exit_code == 0, dumped.output
    return topic, planted, path


def test_check_reports_exactly_the_planted_rows_of_a_dumped_avro_changefeed(registry_url, dumped_changefeed):
    topic, planted, path = dumped_changefeed
    expected = {
        (topic, partition, offset, VERDICTS[kind])
        for kind, where in planted.faults.items()
        for partition, offset in where
    }
    assert len(expected) == len(FAULTS_AT) and planted.deletes > 0

    result = CliRunner().invoke(main, ["check", "--ticdc", "avro", "--registry-url", registry_url, str(path)])

    assert result.exit_code == 1, result.stderr
    faults = [json.loads(line) for line in result.stdout.splitlines()]
    assert {(f["topic"], f["partition"], f["offset"], f["verdict"]) for f in faults} == expected
    assert len(faults) == len(expected)
    for fault in faults:
        assert fault["table"] == "shop.orders" and fault["row_image"] == "current"
        assert set(fault["row_key"]) == {"id"} and fault["commit_ts"] > 0
        if fault["verdict"] == "CHECKSUM_MISMATCH":
            assert fault["expected_checksum"] != fault["computed_checksum"] is not None
    assert f"{planted.rows} records, {planted.rows} rows" in result.stderr
    assert f"SKIPPED {planted.deletes} (tombstone {planted.deletes})" in result.stderr
    assert f"OK {planted.rows - planted.deletes - len(expected)};" in result.stderr

    # The worker's registry setting serves as well as the option.
    from_env = CliRunner().invoke(
        main, ["check", "--ticdc", "avro", str(path)], env={"KDIV_SCHEMA_REGISTRY_URL": registry_url}
    )
    found_again = [json.loads(line) for line in from_env.stdout.splitlines()]
    # The same faults, found at another time.
    assert from_env.exit_code == 1
    assert [{**f, "detected_at_ms": 0} for f in found_again] == [{**f, "detected_at_ms": 0} for f in faults]


def test_a_registry_that_cannot_be_reached_fails_the_check_naming_the_record_and_schema(dumped_changefeed):
    topic, _, path = dumped_changefeed
    first = json.loads(path.read_text().splitlines()[0])
    key_schema_id = int.from_bytes(base64.b64decode(first["key"])[1:5], "big")  # Confluent framing
    nobody = f"http://127.0.0.1:{free_port()}"

    result = CliRunner().invoke(main, ["check", "--ticdc", "avro", "--registry-url", nobody, str(path)])

    assert result.exit_code == 2
    assert result.stdout == ""  # no row is judged without its schema
    where = f"{path}:1: {topic}/{first['partition']}@{first['offset']}"
    assert f"kdiv check: {where}: writer schema id {key_schema_id}: {nobody}: cannot read schema id" in result.stderr
    assert "stopped there: no row is judged without its writer schema" in result.stderr
