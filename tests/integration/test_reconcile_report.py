"""The reconciliation's report (summary.json, Parquet, report.html) and its Prometheus gauges."""

from __future__ import annotations

import json
import re
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pyarrow.parquet
import pytest
from matplotlib.patches import Rectangle
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import DataFrame, SparkSession

from kdiv.reconcile import prometheus, report
from kdiv.reconcile.aggregates import SEQUENCE_FIELDS, Timeline
from kdiv.reconcile.findings import (
    CLASSES,
    DIVERGED,
    FINDING_FIELDS,
    FINDINGS_SCHEMA,
    LOST,
    SCHEMA_UNKNOWN,
    SEQUENCE_BEHIND,
    SUBJECT_MISMATCH,
    UNREADABLE,
    UNVALIDATED,
)
from kdiv.reconcile.legend import CLASS_COLOURS, CLASS_MEANINGS
from kdiv.reconcile.markup import KEY_TEXT_CHARS
from kdiv.reconcile.plots import timeline_figure
from kdiv.reconcile.summary import STATUSES

T0 = 1_714_560_000_000  # 2024-05-01 10:40:00 UTC
MINUTE_MS = 60_000
SCRIPT_DETAIL = "<script>alert('x')</script> & \"quoted\""
NON_UTF8_KEY = b"\xff\xfe\x00\x80"
LONG_KEY = b"k" * 100

SEQUENCES_DDL = (
    "topic string, partition int, producer string, topic_segment int, topic_seq long, "
    "table_segment int, table_seq long, behind boolean"
)


@pytest.fixture(scope="module")
def report_spark(spark: SparkSession) -> SparkSession:
    # The session's one SparkSession (tests/conftest.py): the first session a process starts
    # decides its JVM's classpath, so none is built here (one without Spark's kafka connector
    # left later modules in the same process without it).
    return spark


def finding(
    cls: str,
    topic: str,
    partition: int,
    offset: int,
    *,
    key: bytes | None = None,
    producer: str | None = None,
    segment: int | None = None,
    seq: int | None = None,
    timestamp_ms: int = -1,
    count: int = 1,
    schema_id: int | None = None,
    expected_subject: str | None = None,
    registered_subjects: list[str] | None = None,
    detail: str = "",
) -> tuple:
    values = {
        "class": cls,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key,
        "producer": producer,
        "segment": segment,
        "seq": seq,
        "timestamp_ms": timestamp_ms,
        "count": count,
        "schema_id": schema_id,
        "expected_subject": expected_subject,
        "registered_subjects": registered_subjects,
        "detail": detail,
    }
    return tuple(values[name] for name in FINDING_FIELDS)


PLANTED = [
    finding(LOST, "orders", 0, 10, key=b"order-1", timestamp_ms=T0, detail=SCRIPT_DETAIL),
    finding(
        LOST,
        "orders",
        0,
        11,
        key=NON_UTF8_KEY,
        timestamp_ms=T0 + 5 * MINUTE_MS,
        detail="validated at offset 11; the key is gone",
    ),
    finding(LOST, "orders", 1, 3, key=b"order-<3>", timestamp_ms=T0 + 120 * MINUTE_MS, detail="gone"),
    finding(LOST, "payments", 2, 1, key=b"pay-1", timestamp_ms=T0 + 240 * MINUTE_MS, detail="gone"),
    finding(UNVALIDATED, "orders", 2, 40, key=b"order-9", detail="never validated, no record time"),
    finding(UNVALIDATED, "payments", 0, 7, key=b"pay-7", timestamp_ms=T0 + 30 * MINUTE_MS, detail="never validated"),
    finding(UNVALIDATED, "payments", 1, 8, key=b"pay-8", timestamp_ms=T0 + 30 * MINUTE_MS, detail="never validated"),
    finding(
        DIVERGED,
        "orders",
        1,
        7,
        key=LONG_KEY,
        producer="0a1b",
        segment=2,
        seq=9,
        timestamp_ms=T0 + 60 * MINUTE_MS,
        detail="CRC32 differs",
    ),
    finding(
        SEQUENCE_BEHIND,
        "payments",
        0,
        99,
        producer="ab12",
        segment=3,
        seq=17,
        detail="the table holds segment 3 seq 17",
    ),
    finding(
        SUBJECT_MISMATCH,
        "payments",
        0,
        5,
        schema_id=7,
        expected_subject="payments-store-changelog-value",
        registered_subjects=["other-value"],
        count=12,
        timestamp_ms=T0 + 90 * MINUTE_MS,
        detail="schema 7 registered under other-value",
    ),
    finding(SCHEMA_UNKNOWN, "payments", 1, 6, schema_id=99, count=3, detail="schema 99 unknown"),
]
PLANTED_COUNTS = {
    LOST: 4,
    UNVALIDATED: 3,
    DIVERGED: 1,
    SEQUENCE_BEHIND: 1,
    SUBJECT_MISMATCH: 1,
    SCHEMA_UNKNOWN: 1,
    UNREADABLE: 0,
}
PLANTED_RECORDS = {**PLANTED_COUNTS, SUBJECT_MISMATCH: 12, SCHEMA_UNKNOWN: 3}
PLANTED_UNTIMED = 3
ZEROS = dict.fromkeys(CLASSES, 0)
PLANTED_BY_TOPIC = {
    "orders": {**ZEROS, LOST: 3, UNVALIDATED: 1, DIVERGED: 1},
    "payments": {**ZEROS, LOST: 1, UNVALIDATED: 2, SEQUENCE_BEHIND: 1, SUBJECT_MISMATCH: 1, SCHEMA_UNKNOWN: 1},
    "inventory": dict(ZEROS),
}

SEQUENCES = [
    ("orders", 0, "cd34", 1, 5, 1, 5, False),
    ("payments", 1, "ef56", 2, 1, 1, 9, False),
    ("payments", 0, "ab12", 3, 10, 3, 17, True),
    ("orders", 1, "gh78", None, None, 4, 2, True),
]


def run_summary(**overrides) -> dict:
    summary = {
        "snapshot": {"taken_at_ms": T0 + 300 * MINUTE_MS},
        "topics": ["inventory", "orders", "payments"],
        "records_read": {"inventory": 70, "orders": 1200, "payments": 345},
        "started_at_ms": T0 + 300 * MINUTE_MS,
        "finished_at_ms": T0 + 305 * MINUTE_MS,
        "duration_s": 297.25,
        "exit_code": 1,
    }
    return {**summary, **overrides}


@pytest.fixture(scope="module")
def planted(report_spark: SparkSession) -> DataFrame:
    return report_spark.createDataFrame(PLANTED, FINDINGS_SCHEMA)


@pytest.fixture(scope="module")
def sequences(report_spark: SparkSession) -> DataFrame:
    return report_spark.createDataFrame(SEQUENCES, SEQUENCES_DDL)


@pytest.fixture(scope="module")
def written(planted: DataFrame, sequences: DataFrame, tmp_path_factory: pytest.TempPathFactory) -> report.ReportFiles:
    return report.write_report(planted, sequences, run_summary(), tmp_path_factory.mktemp("report"))


class _Page(HTMLParser):
    """Tables by id (rows of cell texts), headings, and every attribute, of a report page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.row_classes: dict[str, list[str]] = {}
        self.headings: list[tuple[str, str]] = []
        self.attributes: list[tuple[str, str, str | None]] = []
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._heading: tuple[str, list[str]] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.attributes += [(tag, name, value) for name, value in attrs]
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id", "")
            self.tables[self._table] = []
            self.row_classes[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
            self.row_classes[self._table].append(attrs.get("class", ""))
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag in ("h1", "h2", "h3"):
            self._heading = (tag, [])

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag in ("h1", "h2", "h3") and self._heading is not None:
            self.headings.append((self._heading[0], "".join(self._heading[1]).strip()))
            self._heading = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._heading is not None:
            self._heading[1].append(data)

    def h1(self) -> str:
        return next(text for tag, text in self.headings if tag == "h1")


def table_dicts(page: _Page, table_id: str) -> list[dict[str, str]]:
    header, *rows = page.tables[table_id]
    return [dict(zip(header, row, strict=False)) for row in rows]


def as_int(cell: str) -> int:
    return int(cell.replace(",", ""))


# --- summary.json ------------------------------------------------------------------------------


def test_summary_counts_the_planted_findings(written: report.ReportFiles) -> None:
    on_disk = json.loads(written.summary_json.read_text(encoding="utf-8"))
    assert on_disk == written.summary
    assert on_disk["counts"] == PLANTED_COUNTS
    assert on_disk["records"] == PLANTED_RECORDS
    assert on_disk["by_topic"] == PLANTED_BY_TOPIC
    assert on_disk["status"] == "discrepancies"
    # The caller's keys pass through untouched.
    for key, value in run_summary().items():
        assert on_disk[key] == value


def test_summary_json_has_sorted_keys_and_indent(written: report.ReportFiles) -> None:
    text = written.summary_json.read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_a_status_that_contradicts_the_findings_is_refused(
    planted: DataFrame, report_spark: SparkSession, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="contradicts"):
        report.write_report(planted, None, run_summary(status="clean"), tmp_path / "a")
    empty = report_spark.createDataFrame([], FINDINGS_SCHEMA)
    with pytest.raises(ValueError, match="contradicts"):
        report.write_report(empty, None, run_summary(status="discrepancies"), tmp_path / "b")
    assert not (tmp_path / "a" / report.SUMMARY_JSON).exists()


# --- Parquet -----------------------------------------------------------------------------------


def test_discrepancies_parquet_reads_back_as_the_planted_rows(
    written: report.ReportFiles, report_spark: SparkSession
) -> None:
    back = report_spark.read.schema(FINDINGS_SCHEMA).parquet(str(written.discrepancies)).select(*FINDING_FIELDS)
    rows = [tuple(bytes(v) if isinstance(v, bytearray) else v for v in row) for row in back.collect()]
    assert sorted(rows, key=repr) == sorted(PLANTED, key=repr)


def test_discrepancies_are_laid_out_by_topic_then_class(written: report.ReportFiles) -> None:
    discrepancies = written.discrepancies
    assert discrepancies is not None
    leaves = {path.parent.relative_to(discrepancies).as_posix() for path in discrepancies.rglob("*.parquet")}
    planted_pairs = {f"topic={row[1]}/class={row[0]}" for row in PLANTED}
    assert leaves == planted_pairs
    # One file per (topic, class): each directory holds its findings in one sorted file.
    assert len(list(discrepancies.rglob("*.parquet"))) == len(planted_pairs)


def test_sequences_parquet_reads_back(written: report.ReportFiles, report_spark: SparkSession) -> None:
    back = report_spark.read.parquet(str(written.sequences))
    assert tuple(back.columns) == SEQUENCE_FIELDS
    assert sorted(map(tuple, back.collect()), key=repr) == sorted(SEQUENCES, key=repr)


# --- report.html -------------------------------------------------------------------------------


def test_html_is_self_contained(written: report.ReportFiles) -> None:
    text = written.report_html.read_text(encoding="utf-8")
    page = _Page(text)
    fetched = [
        (tag, name, value)
        for tag, name, value in page.attributes
        if name in ("src", "href", "xlink:href", "action", "data", "poster")
    ]
    assert all(value is not None and not re.match(r"\s*(https?:)?//", value, re.I) for _, _, value in fetched), fetched
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "<script" not in text.lower()
    assert "<link" not in text.lower()
    assert "@import" not in text
    assert text.count("<svg") == 2


def test_html_escapes_what_the_findings_carry(written: report.ReportFiles) -> None:
    text = written.report_html.read_text(encoding="utf-8")
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;" in text
    assert "order-&lt;3&gt;" in text
    findings = table_dicts(_Page(text), "findings-lost")
    keys = [row["Key"] for row in findings]
    assert keys == ["order-1", "0x" + NON_UTF8_KEY.hex(), "order-<3>", "pay-1"]
    assert table_dicts(_Page(text), "findings-diverged")[0]["Key"] == "k" * KEY_TEXT_CHARS + "…"
    assert table_dicts(_Page(text), "findings-subject_mismatch")[0]["Key"] == "(none)"


def test_html_names_each_class_count(written: report.ReportFiles) -> None:
    page = _Page(written.report_html.read_text(encoding="utf-8"))
    assert page.h1() == "11 discrepancies"
    by_class = {row["Class"]: row for row in table_dicts(page, "counts-by-class")}
    assert set(by_class) == {*CLASSES, "All classes"}
    for cls in CLASSES:
        assert as_int(by_class[cls]["Findings"]) == PLANTED_COUNTS[cls], cls
        assert as_int(by_class[cls]["Records"]) == PLANTED_RECORDS[cls], cls
    assert as_int(by_class["All classes"]["Findings"]) == len(PLANTED)

    by_topic = {row["Topic"]: row for row in table_dicts(page, "counts-by-topic")}
    for topic, per_class in PLANTED_BY_TOPIC.items():
        assert as_int(by_topic[topic]["Records read"]) == run_summary()["records_read"][topic]
        for cls, n in per_class.items():
            if PLANTED_COUNTS[cls]:
                assert as_int(by_topic[topic][cls]) == n, (topic, cls)
            else:  # a class no topic has a finding in: "Findings by class" shows its zero
                assert cls not in by_topic[topic], (topic, cls)
    assert as_int(by_topic["All topics"]["All classes"]) == len(PLANTED)


def test_html_findings_tables_are_ordered_and_complete(written: report.ReportFiles) -> None:
    page = _Page(written.report_html.read_text(encoding="utf-8"))
    for cls in CLASSES:
        planted_rows = sorted((row for row in PLANTED if row[0] == cls), key=lambda row: (row[1], row[2], row[3]))
        table_id = f"findings-{cls.lower()}"
        if not planted_rows:
            assert table_id not in page.tables
            continue
        shown = [(row["Topic"], as_int(row["Partition"]), as_int(row["Offset"])) for row in table_dicts(page, table_id)]
        assert shown == [(row[1], row[2], row[3]) for row in planted_rows], cls


def test_html_says_how_many_findings_lack_a_time(written: report.ReportFiles) -> None:
    text = written.report_html.read_text(encoding="utf-8")
    assert f"{PLANTED_UNTIMED} of {len(PLANTED)} findings carry no record time" in text


def test_html_lists_sequences_behind_first(written: report.ReportFiles) -> None:
    page = _Page(written.report_html.read_text(encoding="utf-8"))
    rows = table_dicts(page, "sequences")
    assert [(row["Producer"], row["Behind"]) for row in rows] == [
        ("gh78", "behind"),
        ("ab12", "behind"),
        ("cd34", "no"),
        ("ef56", "no"),
    ]
    assert page.row_classes["sequences"][1:] == ["behind", "behind", "", ""]
    assert rows[0]["Topic segment"] == "—"


def test_rerun_writes_identical_bytes(
    planted: DataFrame, sequences: DataFrame, report_spark: SparkSession, written: report.ReportFiles, tmp_path: Path
) -> None:
    first = report.write_report(planted, sequences, run_summary(), tmp_path / "run")
    again = report.write_report(planted, sequences, run_summary(), tmp_path / "run")
    # The same findings in another order and partitioning must not change a byte either.
    shuffled = report_spark.createDataFrame(list(reversed(PLANTED)), FINDINGS_SCHEMA).repartition(3)
    elsewhere = report.write_report(shuffled, sequences.repartition(2), run_summary(), tmp_path / "elsewhere")
    for name in (report.SUMMARY_JSON, report.REPORT_HTML):
        expected = (written.summary_json.parent / name).read_bytes()
        for files in (first, again, elsewhere):
            assert (files.summary_json.parent / name).read_bytes() == expected, name


def test_clean_report_says_so_without_plots(
    planted: DataFrame, sequences: DataFrame, report_spark: SparkSession, tmp_path: Path
) -> None:
    out_dir = tmp_path / "out"
    report.write_report(planted, sequences, run_summary(), out_dir)
    empty = report_spark.createDataFrame([], FINDINGS_SCHEMA)
    files = report.write_report(empty, None, run_summary(exit_code=0), out_dir)

    summary = json.loads(files.summary_json.read_text(encoding="utf-8"))
    assert summary["status"] == "clean"
    assert summary["counts"] == ZEROS
    assert summary["by_topic"] == dict.fromkeys(PLANTED_BY_TOPIC, ZEROS)
    text = files.report_html.read_text(encoding="utf-8")
    page = _Page(text)
    assert page.h1() == "Clean: no discrepancies"
    assert "<svg" not in text
    assert "No findings, so nothing to plot." in text
    assert all(as_int(row["Findings"]) == 0 for row in table_dicts(page, "counts-by-class"))
    # The earlier run's Parquet is gone: nothing in out_dir speaks of findings this run lacks,
    # and what is there reads back, schema and all, with no schema given.
    assert files.discrepancies is not None
    assert not [p for p in files.discrepancies.rglob("*") if p.is_dir()]  # no topic=/class= left
    assert files.sequences is None and not (out_dir / report.SEQUENCES_DIR).exists()
    read_back = report_spark.read.parquet(str(files.discrepancies))
    assert read_back.count() == 0 and set(read_back.columns) == {f.name for f in FINDINGS_SCHEMA.fields}
    assert set(pyarrow.parquet.read_table(str(files.discrepancies)).column_names) == set(read_back.columns)


def test_every_class_has_a_meaning_and_a_colour() -> None:
    assert set(CLASS_MEANINGS) == set(CLASSES)
    assert set(CLASS_COLOURS) == set(CLASSES)
    assert set(prometheus.STATUS_VALUES) == set(STATUSES)


# --- failure -----------------------------------------------------------------------------------


def failed_summary() -> dict:
    return {
        "status": "failed",
        "exit_code": 2,
        "error": "KafkaError: <broker> unreachable & gave up",
        "topics": ["orders"],
        "finished_at_ms": T0 + 10_000,
        "duration_s": 10.0,
    }


def test_failure_report_names_the_error(tmp_path: Path, planted: DataFrame, sequences: DataFrame) -> None:
    report.write_report(planted, sequences, run_summary(), tmp_path)
    files = report.write_failure_report(failed_summary(), tmp_path)

    summary = json.loads(files.summary_json.read_text(encoding="utf-8"))
    assert summary == failed_summary()
    text = files.report_html.read_text(encoding="utf-8")
    assert _Page(text).h1() == "Failed"
    assert "KafkaError: &lt;broker&gt; unreachable &amp; gave up" in text
    assert "<svg" not in text and "<script" not in text.lower()
    assert not (tmp_path / report.DISCREPANCIES_DIR).exists()
    assert not (tmp_path / report.SEQUENCES_DIR).exists()


# --- Prometheus --------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_textfile_gauges_carry_the_summary(written: report.ReportFiles, tmp_path: Path) -> None:
    path = tmp_path / "kdiv_reconcile.prom"
    prometheus.write_textfile(written.summary, path)
    got = samples(path.read_text(encoding="utf-8"))

    summary = run_summary()
    assert got[("kdiv_reconcile_status", ())] == 1
    assert got[("kdiv_reconcile_last_run_timestamp_seconds", ())] == summary["finished_at_ms"] / 1000
    assert got[("kdiv_reconcile_duration_seconds", ())] == summary["duration_s"]
    assert got[("kdiv_reconcile_snapshot_timestamp_seconds", ())] == summary["snapshot"]["taken_at_ms"] / 1000
    for topic, records in summary["records_read"].items():
        assert got[("kdiv_reconcile_records_read", (("topic", topic),))] == records
    discrepancies = {
        dict(labels)["topic"] + "/" + dict(labels)["class"]: value
        for (name, labels), value in got.items()
        if name == "kdiv_reconcile_discrepancies"
    }
    assert discrepancies == {
        f"{topic}/{cls}": n for topic, per_class in PLANTED_BY_TOPIC.items() for cls, n in per_class.items()
    }


def test_failed_run_gauges(tmp_path: Path) -> None:
    files = report.write_failure_report(failed_summary(), tmp_path)
    path = tmp_path / "kdiv_reconcile.prom"
    prometheus.write_textfile(files.summary, path)
    got = samples(path.read_text(encoding="utf-8"))
    assert got[("kdiv_reconcile_status", ())] == 2
    assert got[("kdiv_reconcile_duration_seconds", ())] == 10.0
    # Unknown, not zero: a failed run claims no discrepancy count and no snapshot.
    assert not [
        key for key in got if key[0] in ("kdiv_reconcile_discrepancies", "kdiv_reconcile_snapshot_timestamp_seconds")
    ]


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="status"):
        prometheus.build_registry({**failed_summary(), "status": "fine"})


class _RecordingServer(HTTPServer):
    received: list[tuple[str, str, str]]


class _Recorder(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:
        self._record()

    def do_POST(self) -> None:
        self._record()

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        assert isinstance(self.server, _RecordingServer)
        self.server.received.append((self.command, self.path, body.decode("utf-8")))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_push_sends_the_gauges_to_the_gateway(written: report.ReportFiles) -> None:
    server = _RecordingServer(("127.0.0.1", 0), _Recorder)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        prometheus.push(written.summary, f"http://127.0.0.1:{server.server_port}", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

    [(method, path, body)] = server.received
    assert method == "PUT"
    assert path == "/metrics/job/kdiv_reconcile"
    got = samples(body)
    assert got[("kdiv_reconcile_status", ())] == 1
    assert got[("kdiv_reconcile_discrepancies", (("class", LOST), ("topic", "orders")))] == 3
    assert got[("kdiv_reconcile_records_read", (("topic", "payments"),))] == 345


def test_the_lead_sentence_counts_what_the_summary_counts(written: report.ReportFiles) -> None:
    summary = json.loads(written.summary_json.read_text(encoding="utf-8"))
    text = written.report_html.read_text(encoding="utf-8")
    lead = re.search(
        r"<p>([\d,]+) finding rows? standing for ([\d,]+) records?, in (\d+) class(?:es)? across (\d+) topics?\.</p>",
        text,
    )
    assert lead is not None, text[:2000]
    rows, records, classes, topics = (int(g.replace(",", "")) for g in lead.groups())
    assert rows == sum(summary["counts"].values())
    assert records == sum(summary["records"].values())
    assert classes == sum(1 for n in summary["counts"].values() if n)
    assert topics == sum(1 for per_class in summary["by_topic"].values() if any(per_class.values()))


def test_one_moment_of_findings_plots_on_a_span_of_seconds_with_classes_stacked() -> None:
    """One bin used to get matplotlib's default span of years, and classes with the same
    counts at the same moments hid each other."""
    moment = 1_795_478_400_000
    timeline = Timeline(
        untimed=0,
        total=3,
        bin_width_ms=1000,
        first_bin_ms=moment,
        last_bin_ms=moment,
        counts={("LOST", moment): 1, ("DIVERGED", moment): 2},
    )
    figure = timeline_figure(timeline, ["LOST", "DIVERGED"])
    (ax,) = figure.axes
    left, right = ax.get_xlim()
    assert (right - left) * 86_400_000 == pytest.approx(3 * 1000)  # the bin, and one either side
    bars = sorted((p.get_y(), p.get_height()) for p in ax.patches if isinstance(p, Rectangle))
    assert bars == [(0, 1), (1, 2)]  # DIVERGED on top of LOST, not behind it
