"""The nightly job verifies TiCDC changefeed topics at rest: a TiCDC-shaped Avro changefeed
with planted corrupt rows on two partitions (schemas in the registry, deletes as tombstones),
and the job must report exactly those rows, in every format it writes, with the rows per
verdict counted, and exit 1. No worker ran: changefeed topics need no worker state.

The executors' task itself (Simple DMLs held across batches and partitions, ids unknown to
the registry, a registry that does not answer) is exercised without Spark.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kdiv.config.settings import RegistrySettings
from kdiv.dev.changefeed import ChangefeedMessages, write_changefeed
from kdiv.reconcile import changefeeds
from kdiv.reconcile.changefeeds import ChangefeedSchemaError, VerifyPlan, VerifyTask, fetch_schemas
from kdiv.reconcile.findings import CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED
from kdiv.reconcile.job import PROM_FILE, Reconciliation, parse_args, settings_from
from kdiv.reconcile.report import REPORT_HTML, SUMMARY_JSON
from tests.integration.test_reconcile_report import _Page, as_int, table_dicts
from tests.unit.test_ticdc_checksum import EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA

pytestmark = pytest.mark.broker

ROWS = 240
FAULTS_AT = {3: "mismatch", 40: "flag", 41: "mismatch", 150: "mismatch", 199: "flag", 238: "mismatch"}
VERDICTS = {"mismatch": CHECKSUM_MISMATCH, "flag": CORRUPTED_FLAG}
TABLE = "shop.orders"


async def test_the_job_reports_exactly_the_planted_corrupt_rows(
    bootstrap, registry_url, topic_factory, spark, tmp_path
):
    topic = topic_factory(2)
    planted = await write_changefeed(
        bootstrap,
        topic,
        RegistrySettings(url=registry_url),
        rows=ROWS,
        partitions=2,
        delete_rate=0.1,
        faults_at=FAULTS_AT,
        seed=11,
    )
    expected = {(p, o, VERDICTS[fault]) for fault, where in planted.faults.items() for p, o in where}
    assert len(expected) == len(FAULTS_AT) and {p for p, _, _ in expected} == {0, 1}
    assert planted.rows == ROWS and planted.deletes > 0
    mismatches = sum(1 for *_, verdict in expected if verdict == CHECKSUM_MISMATCH)
    flagged = len(expected) - mismatches

    args = parse_args(
        [
            "--bootstrap",
            bootstrap,
            "--app-id",
            f"cdc-{uuid.uuid4().hex[:8]}",  # no worker ever ran under it: no changelog exists
            "--registry-url",
            registry_url,
            "--out",
            str(tmp_path),
            "--kafka-source",
            "python",
        ]
    )
    settings = settings_from(args, {"KDIV_TICDC_TOPICS": topic, "KDIV_TICDC_PROTOCOL": "avro"})
    said: list[str] = []
    code, report = Reconciliation(args, settings, spark, lambda m, err=False: said.append(m)).run()
    assert report is not None
    summary = json.loads((report / SUMMARY_JSON).read_text())
    assert (code, summary["status"], summary["exit_code"]) == (1, "discrepancies", 1), (summary, said)

    # Parquet: exactly the planted rows, each naming its table, key, commit and checksums.
    found = spark.read.parquet(str(report / "discrepancies")).collect()
    assert {(r["partition"], r["offset"], r["class"]) for r in found} == expected
    for r in found:
        assert r["topic"] == topic and r["table"] == TABLE and r["image"] == "current", r
        assert set(json.loads(r["row_key"])) == {"id"} and r["commit_ts"] > 0 and r["key"], r
        assert r["expected_checksum"] is not None and r["computed_checksum"] is not None, r
        if r["class"] == CHECKSUM_MISMATCH:
            assert r["expected_checksum"] != r["computed_checksum"], r
            assert f"row checksum {r['expected_checksum']} does not match" in r["detail"], r

    # summary.json: findings per class, rows per verdict and table, records read.
    assert {c: summary["counts"][c] for c in (CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED)} == {
        CHECKSUM_MISMATCH: mismatches,
        CORRUPTED_FLAG: flagged,
        MALFORMED: 0,
    }
    assert sum(summary["counts"].values()) == len(expected)  # nothing else: no DIV check ran on it
    rows = {
        "OK": ROWS - planted.deletes - len(expected),
        CHECKSUM_MISMATCH: mismatches,
        CORRUPTED_FLAG: flagged,
        "SKIPPED": planted.deletes,
        MALFORMED: 0,
    }
    changefeed = summary["changefeeds"][topic]
    assert changefeed["rows"] == rows
    assert changefeed["tables"] == {TABLE: rows}
    assert changefeed["skipped"] == {"tombstone": planted.deletes}
    assert changefeed["records_read"] == summary["records_read"][topic] == ROWS
    assert changefeed["protocol"] == "avro"

    # report.html: the per-table counts, and each fault listed.
    page = _Page((report / REPORT_HTML).read_text())
    (per_table, total) = table_dicts(page, "changefeed-rows")
    assert per_table["Table"] == TABLE and total["Table"] == "All tables"
    assert {v: as_int(per_table[v]) for v in rows} == rows and as_int(per_table["Rows"]) == ROWS
    listed = {
        (as_int(r["Partition"]), as_int(r["Offset"]), cls)
        for cls in (CHECKSUM_MISMATCH, CORRUPTED_FLAG)
        for r in table_dicts(page, f"findings-{cls.lower()}")
    }
    assert listed == expected

    # kdiv_reconcile.prom: the discrepancy gauges per class.
    gauges = prom_samples(report / PROM_FILE)
    assert gauges[("kdiv_reconcile_discrepancies", topic, CHECKSUM_MISMATCH)] == mismatches
    assert gauges[("kdiv_reconcile_discrepancies", topic, CORRUPTED_FLAG)] == flagged
    assert gauges[("kdiv_reconcile_discrepancies", topic, MALFORMED)] == 0
    assert gauges[("kdiv_reconcile_records_read", topic, None)] == ROWS


def prom_samples(path: Path) -> dict[tuple[str, str, str | None], float]:
    return {
        (sample.name, sample.labels.get("topic", ""), sample.labels.get("class")): sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def input_batch(rows: list[tuple]) -> pa.RecordBatch:
    """(topic, partition, offset, timestamp_ms, key, value) rows, as verified_rows feeds them."""
    names = ("topic", "partition", "offset", "timestamp_ms", "key", "value")
    types = (pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.binary(), pa.binary())
    return pa.RecordBatch.from_arrays(
        [pa.array(list(column), t) for column, t in zip(zip(*rows, strict=True), types, strict=True)], names=names
    )


def test_a_task_holds_simple_dmls_to_the_end_of_their_partition_and_names_unknown_ids() -> None:
    bootstrap = json.dumps({"version": 1, "type": "BOOTSTRAP", "buildTs": 1, "tableSchema": EXAMPLE_C_SCHEMA})
    dml = EXAMPLE_C_MESSAGE.encode()
    corrupt = dml.replace(b'"id":"7"', b'"id":"8"')
    unregistered = ChangefeedMessages(91, 92).next()  # ids the registry never gave
    asked: list[list[int]] = []

    def registry(settings, ids, where):
        asked.append(ids)
        assert "avro-cdc[0]" in where
        return dict.fromkeys(ids)

    plan = VerifyPlan({"simple-cdc": "simple", "avro-cdc": "avro"}, "UTC", "utc", RegistrySettings())
    out = VerifyTask(plan, fetch=registry)(
        iter(
            [
                # The schema arrives a batch after the DMLs it releases; partition 1's never does.
                input_batch([("simple-cdc", 0, 10, 100, None, dml), ("simple-cdc", 0, 11, 110, None, corrupt)]),
                input_batch([("simple-cdc", 0, 12, 120, None, bootstrap.encode())]),
                input_batch([("simple-cdc", 1, 3, 30, None, dml), ("avro-cdc", 0, 5, 50, unregistered.key, b"x")]),
                input_batch([("avro-cdc", 0, 6, 60, unregistered.key, unregistered.value)]),
            ]
        )
    )
    rows = pa.Table.from_batches(list(out)).to_pylist()
    faults = {(r["topic"], r["partition"], r["offset"], r["verdict"]) for r in rows if r["kind"] == "fault"}
    assert faults == {
        ("simple-cdc", 0, 11, CHECKSUM_MISMATCH),
        ("avro-cdc", 0, 5, MALFORMED),
        ("avro-cdc", 0, 6, MALFORMED),
    }
    unknown = next(r for r in rows if r["kind"] == "fault" and r["offset"] == 6)
    assert unknown["schema_id"] == 92 and "schema id 92 is unknown to the registry" in unknown["detail"]
    assert asked == [[91], [92]]  # each id once, when first met: not once per record
    counts = {(r["topic"], r["partition"], r["verdict"], r["skip_reason"]): r["n"] for r in rows if r["kind"] == "rows"}
    assert counts == {
        ("simple-cdc", 0, "OK", None): 1,
        ("simple-cdc", 0, CHECKSUM_MISMATCH, None): 1,
        ("simple-cdc", 1, "SKIPPED", "schema unknown"): 1,
        ("avro-cdc", 0, MALFORMED, None): 2,
    }
    records = {(r["topic"], r["partition"]): r["n"] for r in rows if r["kind"] == "records"}
    assert records == {("simple-cdc", 0): 3, ("simple-cdc", 1): 1, ("avro-cdc", 0): 2}


def test_a_registry_that_does_not_answer_fails_the_task_naming_where(monkeypatch) -> None:
    monkeypatch.setattr(changefeeds, "REGISTRY_FIRST_WAIT_S", 0.0)
    down = RegistrySettings(url="http://127.0.0.1:9", timeout_s=1.0)
    with pytest.raises(ChangefeedSchemaError, match=r"cdc\[2\] from offset 7: writer schema ids \[4\]: no answer"):
        fetch_schemas(down, [4], "changefeed topic cdc[2] from offset 7")
