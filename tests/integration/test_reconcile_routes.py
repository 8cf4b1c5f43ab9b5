"""The nightly QoS check of pipeline routes, on a real broker and a real local Spark: faulty
processors (one dropping its buffer at rebalances, one writing batches twice) run between
topics, no worker watching; then the job must report exactly the records they lost and
duplicated, by source partition and offset, in every format it writes, count every trace, and
say the same of their sinks archived to files (Parquet with Spark's kafka columns, Parquet with
a bare kdiv_trace column positioned by file and row, Avro). A route whose group never ran is
pending, not lost.

The judging task's handling of traces split across Arrow batches is exercised without Spark,
the file sinks' errors on small files.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdiv.dev.processor import ProcessorLedger
from kdiv.reconcile.aggregates import FINDINGS_SHOWN_PER_CLASS
from kdiv.reconcile.findings import ROUTE_DUPLICATED, ROUTE_LOST
from kdiv.reconcile.job import PROM_FILE, ROUTE_OFFSETS_JSON, Reconciliation, parse_args, settings_from
from kdiv.reconcile.kafka_source import read_topics
from kdiv.reconcile.prometheus import build_registry
from kdiv.reconcile.report import REPORT_HTML, SUMMARY_JSON
from kdiv.reconcile.routes import (
    AVRO_FILE_FORMAT,
    OBSERVED_ROWS,
    CommittedOffsets,
    ExtractTask,
    FileInput,
    FileSinkError,
    JudgePlan,
    JudgeTask,
    _check_one_topic_per_archive,
    read_file_sink,
)
from kdiv.reconcile.snapshot import take_snapshot
from kdiv.trace.header import TRACE_HEADER, TraceStamp, encode_trace
from kdiv.trace.routes import FileSink, parse_routes, stage_map
from kdiv.writer import DivWriter
from tests.conftest import _create_topic, _delete_topics, run_coroutine
from tests.harness.pipeline import processor_pair, produce_traced
from tests.integration.test_reconcile_report import _Page, as_int, table_dicts

pytestmark = pytest.mark.broker

IDLE_TRACES = 25


async def run_pipeline(bootstrap: str, source: str, sink: str, group: str, fault: str) -> tuple[int, ProcessorLedger]:
    """Two instances of a faulty processor, with a rebalance as the second joins and another as
    the first leaves, all under load; returns the records traced and the processors' ledger."""
    linger_s = 1.0
    first, second = processor_pair(bootstrap, source, sink, group, fault, linger_s)
    stop = asyncio.Event()
    try:
        producing = asyncio.create_task(produce_traced(bootstrap, source, stop, rate=250.0))
        await first.start()
        await asyncio.sleep(3)
        await second.start()
        await asyncio.sleep(3)
        await first.stop()
        await asyncio.sleep(2)
        stop.set()
        traced = await producing
        await asyncio.sleep(2 * linger_s)  # the last batches written
        await second.stop()
        return traced, ProcessorLedger.merged([first.ledger, second.ledger])
    finally:
        stop.set()
        for processor in (first, second):
            await processor.stop()


async def produce_idle(bootstrap: str, topic: str) -> None:
    writer = await DivWriter.start(bootstrap, tracing="*=1")
    try:
        for n in range(IDLE_TRACES):
            await writer.send(topic, b"idle%d" % n, None)
        await writer.flush()
    finally:
        await writer.close()


def archive(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    """The topic's records as Spark's kafka source gives them (includeHeaders): what a Spark job
    archiving it writes."""
    snapshot = take_snapshot(bootstrap, [topic])
    return read_topics(spark, snapshot, [topic], librdkafka={"bootstrap.servers": bootstrap}, source="python")


@pytest.fixture(scope="module")
def run(bootstrap, spark, tmp_path_factory):
    """One pipeline of each fault, their sinks archived, one reconciliation over all routes."""
    created: list[str] = []

    def topic(partitions: int) -> str:
        name = f"kdiv-qos-{uuid.uuid4().hex[:10]}"
        run_coroutine(_create_topic(bootstrap, name, partitions))
        created.append(name)
        return name

    dropping = {"source": topic(4), "sink": topic(4), "group": f"drop{uuid.uuid4().hex[:8]}"}
    duplicating = {"source": topic(4), "sink": topic(3), "group": f"dup{uuid.uuid4().hex[:8]}"}
    idle = {"source": topic(2), "sink": topic(2), "group": f"idle{uuid.uuid4().hex[:8]}"}

    async def pipelines():
        return await asyncio.gather(
            run_pipeline(bootstrap, dropping["source"], dropping["sink"], dropping["group"], "drop"),
            run_pipeline(bootstrap, duplicating["source"], duplicating["sink"], duplicating["group"], "duplicate"),
            produce_idle(bootstrap, idle["source"]),
        )

    (drop_traced, drop_ledger), (dup_traced, dup_ledger), _ = run_coroutine(pipelines())

    files = tmp_path_factory.mktemp("archives")
    kafka_parquet, bare_parquet, kafka_avro = (files / "drop-sink", files / "dup-sink-bare", files / "dup-sink-avro")
    archive(spark, bootstrap, dropping["sink"]).write.parquet(str(kafka_parquet))
    duplicated_sink = archive(spark, bootstrap, duplicating["sink"])
    # No Kafka position, the trace alone (null on the processors' untraced DIV control records),
    # over several files: positioned by file and row.
    bare = duplicated_sink.select(
        "value", F.get(F.filter("headers", lambda h: h["key"] == TRACE_HEADER), 0)["value"].alias("kdiv_trace")
    )
    bare.repartition(3).write.parquet(str(bare_parquet))
    duplicated_sink.write.format(AVRO_FILE_FORMAT).save(str(kafka_avro))

    def chain(pipeline: dict, sink: str) -> str:
        return f"{pipeline['source']}>{pipeline['group']}>{sink}"

    routes = ";".join(
        [
            f"drop={chain(dropping, dropping['sink'])}",
            f"drop-parquet={chain(dropping, f'parquet:{kafka_parquet}')}",
            f"dup={chain(duplicating, duplicating['sink'])}",
            f"dup-bare={chain(duplicating, f'parquet:{bare_parquet}')}",
            f"dup-avro={chain(duplicating, f'avro:{kafka_avro}')}",
            f"idle={chain(idle, idle['sink'])}",
        ]
    )
    out = tmp_path_factory.mktemp("reports")
    args = parse_args(
        [
            "--bootstrap",
            bootstrap,
            "--app-id",
            f"qos-{uuid.uuid4().hex[:8]}",  # no worker ever ran under it: no changelog exists
            "--routes",
            routes,
            "--out",
            str(out),
            "--kafka-source",
            "python",
        ]
    )
    settings = settings_from(args, {"KDIV_SCHEMA_REGISTRY_URL": "none"})
    said: list[str] = []
    code, report = Reconciliation(args, settings, spark, lambda m, err=False: said.append(m)).run()
    assert report is not None, said
    yield {
        "code": code,
        "said": said,
        "report": report,
        "summary": json.loads((report / SUMMARY_JSON).read_text()),
        "dropping": {**dropping, "traced": drop_traced, "ledger": drop_ledger},
        "duplicating": {**duplicating, "traced": dup_traced, "ledger": dup_ledger},
        "idle": idle,
        "args": args,
        "settings": settings,
    }
    run_coroutine(_delete_topics(bootstrap, created))


def findings(spark: SparkSession, report: Path) -> list:
    return spark.read.parquet(str(report / "discrepancies")).where(F.col("class").startswith("ROUTE_")).collect()


def by_route(rows: list, route: str, cls: str) -> set[tuple[int, int]]:
    return {(r["partition"], r["offset"]) for r in rows if r["route"] == route and r["class"] == cls}


def expected_counts(traced: int, ledger: ProcessorLedger) -> dict[str, int]:
    """What a hop's counts must be: written records delivered, dropped ones lost, the rest (the
    group never committed past them) pending."""
    delivered = len(set(ledger.writes))
    return {
        "traced": traced,
        "delivered": delivered,
        "lost": len(ledger.lost),
        "duplicated": len(ledger.duplicated),
        "pending": traced - delivered - len(ledger.lost),
    }


def test_the_job_names_exactly_the_records_lost_and_duplicated_on_every_sink(run, spark):
    summary, report = run["summary"], run["report"]
    assert (run["code"], summary["status"]) == (1, "discrepancies"), (summary.get("error"), run["said"])
    drop, dup = run["dropping"], run["duplicating"]
    assert drop["ledger"].lost, "the processors dropped nothing: the test proves nothing"
    assert dup["ledger"].duplicated, "the processors duplicated nothing: the test proves nothing"
    rows = findings(spark, report)
    for route, pipeline in (
        ("drop", drop),
        ("drop-parquet", drop),
        ("dup", dup),
        ("dup-bare", dup),
        ("dup-avro", dup),
    ):
        ledger = pipeline["ledger"]
        assert by_route(rows, route, ROUTE_LOST) == ledger.lost, route
        assert by_route(rows, route, ROUTE_DUPLICATED) == ledger.duplicated, route
        for r in rows:
            if r["route"] != route:
                continue
            # The finding is on the source record, to replay; the group that committed past it named.
            assert r["topic"] == pipeline["source"] and r["group"] == pipeline["group"] and r["hop"] == 0, r
            assert len(r["trace_id"]) == 32 and r["timestamp_ms"] > 0 and r["key"].startswith(b"k"), r
            if r["class"] == ROUTE_LOST:
                assert r["committed_offset"] > r["offset"] and r["count"] == 1, r
                assert f"replay {pipeline['source']}[{r['partition']}]@{r['offset']}" in r["detail"], r
            else:
                # Every copy at the output, as many as the processors wrote.
                assert len(r["copies"]) == ledger.writes[(r["partition"], r["offset"])] == r["count"] + 1, r
    assert by_route(rows, "idle", ROUTE_LOST) == set()

    copies = {
        route: next(r["copies"] for r in rows if r["route"] == route and r["class"] == ROUTE_DUPLICATED)
        for route in ("dup", "dup-bare", "dup-avro")
    }
    assert {(c["topic"], c["file"]) for c in copies["dup"]} == {(dup["sink"], None)}
    # Archived with their Kafka positions: the copies are the sink topic's records, in files.
    avro_positions = sorted((c["partition"], c["offset"]) for c in copies["dup-avro"])
    assert avro_positions == sorted((c["partition"], c["offset"]) for c in copies["dup"])
    assert all(c["file"].endswith(".avro") and c["topic"].startswith("avro:") for c in copies["dup-avro"])
    # Without them: each copy by its file and row.
    assert all(c["partition"] is None and c["row"] >= 0 and c["file"].endswith(".parquet") for c in copies["dup-bare"])


def test_the_summary_counts_every_trace_per_route_and_hop(run):
    routes = run["summary"]["routes"]
    assert set(routes) == {"drop", "drop-parquet", "dup", "dup-bare", "dup-avro", "idle"}
    for name, pipeline in (("drop", "dropping"), ("drop-parquet", "dropping"), ("dup", "duplicating")):
        expected = expected_counts(run[pipeline]["traced"], run[pipeline]["ledger"])
        entry = routes[name]
        assert {k: entry[k] for k in expected} == expected, name
        (hop,) = entry["hops"]
        assert hop["group"] == run[pipeline]["group"] and hop["group_known"]
        assert hop["committed_partitions"] == hop["input_partitions"] == 4
        assert {k: hop[k] for k in ("delivered", "lost", "duplicated", "pending")} == {
            k: expected[k] for k in ("delivered", "lost", "duplicated", "pending")
        }
        assert (hop["traced_in"], hop["traced_out"]) == (expected["traced"], expected["delivered"])
        assert entry["unreadable_trace_headers"] == 0
    assert {k: routes["dup-bare"][k] for k in ("traced", "delivered", "lost", "duplicated", "pending")} == {
        k: routes["dup"][k] for k in ("traced", "delivered", "lost", "duplicated", "pending")
    }
    assert routes["drop-parquet"]["file_sinks"] and routes["drop-parquet"]["live_hops"] == 0
    assert routes["drop"]["live_hops"] == 1
    # A group that never ran has committed nothing: its traces wait, they are not lost.
    idle = routes["idle"]
    assert (idle["traced"], idle["pending"], idle["lost"], idle["delivered"]) == (IDLE_TRACES, IDLE_TRACES, 0, 0)
    assert idle["hops"][0]["group_known"] is False and idle["hops"][0]["committed_partitions"] == 0
    # Each finding row stands for one verdict.
    counts = run["summary"]["counts"]
    assert counts[ROUTE_LOST] == 2 * routes["drop"]["lost"]
    assert counts[ROUTE_DUPLICATED] == sum(routes[name]["duplicated"] for name in routes)
    assert run["summary"]["snapshot"]["route_offsets_file"] == ROUTE_OFFSETS_JSON


def test_the_page_and_the_gauges_say_the_same(run):
    report, routes = run["report"], run["summary"]["routes"]
    page = _Page((report / REPORT_HTML).read_text())
    hops = {(r["Route"], r["Hop"]): r for r in table_dicts(page, "route-hops")}
    for name, entry in routes.items():
        row = hops[(name, "0")]
        assert row["Group"] == entry["hops"][0]["group"]
        assert {k: as_int(row[k]) for k in ("Delivered", "Lost", "Duplicated", "Pending")} == {
            k: entry[k.lower()] for k in ("Delivered", "Lost", "Duplicated", "Pending")
        }
        assert as_int(hops[(name, "All hops")]["Traced in"]) == entry["traced"]
    listed = [
        (r["Route"], as_int(r["Partition"]), as_int(r["Offset"])) for r in table_dicts(page, "findings-route_lost")
    ]
    lost = {(route, p, o) for route in ("drop", "drop-parquet") for p, o in run["dropping"]["ledger"].lost}
    assert set(listed) <= lost and len(set(listed)) == len(listed) == min(len(lost), FINDINGS_SHOWN_PER_CLASS)

    gauges = {
        (s.name, s.labels.get("route"), s.labels.get("hop"), s.labels.get("outcome")): s.value
        for family in text_string_to_metric_families((report / PROM_FILE).read_text())
        for s in family.samples
    }
    for name, entry in routes.items():
        for outcome in ("DELIVERED", "LOST", "DUPLICATED", "PENDING"):
            assert gauges[("kdiv_reconcile_route_traces", name, "0", outcome)] == entry[outcome.lower()]
        assert gauges[("kdiv_reconcile_route_traces", name, "0", "TRACED")] == entry["hops"][0]["traced_in"]


def test_a_rerun_on_the_snapshot_judges_against_the_same_offsets(run, spark, tmp_path):
    args = parse_args(
        [
            *(
                "--bootstrap",
                run["args"].bootstrap,
                "--app-id",
                run["args"].app_id,
                "--routes",
                run["args"].routes,
            ),
            "--out",
            str(tmp_path),
            "--kafka-source",
            "python",
            "--snapshot",
            str(run["report"] / "snapshot.json"),
        ]
    )
    code, report = Reconciliation(args, run["settings"], spark, lambda m, err=False: None).run()
    assert report is not None and code == 1
    again = json.loads((report / SUMMARY_JSON).read_text())
    assert again["routes"] == run["summary"]["routes"]
    assert (report / ROUTE_OFFSETS_JSON).read_text() == (run["report"] / ROUTE_OFFSETS_JSON).read_text()


def test_spark_s_kafka_source_judges_every_route_as_kdiv_s_does(run, spark, tmp_path):
    """Trace headers read by Spark's own kafka source (includeHeaders) on the same snapshot: the
    same findings, every column, and the same per-hop counts."""
    args = parse_args(
        [
            *("--bootstrap", run["args"].bootstrap, "--app-id", run["args"].app_id, "--routes", run["args"].routes),
            *("--out", str(tmp_path), "--kafka-source", "spark"),
            *("--snapshot", str(run["report"] / "snapshot.json")),
        ]
    )
    code, report = Reconciliation(args, run["settings"], spark, lambda m, err=False: None).run()
    assert report is not None and code == run["code"] == 1
    summary = json.loads((report / SUMMARY_JSON).read_text())
    assert (summary["kafka_source"], run["summary"]["kafka_source"]) == ("spark", "python")
    assert summary["routes"] == run["summary"]["routes"]
    assert summary["records_read"] == run["summary"]["records_read"]

    def every_column(rows: list) -> set[tuple]:
        return {tuple(sorted((k, repr(v)) for k, v in r.asDict(recursive=True).items())) for r in rows}

    spark_findings = findings(spark, report)
    assert spark_findings and every_column(spark_findings) == every_column(findings(spark, run["report"]))


# -- the judging task, without Spark ---------------------------------------------------------------


def judge_batch(rows: list[tuple]) -> pa.RecordBatch:
    """(route, trace id, stage, topic, partition, offset) rows with the other inputs filled."""
    columns = {
        "route": pa.string(),
        "trace_id": pa.binary(),
        "stage": pa.int32(),
        "topic": pa.string(),
        "partition": pa.int64(),
        "offset": pa.int64(),
        "timestamp_ms": pa.int64(),
        "origin_ms": pa.int64(),
        "key": pa.binary(),
        "file": pa.string(),
        "row": pa.int64(),
    }
    full = [(*r, 1_000 + r[5], 1_000, None, None, None) for r in rows]
    return pa.RecordBatch.from_arrays(
        [pa.array(list(values), kind) for values, kind in zip(zip(*full, strict=True), columns.values(), strict=True)],
        names=list(columns),
    )


def test_a_trace_split_across_batches_is_judged_whole_and_unsorted_input_is_refused():
    (route,) = parse_routes("r=a>g>b")
    one, two, three = (bytes([n]) * 16 for n in (1, 2, 3))
    # Committed past every source record: a trace not seen on b is lost.
    task = JudgeTask(JudgePlan((route,), {("g", "a", 0): 100}))
    out = task(
        iter(
            [
                judge_batch([("r", one, 0, "a", 0, 1), ("r", two, 0, "a", 0, 2)]),
                # Trace two goes on here: its copy on b is in this batch, so it is delivered.
                judge_batch([("r", two, 1, "b", 0, 7), ("r", three, 0, "a", 0, 3)]),
                judge_batch([("r", three, 1, "b", 0, 8), ("r", three, 1, "b", 1, 4)]),
            ]
        )
    )
    rows = pa.Table.from_batches(list(out)).to_pylist()
    faults = {(r["outcome"], r["trace_id"]) for r in rows if r["kind"] == "fault"}
    assert faults == {("LOST", one.hex()), ("DUPLICATED", three.hex())}
    counts = {(r["hop"], r["outcome"]): r["n"] for r in rows if r["kind"] == "count"}
    assert counts[(-1, "DELIVERED")] == 2 and counts[(-1, "LOST")] == 1 and counts[(-1, "TRACED")] == 3
    assert counts[(0, "SEEN")] == 3 and counts[(1, "SEEN")] == 2 and (0, "PENDING") not in counts

    with pytest.raises(RuntimeError, match="not sorted by route and trace"):
        list(task(iter([judge_batch([("r", two, 0, "a", 0, 2), ("r", one, 0, "a", 0, 1)])])))


# -- file sinks that cannot be judged, and the saved offsets -----------------------------------------


def test_file_sinks_that_do_not_say_where_their_trace_is_are_refused_by_name(spark, tmp_path, monkeypatch):
    no_trace = tmp_path / "no-trace"
    spark.createDataFrame([(b"v", 0, 1)], "value binary, partition int, offset long").write.parquet(str(no_trace))
    with pytest.raises(FileSinkError, match=r"route 'r': file sink 'parquet:.*no-trace'.*no headers column.*"):
        read_file_sink(spark, "r", FileSink("parquet", str(no_trace)))

    odd_headers = tmp_path / "odd-headers"
    spark.createDataFrame([(["kdiv-trace"],)], "headers array<string>").write.parquet(str(odd_headers))
    with pytest.raises(FileSinkError, match=r"column headers is array<string>, not array<struct<key:string"):
        read_file_sink(spark, "r", FileSink("parquet", str(odd_headers)))

    with pytest.raises(FileSinkError, match=r"route 'r': file sink 'parquet:.*absent': cannot read"):
        read_file_sink(spark, "r", FileSink("parquet", str(tmp_path / "absent")))

    unpositioned = tmp_path / "unpositioned"
    spark.createDataFrame([(b"x",)], "kdiv_trace binary").write.format(AVRO_FILE_FORMAT).save(str(unpositioned))
    with pytest.raises(FileSinkError, match="no partition and offset columns.*Parquet files only"):
        read_file_sink(spark, "r", FileSink("avro", str(unpositioned)))

    monkeypatch.setattr("kdiv.reconcile.routes._jvm_class_available", lambda spark, name: False)
    with pytest.raises(FileSinkError, match=r"Avro reader .* is not on the classpath: add the spark-avro package"):
        read_file_sink(spark, "r", FileSink("avro", str(unpositioned)))


def test_an_archive_of_several_topics_positioned_by_offset_is_refused(spark):
    rows = [
        {"kind": "observation", "topic": "parquet:/lake", "archived_topic": topic, "partition": 0, "offset": 5}
        for topic in ("eu", "us")
    ]
    observed = spark.createDataFrame(rows, OBSERVED_ROWS)
    archive = FileInput(FileSink("parquet", "/lake"), observed, by_row=False, names_topics=True)
    with pytest.raises(FileSinkError, match=r"'parquet:/lake' holds records of 2 topics \(eu, us\)"):
        _check_one_topic_per_archive(observed, [archive])
    _check_one_topic_per_archive(observed.where(F.col("archived_topic") == "eu"), [archive])


def test_saved_offsets_read_back_and_a_bad_file_is_named():
    saved = CommittedOffsets(7, {("g", "a", 0): 12, ("g", "a", 1): 3}, frozenset({"g"}))
    assert CommittedOffsets.from_json(saved.to_json(), "x") == saved
    with pytest.raises(ValueError, match=r"^/r/route_offsets.json: not saved committed offsets: no 'offsets'"):
        CommittedOffsets.from_json('{"version": 1, "taken_at_ms": 1, "known_groups": []}', "/r/route_offsets.json")


def test_the_gauges_carry_changefeed_rows_and_route_traces():
    summary = {
        "status": "discrepancies",
        "finished_at_ms": 1_000,
        "duration_s": 1.0,
        "changefeeds": {"cdc": {"tables": {"shop.orders": {"OK": 9, "CHECKSUM_MISMATCH": 1}}}},
        "routes": {
            "r": {"hops": [{"hop": 0, "traced_in": 5, "delivered": 0, "lost": 1, "duplicated": 0, "pending": 0}]}
        },
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in build_registry(summary).collect()
        for s in family.samples
    }
    assert (
        samples[("kdiv_reconcile_changefeed_rows", (("table", "shop.orders"), ("topic", "cdc"), ("verdict", "OK")))]
        == 9
    )
    assert (
        samples[
            (
                "kdiv_reconcile_changefeed_rows",
                (("table", "shop.orders"), ("topic", "cdc"), ("verdict", "CHECKSUM_MISMATCH")),
            )
        ]
        == 1
    )
    assert samples[("kdiv_reconcile_route_traces", (("hop", "0"), ("outcome", "TRACED"), ("route", "r")))] == 5
    assert samples[("kdiv_reconcile_route_traces", (("hop", "0"), ("outcome", "LOST"), ("route", "r")))] == 1


def test_extraction_gives_an_observation_per_route_and_counts_unreadable_headers():
    good = encode_trace(TraceStamp(b"\x07" * 16, 1_234))
    inputs = pa.RecordBatch.from_pylist(
        [
            # On two routes: two observations.
            {
                "topic": "a",
                "partition": 0,
                "offset": 1,
                "timestamp_ms": 5,
                "trace_headers": [{"key": TRACE_HEADER, "value": good}],
            },
            {
                "topic": "a",
                "partition": 0,
                "offset": 2,
                "timestamp_ms": 6,
                "trace_headers": [{"key": TRACE_HEADER, "value": b"\x09"}],
            },
            # An archive's kdiv_trace column, positioned by file and row.
            {"topic": "parquet:/lake", "trace": good, "file": "f1", "row": 3},
        ],
        schema=pa.schema(
            [
                ("topic", pa.string()),
                ("partition", pa.int64()),
                ("offset", pa.int64()),
                ("timestamp_ms", pa.int64()),
                ("key", pa.binary()),
                ("trace_headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
                ("trace", pa.binary()),
                ("file", pa.string()),
                ("row", pa.int64()),
                ("archived_topic", pa.string()),
            ]
        ),
    )
    routes = parse_routes("r=a>g>b;s=a>h>parquet:/lake")
    rows = pa.Table.from_batches(list(ExtractTask(stage_map(routes))(iter([inputs])))).to_pylist()
    observed = {(r["route"], r["stage"], r["topic"], r["offset"], r["row"]) for r in rows if r["kind"] == "observation"}
    assert observed == {("r", 0, "a", 1, None), ("s", 0, "a", 1, None), ("s", 1, "parquet:/lake", None, 3)}
    assert all(r["trace_id"] == b"\x07" * 16 and r["origin_ms"] == 1_234 for r in rows if r["kind"] == "observation")
    (error,) = [r for r in rows if r["kind"] == "header_error"]
    assert (error["topic"], error["offset"]) == ("a", 2) and "version 9 is unknown" in error["detail"]
