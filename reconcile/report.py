"""What one reconciliation run leaves behind, in its own directory `out_dir`:

  summary.json     the run's summary (keys: see kdiv.reconcile.prometheus) plus, from the findings,
                   `counts` {class: finding rows}, `records` {class: records the findings
                   stand for} and `by_topic` {topic: {class: finding rows}}; with TiCDC
                   changefeeds, `changefeeds` {topic: rows per verdict and per table}; with
                   pipeline routes, `routes` {route: traces per outcome, and per hop}
  discrepancies/   Parquet of every finding (FINDINGS_SCHEMA, plus CHECKSUM_COLUMNS and
                   ROUTE_COLUMNS when the findings carry them, as the job's do), partitioned
                   topic=.../class=...
  sequences/       Parquet of the per producer-partition sequence comparison, when there is one
  report.html      one self-contained page for a person: inline CSS, plots as inline SVG,
                   no script and nothing fetched from anywhere

`out_dir` holds one run: writing a report there replaces the Parquet a previous run left.
Aggregations run in Spark; only aggregates and capped samples reach the driver. summary.json
and report.html depend on nothing but the inputs (no clock, no path, no random id), so a
rerun on the same inputs writes the same bytes and two nights' reports diff cleanly.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from pyspark.sql import DataFrame, Row, Window
from pyspark.sql import functions as F

from kdiv.clock import LAST_RENDERABLE_MS, renderable_ms
from kdiv.config.redact import redacted
from kdiv.reconcile.findings import (
    CHECKSUM_CLASSES,
    CHECKSUM_FIELDS,
    CHECKSUM_MISMATCH,
    CLASSES,
    CORRUPTED_FLAG,
    DIVERGED,
    FINDING_FIELDS,
    LOST,
    MALFORMED,
    ROUTE_CLASSES,
    ROUTE_DUPLICATED,
    ROUTE_FIELDS,
    ROUTE_LOST,
    SCHEMA_UNKNOWN,
    SEQUENCE_BEHIND,
    SUBJECT_MISMATCH,
    UNREADABLE,
    UNVALIDATED,
    with_report_columns,
)

STATUS_CLEAN = "clean"
STATUS_DISCREPANCIES = "discrepancies"
STATUS_FAILED = "failed"
STATUSES = (STATUS_CLEAN, STATUS_DISCREPANCIES, STATUS_FAILED)

SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
DISCREPANCIES_DIR = "discrepancies"
SEQUENCES_DIR = "sequences"

SEQUENCE_FIELDS = (
    "topic",
    "partition",
    "producer",
    "topic_segment",
    "topic_seq",
    "table_segment",
    "table_seq",
    "behind",
)

# Caps that keep the page readable and the driver's share small whatever the findings' number.
FINDINGS_SHOWN_PER_CLASS = 50
SEQUENCE_ROWS_SHOWN = 200
TOPICS_PLOTTED = 12
TIME_BINS_MAX = 60
KEY_TEXT_CHARS = 40
KEY_HEX_BYTES = 24
DETAIL_CHARS = 500

CLASS_MEANINGS = {
    LOST: "validated record no longer in the topic (or the key gone without a tombstone)",
    UNVALIDATED: "record in the topic the validator passed without seeing",
    DIVERGED: "record at the validated offset is not the record validated (CRC32 differs)",
    SEQUENCE_BEHIND: "producer's highest (segment, seq) in the topic is below the table's",
    SUBJECT_MISMATCH: "restored state carries a schema id not registered under its changelog's subject",
    SCHEMA_UNKNOWN: "restored state carries a schema id the registry does not know",
    UNREADABLE: "changelog value the job cannot read (not framed, or not kdiv state)",
}
# One colour per class, the same in every plot, so a class reads alike across topics.
CLASS_COLOURS = {
    LOST: "#d62728",
    UNVALIDATED: "#ff7f0e",
    DIVERGED: "#9467bd",
    SEQUENCE_BEHIND: "#1f77b4",
    SUBJECT_MISMATCH: "#8c564b",
    SCHEMA_UNKNOWN: "#7f7f7f",
    UNREADABLE: "#e377c2",
}
# The changefeed classes, reported only by runs that verify changefeeds (summary["changefeeds"]).
CHECKSUM_CLASS_MEANINGS = {
    CHECKSUM_MISMATCH: "changefeed row whose TiCDC row checksum does not match its columns",
    CORRUPTED_FLAG: "changefeed row TiCDC itself flagged corrupted (its checksum disagreed with TiDB's)",
    MALFORMED: "changefeed record that cannot be read as a TiCDC message (or its writer schema is unknown)",
}
CHECKSUM_CLASS_COLOURS = {CHECKSUM_MISMATCH: "#843c39", CORRUPTED_FLAG: "#393b79", MALFORMED: "#637939"}
# The route classes, reported only by runs that check pipeline routes (summary["routes"]).
ROUTE_CLASS_MEANINGS = {
    ROUTE_LOST: "traced record a route's processor committed past and never wrote on (replay it from its offset)",
    ROUTE_DUPLICATED: "traced record a route's processor wrote more than once",
}
ROUTE_CLASS_COLOURS = {ROUTE_LOST: "#ad494a", ROUTE_DUPLICATED: "#e7969c"}
_MEANINGS = {**CLASS_MEANINGS, **CHECKSUM_CLASS_MEANINGS, **ROUTE_CLASS_MEANINGS}
_COLOURS = {**CLASS_COLOURS, **CHECKSUM_CLASS_COLOURS, **ROUTE_CLASS_COLOURS}
_SPARE_COLOURS = ("#bcbd22", "#17becf", "#2ca02c")
# Row checksum verdicts, in the order the changefeed table shows them.
CHECKSUM_VERDICTS = ("OK", CHECKSUM_MISMATCH, CORRUPTED_FLAG, "SKIPPED", MALFORMED)
# A route hop's counts (summary["routes"][route]["hops"]), in the order the routes table shows them.
ROUTE_HOP_COUNTS = ("traced_in", "traced_out", "delivered", "lost", "duplicated", "pending")

_SECOND_MS = 1_000
_MINUTE_MS = 60 * _SECOND_MS
_HOUR_MS = 60 * _MINUTE_MS
_DAY_MS = 24 * _HOUR_MS
_BIN_WIDTHS_MS = (
    _SECOND_MS,
    10 * _SECOND_MS,
    _MINUTE_MS,
    5 * _MINUTE_MS,
    15 * _MINUTE_MS,
    _HOUR_MS,
    3 * _HOUR_MS,
    6 * _HOUR_MS,
    12 * _HOUR_MS,
    _DAY_MS,
    7 * _DAY_MS,
    30 * _DAY_MS,
    365 * _DAY_MS,
)

# Text is drawn as paths (matplotlib's default) so the page needs no font, and is never parsed
# as mathtext: a "$" in a topic name is text. (_svg fixes the id salt and drops the date.)
_PLOT_RC = {"svg.fonttype": "path", "text.parse_math": False, "font.size": 9}


@dataclass(frozen=True)
class ReportFiles:
    summary_json: Path
    report_html: Path
    discrepancies: Path | None
    sequences: Path | None
    # The summary as written to summary_json: the input plus counts, records, by_topic, status.
    summary: dict[str, Any]


def write_report(
    findings: DataFrame, sequences: DataFrame | None, summary: Mapping[str, Any], out_dir: Path
) -> ReportFiles:
    """Write summary.json, discrepancies/, sequences/ (when `sequences` is given) and
    report.html into `out_dir`.

    `findings`: rows of FINDINGS_SCHEMA, with or without CHECKSUM_COLUMNS and ROUTE_COLUMNS
    (the Parquet keeps the columns given). `sequences`: rows with SEQUENCE_FIELDS (extra
    columns are dropped). `summary`: the run's summary as the caller knows it; its `status`
    may be left out (it follows from the findings) or be "failed", but "clean" with findings
    or "discrepancies" without is a contradiction and raises ValueError before anything is
    written.
    """
    out_dir = Path(out_dir)
    findings_cached_here = not findings.is_cached
    written_fields = FINDING_FIELDS + tuple(name for name in CHECKSUM_FIELDS + ROUTE_FIELDS if name in findings.columns)
    # Every column from here on, so the page reads one row shape whatever the caller gave.
    findings = with_report_columns(findings)
    if findings_cached_here:
        findings = findings.persist()
    sequences_cached_here = sequences is not None and not sequences.is_cached
    if sequences is not None:
        sequences = sequences.select(*SEQUENCE_FIELDS)
        if sequences_cached_here:
            sequences = sequences.persist()
    try:
        class_counts = _class_counts(findings)
        full_summary = _summary_with_counts(summary, class_counts)
        out_dir.mkdir(parents=True, exist_ok=True)

        discrepancies_dir = out_dir / DISCREPANCIES_DIR
        if class_counts:
            _write_findings_parquet(findings.select(*written_fields), discrepancies_dir)
        else:
            _write_empty_findings_parquet(findings.select(*written_fields), discrepancies_dir)
        sequences_dir: Path | None = out_dir / SEQUENCES_DIR
        sequence_sample = None
        if sequences is not None:
            _write_sequences_parquet(sequences, out_dir / SEQUENCES_DIR)
            sequence_sample = _sequence_sample(sequences)
        else:
            _remove_stale(out_dir / SEQUENCES_DIR)
            sequences_dir = None

        page = _render_report(
            full_summary,
            partition_counts=_partition_counts(findings),
            timeline=_timeline(findings),
            first_findings=_first_findings(findings),
            sequence_sample=sequence_sample,
        )
    finally:
        if findings_cached_here:
            findings.unpersist()
        if sequences_cached_here and sequences is not None:
            sequences.unpersist()

    summary_path = out_dir / SUMMARY_JSON
    html_path = out_dir / REPORT_HTML
    _write_text(summary_path, _summary_json(full_summary))
    _write_text(html_path, page)
    return ReportFiles(summary_path, html_path, discrepancies_dir, sequences_dir, full_summary)


def write_failure_report(summary: Mapping[str, Any], out_dir: Path) -> ReportFiles:
    """Write summary.json (status "failed") and a small report.html naming summary["error"]
    for a run that ended without findings to report. Parquet a previous run left in `out_dir`
    is removed: it would pass for this run's."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    full_summary = {**summary, "status": STATUS_FAILED}
    if isinstance(summary.get("error"), str):  # an error text may quote a URL with its user info
        full_summary["error"] = redacted(summary["error"])
    for stale in (DISCREPANCIES_DIR, SEQUENCES_DIR):
        _remove_stale(out_dir / stale)
    summary_path = out_dir / SUMMARY_JSON
    html_path = out_dir / REPORT_HTML
    _write_text(summary_path, _summary_json(full_summary))
    _write_text(html_path, _render_failure(full_summary))
    return ReportFiles(summary_path, html_path, None, None, full_summary)


# --- Spark: writes and the small aggregates the report draws -------------------------------


def _write_findings_parquet(findings: DataFrame, path: Path) -> None:
    # One task per (topic, class), rows in offset order: each directory gets one file whose
    # contents depend only on the findings.
    (
        findings.repartition("topic", "class")
        .sortWithinPartitions("topic", "class", "partition", "offset", "key")
        .write.mode("overwrite")
        .partitionBy("topic", "class")
        .parquet(str(path))
    )


def _write_empty_findings_parquet(findings: DataFrame, path: Path) -> None:
    # No rows: partitionBy would leave only _SUCCESS, which no reader can take a schema from
    # (Spark: UNABLE_TO_INFER_SCHEMA; pandas: no columns). One empty file keeps every column.
    findings.limit(0).coalesce(1).write.mode("overwrite").parquet(str(path))


def _write_sequences_parquet(sequences: DataFrame, path: Path) -> None:
    # repartition, not coalesce: coalesce(1) would run the whole upstream scan in one task.
    (
        sequences.repartition(1)
        .sortWithinPartitions("topic", "partition", "producer")
        .write.mode("overwrite")
        .parquet(str(path))
    )


@dataclass(frozen=True, order=True)
class _ClassCount:
    topic: str
    cls: str
    findings: int
    records: int


def _class_counts(findings: DataFrame) -> list[_ClassCount]:
    rows = (
        findings.groupBy("topic", "class")
        .agg(F.count(F.lit(1)).alias("findings"), F.sum("count").alias("records"))
        .collect()
    )
    return sorted(_ClassCount(r["topic"], r["class"], r["findings"], r["records"] or 0) for r in rows)


def _partition_counts(findings: DataFrame) -> list[tuple[str, int, str, int]]:
    rows = findings.groupBy("topic", "partition", "class").count().collect()
    return sorted((r["topic"], r["partition"], r["class"], r["count"]) for r in rows)


@dataclass(frozen=True)
class _Timeline:
    untimed: int
    total: int
    bin_width_ms: int
    first_bin_ms: int
    last_bin_ms: int
    # (class, bin start ms) -> findings
    counts: dict[tuple[str, int], int]


def _timeline(findings: DataFrame) -> _Timeline:
    timestamp = F.col("timestamp_ms")
    # A time no date can show (a producer clock gone wrong) is not plotted: it would stretch
    # the axis past what the plot's dates hold.
    timed = (timestamp >= 0) & (timestamp <= LAST_RENDERABLE_MS)
    stats = findings.agg(
        F.min(F.when(timed, timestamp)).alias("first"),
        F.max(F.when(timed, timestamp)).alias("last"),
        F.count(F.when(~timed, 1)).alias("untimed"),
        F.count(F.lit(1)).alias("total"),
    ).first()
    assert stats is not None, "an aggregation without grouping has one row"
    if stats["first"] is None:
        return _Timeline(stats["untimed"], stats["total"], 0, 0, 0, {})
    width = _bin_width_ms(stats["last"] - stats["first"])
    rows = findings.where(timed).groupBy((timestamp - timestamp % width).alias("bin"), "class").count().collect()
    return _Timeline(
        stats["untimed"],
        stats["total"],
        width,
        stats["first"] - stats["first"] % width,
        stats["last"] - stats["last"] % width,
        {(r["class"], r["bin"]): r["count"] for r in rows},
    )


def _bin_width_ms(span_ms: int) -> int:
    for width in _BIN_WIDTHS_MS:
        if span_ms // width < TIME_BINS_MAX:
            return width
    days = -(-span_ms // (TIME_BINS_MAX * _DAY_MS)) + 1
    return days * _DAY_MS


# Every column, so the ranking is a total order and the sample the same on every run.
_FINDING_ORDER = (
    "topic",
    "partition",
    "offset",
    "key",
    "producer",
    "segment",
    "seq",
    "timestamp_ms",
    "count",
    "schema_id",
    "expected_subject",
    "registered_subjects",
    "detail",
    *CHECKSUM_FIELDS,
    # The copies are a list: the other columns order the findings of routes fully without them.
    *(name for name in ROUTE_FIELDS if name != "copies"),
)


def _first_findings(findings: DataFrame) -> dict[str, list[Row]]:
    ranking = Window.partitionBy("class").orderBy(*_FINDING_ORDER)
    rows = (
        findings.withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= FINDINGS_SHOWN_PER_CLASS)
        .collect()
    )
    by_class: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda r: (r["class"], r["rank"])):
        by_class.setdefault(row["class"], []).append(row)
    return by_class


@dataclass(frozen=True)
class _SequenceSample:
    total: int
    behind: int
    rows: list[Row]


def _sequence_sample(sequences: DataFrame) -> _SequenceSample:
    stats = sequences.agg(F.count(F.lit(1)).alias("total"), F.count(F.when(F.col("behind"), 1)).alias("behind")).first()
    assert stats is not None, "an aggregation without grouping has one row"
    rows = (
        sequences.orderBy(F.col("behind").desc_nulls_last(), *SEQUENCE_FIELDS[:-1]).limit(SEQUENCE_ROWS_SHOWN).collect()
    )
    return _SequenceSample(stats["total"], stats["behind"], rows)


# --- summary.json ----------------------------------------------------------------------------


def _summary_with_counts(summary: Mapping[str, Any], class_counts: Sequence[_ClassCount]) -> dict[str, Any]:
    classes = _classes_present(
        (c.cls for c in class_counts), checksums="changefeeds" in summary, routes="routes" in summary
    )
    counts = dict.fromkeys(classes, 0)
    records = dict.fromkeys(classes, 0)
    # Every topic the run covered, zeros included, so a gauge falls back to 0 when its
    # discrepancies are gone instead of vanishing.
    by_topic = {topic: dict.fromkeys(classes, 0) for topic in _run_topics(summary)}
    for c in class_counts:
        counts[c.cls] += c.findings
        records[c.cls] += c.records
        by_topic.setdefault(c.topic, dict.fromkeys(classes, 0))[c.cls] += c.findings
    total = sum(counts.values())
    found = STATUS_DISCREPANCIES if total else STATUS_CLEAN
    status = summary.get("status", found)
    if status not in STATUSES:
        raise ValueError(f"summary status {status!r} is none of {STATUSES}")
    if status != STATUS_FAILED and status != found:
        raise ValueError(f"summary status {status!r} contradicts the findings: {total} finding rows")
    return {**summary, "status": status, "counts": counts, "records": records, "by_topic": by_topic}


def _classes_present(found: Iterable[str], checksums: bool = False, routes: bool = False) -> list[str]:
    """CLASSES in their order (then CHECKSUM_CLASSES, for a run that verified changefeeds, and
    ROUTE_CLASSES, for one that checked routes), then any other class the findings carry: a
    class this module does not know is still reported, never dropped."""
    known = [*CLASSES, *(CHECKSUM_CLASSES if checksums else ()), *(ROUTE_CLASSES if routes else ())]
    return [*known, *sorted(set(found) - set(known))]


def _run_topics(summary: Mapping[str, Any]) -> list[str]:
    topics = set(summary.get("records_read") or {})
    topics.update(summary.get("topics") or ())
    return sorted(topics)


def _summary_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _write_text(path: Path, text: str) -> None:
    # Written beside and renamed, so a reader (a dashboard, a collector) never sees half a file.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8", newline="\n")
    os.replace(partial, path)


def _remove_stale(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)


# --- report.html -----------------------------------------------------------------------------


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1f2328;
 max-width:80rem;margin:1.5rem auto;padding:0 1rem;line-height:1.45}
h1{font-size:1.5rem;padding:.6rem 1rem;border-radius:.4rem;margin:0 0 .4rem}
h1.clean{background:#dafbe1;color:#116329}
h1.discrepancies{background:#ffebe9;color:#a40e26}
h1.failed{background:#fff1e5;color:#953800}
h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
h3{font-size:1rem;margin-bottom:.2rem}
table{border-collapse:collapse;margin:.4rem 0 1rem;font-size:.85rem}
th,td{border:1px solid #d0d7de;padding:.2rem .5rem;text-align:left;vertical-align:top}
thead th{background:#f6f8fa}
.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td,tr.total th{font-weight:600;background:#f6f8fa}
tr.behind td{background:#ffebe9}
td.detail{max-width:40rem;overflow-wrap:anywhere}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85em}
pre{background:#f6f8fa;padding:.6rem;border-radius:.3rem;white-space:pre-wrap;overflow-wrap:anywhere}
figure{margin:.5rem 0 1rem}
figure svg{max-width:100%;height:auto}
.note{color:#59636e}
.swatch{display:inline-block;width:.7em;height:.7em;margin-right:.3em;border-radius:.15em}
""".strip()


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: Sequence[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title>",
            f"<style>\n{_CSS}\n</style>",
            "</head>",
            "<body>",
            *body,
            "</body>",
            "</html>",
            "",
        ]
    )


def _table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    table_id: str,
    column_classes: Mapping[int, str] | None = None,
    row_classes: Sequence[str] | None = None,
) -> str:
    """An HTML table of already escaped cell markup; `column_classes`: CSS class per column index."""
    column_classes = column_classes or {}

    def cell(tag: str, index: int, markup: str) -> str:
        css = column_classes.get(index)
        return f'<{tag} class="{css}">{markup}</{tag}>' if css else f"<{tag}>{markup}</{tag}>"

    lines = [
        f'<table id="{_e(table_id)}">',
        "<thead><tr>" + "".join(cell("th", i, _e(h)) for i, h in enumerate(header)) + "</tr></thead>",
        "<tbody>",
    ]
    for index, row in enumerate(rows):
        css = row_classes[index] if row_classes else ""
        opening = f'<tr class="{css}">' if css else "<tr>"
        lines.append(opening + "".join(cell("td", i, markup) for i, markup in enumerate(row)) + "</tr>")
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)


def _int(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _utc(ms: int | None) -> str:
    if ms is None or (isinstance(ms, int) and ms < 0):
        return "—"
    if not renderable_ms(ms):
        return f"{ms} ms (out of range)"
    moment = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=(ms % 1000) * 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"


def _width_label(ms: int) -> str:
    for unit_ms, unit in ((_DAY_MS, "day"), (_HOUR_MS, "h"), (_MINUTE_MS, "min"), (_SECOND_MS, "s")):
        if ms % unit_ms == 0:
            n = ms // unit_ms
            return f"{n} {unit}s" if unit == "day" and n != 1 else f"{n} {unit}"
    return f"{ms} ms"


def _key(key: bytes | bytearray | None) -> str:
    """Escaped markup for a record key: its text when it is printable UTF-8, else its bytes in hex."""
    if key is None:
        return '<span class="note">(none)</span>'
    key = bytes(key)
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        shown = text if len(text) <= KEY_TEXT_CHARS else text[:KEY_TEXT_CHARS] + "…"
        return f"<code>{_e(shown)}</code>"
    shown = key[:KEY_HEX_BYTES].hex() + ("…" if len(key) > KEY_HEX_BYTES else "")
    return f'<code title="{len(key)} bytes, shown in hex">0x{shown}</code>'


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _colour(cls: str, classes: Sequence[str]) -> str:
    if cls in _COLOURS:
        return _COLOURS[cls]
    spares = [c for c in classes if c not in _COLOURS]
    return _SPARE_COLOURS[spares.index(cls) % len(_SPARE_COLOURS)]


def _run_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    snapshot = summary.get("snapshot") or {}
    records_read = summary.get("records_read") or {}
    topics = _run_topics(summary)
    rows = [
        ("Status", _e(summary.get("status", "—"))),
        ("Snapshot taken", _e(_utc(snapshot.get("taken_at_ms")))),
        ("Finished", _e(_utc(summary.get("finished_at_ms")))),
        ("Duration", _e(_duration(summary.get("duration_s")))),
        ("Topics", f"{len(topics):,}: " + ", ".join(f"<code>{_e(t)}</code>" for t in topics) if topics else "—"),
        ("Records read", _e(_int(sum(records_read.values())) if records_read else "—")),
    ]
    if "exit_code" in summary:
        rows.append(("Exit code", _e(summary["exit_code"])))
    return rows


def _run_table(summary: Mapping[str, Any]) -> str:
    lines = ['<table id="run">']
    lines += [f"<tr><th>{_e(name)}</th><td>{markup}</td></tr>" for name, markup in _run_rows(summary)]
    lines.append("</table>")
    return "\n".join(lines)


def _render_report(
    summary: Mapping[str, Any],
    *,
    partition_counts: list[tuple[str, int, str, int]],
    timeline: _Timeline,
    first_findings: dict[str, list[Row]],
    sequence_sample: _SequenceSample | None,
) -> str:
    counts: dict[str, int] = summary["counts"]
    records: dict[str, int] = summary["records"]
    by_topic: dict[str, dict[str, int]] = summary["by_topic"]
    classes = list(counts)
    total = sum(counts.values())
    status = summary["status"]

    body = [f'<h1 class="{_e(status)}">{_e(_headline(status, total))}</h1>']
    if status == STATUS_FAILED:
        body.append(f"<pre>{_e(summary.get('error') or '(no error message given)')}</pre>")
    elif total == 0:
        body.append("<p>Clean: every topic reconciled with the validator's tables; no finding in any class.</p>")
    else:
        topics_found = sum(1 for per_class in by_topic.values() if any(per_class.values()))
        classes_found = sum(1 for n in counts.values() if n)
        standing_for = sum(records.values())
        # Topics here include the state changelogs a finding may be on, which the run table
        # does not list among the watched topics: only those with findings are counted.
        body.append(
            f"<p>{_int(total)} finding row{'' if total == 1 else 's'} standing for {_int(standing_for)} "
            f"record{'' if standing_for == 1 else 's'}, in {classes_found} class{'' if classes_found == 1 else 'es'} "
            f"across {topics_found} topic{'' if topics_found == 1 else 's'}.</p>"
        )

    body += ["<h2>Run</h2>", _run_table(summary)]

    body.append("<h2>Findings by class</h2>")
    class_rows = [
        (
            f'<span class="swatch" style="background:{_colour(c, classes)}"></span>{_e(c)}',
            _int(counts[c]),
            _int(records[c]),
            _e(_MEANINGS.get(c, "")),
        )
        for c in classes
    ]
    class_rows.append(("All classes", _int(total), _int(sum(records.values())), ""))
    body.append(
        _table(
            ("Class", "Findings", "Records", "Meaning"),
            class_rows,
            table_id="counts-by-class",
            column_classes={1: "num", 2: "num"},
            row_classes=[""] * len(classes) + ["total"],
        )
    )

    body.append("<h2>Findings by topic and class</h2>")
    records_read = summary.get("records_read") or {}
    changelog_records_read = summary.get("changelog_records_read") or {}
    topic_rows = []
    for topic in sorted(by_topic):
        per_class = by_topic[topic]
        read = records_read.get(topic, changelog_records_read.get(topic))
        topic_rows.append(
            (
                f"<code>{_e(topic)}</code>",
                _int(read),
                *(_int(per_class.get(c, 0)) for c in classes),
                _int(sum(per_class.values())),
            )
        )
    topic_rows.append(
        (
            "All topics",
            _int(sum(records_read.values())) if records_read else "—",
            *(_int(counts[c]) for c in classes),
            _int(total),
        )
    )
    body.append(
        _table(
            ("Topic", "Records read", *classes, "All classes"),
            topic_rows,
            table_id="counts-by-topic",
            column_classes=dict.fromkeys(range(1, len(classes) + 3), "num"),
            row_classes=[""] * (len(topic_rows) - 1) + ["total"],
        )
    )

    if "changefeeds" in summary:
        body.append("<h2>Changefeed row checksums</h2>")
        body += _changefeed_section(summary["changefeeds"] or {})

    if "routes" in summary:
        body.append("<h2>Pipeline routes at rest</h2>")
        body += _routes_section(summary["routes"] or {})

    body.append("<h2>Findings by partition</h2>")
    if total == 0:
        body.append('<p class="note">No findings, so nothing to plot.</p>')
    else:
        body.append(_plot_by_partition(partition_counts, classes))

    body.append("<h2>Findings over time</h2>")
    body += _timeline_section(timeline, classes)

    body.append("<h2>Findings</h2>")
    if total == 0:
        body.append('<p class="note">No findings.</p>')
    for cls in classes:
        if counts[cls]:
            body += _findings_section(cls, counts[cls], first_findings.get(cls, []))

    if sequence_sample is not None:
        body.append("<h2>Producer sequences: topic vs table</h2>")
        body += _sequence_section(sequence_sample)

    return _page(f"kdiv reconciliation: {_headline(status, total)}", body)


def _headline(status: str, total: int) -> str:
    if status == STATUS_FAILED:
        return "Failed"
    if total == 0:
        return "Clean: no discrepancies"
    return f"{total:,} discrepanc{'y' if total == 1 else 'ies'}"


_OPTIONAL_COLUMN_TITLES = {
    "producer": "Producer",
    "segment": "Segment",
    "seq": "Seq",
    "schema_id": "Schema id",
    "expected_subject": "Expected subject",
    "registered_subjects": "Registered subjects",
    "table": "Table",
    "row_key": "Row key",
    "image": "Image",
    "commit_ts": "Commit ts",
    "expected_checksum": "Expected checksum",
    "computed_checksum": "Computed checksum",
    "route": "Route",
    "hop": "Hop",
    "group": "Group",
    "trace_id": "Trace",
    "committed_offset": "Committed offset",
    "copies": "Copies",
}
# Identifiers rather than quantities: shown whole, without thousands separators.
_NUMBERED_IDS = ("commit_ts", "expected_checksum", "computed_checksum")


def _findings_section(cls: str, count: int, rows: list[Row]) -> list[str]:
    shown = len(rows)
    plural = "finding" if count == 1 else "findings"
    heading = f"{cls}: {count:,} {plural}" if shown == count else f"{cls}: first {shown:,} of {count:,} findings"
    # Class-specific columns no shown row fills would only be a wall of dashes.
    optional = [name for name in _OPTIONAL_COLUMN_TITLES if any(r[name] is not None for r in rows)]
    header = (
        "Topic",
        "Partition",
        "Offset",
        "Key",
        *(_OPTIONAL_COLUMN_TITLES[name] for name in optional),
        "Record time",
        "Count",
        "Detail",
    )

    def optional_cell(row: Row, name: str) -> str:
        value = row[name]
        if value is None:
            return "—"
        if name == "registered_subjects":
            return ", ".join(f"<code>{_e(s)}</code>" for s in value) or '<span class="note">(none)</span>'
        if name == "copies":
            return "<br>".join(_copy(copy) for copy in value)
        if name in ("producer", "expected_subject", "table", "row_key", "route", "group", "trace_id"):
            return f"<code>{_e(value)}</code>"
        if name in _NUMBERED_IDS or name == "image":
            return _e(value)
        return _int(value)

    table_rows = [
        (
            f"<code>{_e(r['topic'])}</code>",
            _int(r["partition"]),
            _int(r["offset"]),
            _key(r["key"]),
            *(optional_cell(r, name) for name in optional),
            _e(_utc(r["timestamp_ms"])),
            _int(r["count"]),
            _e(_clip(r["detail"], DETAIL_CHARS)),
        )
        for r in rows
    ]
    numeric = {1, 2, len(header) - 2} | {
        4 + i
        for i, name in enumerate(optional)
        if name in ("segment", "seq", "schema_id", "hop", "committed_offset", *_NUMBERED_IDS)
    }
    return [
        f"<h3>{_e(heading)}</h3>",
        f'<p class="note">{_e(_MEANINGS.get(cls, ""))}. Ordered by topic, partition, offset.</p>',
        _table(
            header,
            table_rows,
            table_id=f"findings-{cls.lower()}",
            column_classes={**dict.fromkeys(numeric, "num"), len(header) - 1: "detail"},
        ),
    ]


def _changefeed_section(changefeeds: Mapping[str, Any]) -> list[str]:
    """Row images verified per topic and table, by verdict (summary["changefeeds"])."""
    if not changefeeds:
        return ['<p class="note">No changefeed topic was found on the cluster.</p>']
    verdicts = list(CHECKSUM_VERDICTS)
    for topic_summary in changefeeds.values():
        verdicts += [v for v in topic_summary.get("rows", {}) if v not in verdicts]
    rows: list[tuple[str, ...]] = []
    row_classes: list[str] = []
    notes = []
    for topic in sorted(changefeeds):
        entry = changefeeds[topic]
        protocol = _e(entry.get("protocol", "—"))
        for table, per_verdict in sorted((entry.get("tables") or {}).items()):
            rows.append(
                (
                    f"<code>{_e(topic)}</code>",
                    f"<code>{_e(table)}</code>",
                    protocol,
                    _int(sum(per_verdict.values())),
                    *(_int(per_verdict.get(v, 0)) for v in verdicts),
                )
            )
            row_classes.append("")
        totals = entry.get("rows") or {}
        rows.append(
            (
                f"<code>{_e(topic)}</code>",
                "All tables",
                protocol,
                _int(sum(totals.values())),
                *(_int(totals.get(v, 0)) for v in verdicts),
            )
        )
        row_classes.append("total")
        skipped = entry.get("skipped") or {}
        if skipped:
            reasons = ", ".join(f"{_e(reason)}: {_int(n)}" for reason, n in sorted(skipped.items()))
            notes.append(f'<p class="note">Skipped in <code>{_e(topic)}</code>: {reasons}.</p>')
    return [
        '<p class="note">Every row image of the changefeed topics\' snapshot, verified by its TiCDC row '
        "checksum (a Simple UPDATE has two images). SKIPPED rows were not verified, for the reasons below.</p>",
        _table(
            ("Topic", "Table", "Protocol", "Rows", *verdicts),
            rows,
            table_id="changefeed-rows",
            column_classes=dict.fromkeys(range(3, len(verdicts) + 4), "num"),
            row_classes=row_classes,
        ),
        *notes,
    ]


def _copy(copy: Row) -> str:
    """Escaped markup for one position of a trace: a topic's record, or a file sink's."""
    if copy["file"] is None:
        return f"<code>{_e(copy['topic'])}[{copy['partition']}]@{copy['offset']}</code>"
    if copy["partition"] is not None:
        at = f"[{copy['partition']}]@{copy['offset']}"
        return f'<code title="{_e(copy["file"])}">{_e(copy["topic"])}{_e(at)}</code>'
    return f"<code>{_e(copy['file'])}</code> row {_int(copy['row'])}"


def _routes_section(routes: Mapping[str, Any]) -> list[str]:
    """Traces per route and hop, by outcome (summary["routes"])."""
    if not routes:
        return ['<p class="note">No route is configured.</p>']
    header = (
        "Route",
        "Hop",
        "From",
        "Group",
        "To",
        "Traced in",
        "Traced out",
        "Delivered",
        "Lost",
        "Duplicated",
        "Pending",
    )
    rows: list[tuple[str, ...]] = []
    row_classes: list[str] = []
    notes = []

    def names(values: Sequence[str]) -> str:
        return " | ".join(f"<code>{_e(v)}</code>" for v in values)

    for name in sorted(routes):
        entry = routes[name]
        for hop in entry.get("hops") or ():
            rows.append(
                (
                    f"<code>{_e(name)}</code>",
                    _int(hop.get("hop")),
                    names(hop.get("from") or ()),
                    f"<code>{_e(hop.get('group', '—'))}</code>",
                    names(hop.get("to") or ()),
                    *(_int(hop.get(count)) for count in ROUTE_HOP_COUNTS),
                )
            )
            row_classes.append("")
            if not hop.get("group_known", True):
                notes.append(
                    f'<p class="note">Route <code>{_e(name)}</code>, hop {_int(hop.get("hop"))}: the cluster does '
                    f"not know group <code>{_e(hop.get('group'))}</code>, so it has committed nothing: its traces "
                    "are pending, never lost.</p>"
                )
        rows.append(
            (
                f"<code>{_e(name)}</code>",
                "All hops",
                "",
                "",
                "",
                _int(entry.get("traced")),
                "",
                *(_int(entry.get(count)) for count in ROUTE_HOP_COUNTS[2:]),
            )
        )
        row_classes.append("total")
        if entry.get("file_sinks"):
            live = (
                "the live worker judges it up to its last topic"
                if entry.get("live_hops")
                else "the live worker does not judge it (its one hop writes files)"
            )
            notes.append(
                f'<p class="note">Route <code>{_e(name)}</code> ends in files ({names(entry["file_sinks"])}), '
                f"read as they were when the job ran; {live}.</p>"
            )
        if entry.get("unreadable_trace_headers"):
            first = entry.get("first_unreadable_trace_header") or {}
            notes.append(
                f'<p class="note">Route <code>{_e(name)}</code>: {_int(entry["unreadable_trace_headers"])} records '
                f"carry a trace header that cannot be read, and are not followed; the first on "
                f"<code>{_e(first.get('topic'))}</code>: {_e(first.get('detail'))}.</p>"
            )
    return [
        '<p class="note">Every traced record of the routes\' topics, followed across the hops and judged as the '
        "live audit judges it, against each group's committed offsets read before the snapshot. Traced in and "
        "out: traces seen at the hop's input and output. Pending: traces waiting on the hop (its group has not "
        "committed past them): lag, not loss.</p>",
        _table(
            header,
            rows,
            table_id="route-hops",
            column_classes=dict.fromkeys(range(5, len(header)), "num"),
            row_classes=row_classes,
        ),
        *notes,
    ]


def _sequence_section(sample: _SequenceSample) -> list[str]:
    shown = len(sample.rows)
    intro = (
        f"{sample.total:,} producer-partitions compared, {sample.behind:,} with the topic behind the table. "
        + ("All shown" if shown == sample.total else f"First {shown:,} shown")
        + ", those behind first."
    )
    header = ("Topic", "Partition", "Producer", "Topic segment", "Topic seq", "Table segment", "Table seq", "Behind")
    rows = [
        (
            f"<code>{_e(r['topic'])}</code>",
            _int(r["partition"]),
            f"<code>{_e(r['producer'])}</code>" if r["producer"] is not None else "—",
            _int(r["topic_segment"]),
            _int(r["topic_seq"]),
            _int(r["table_segment"]),
            _int(r["table_seq"]),
            "behind" if r["behind"] else "no",
        )
        for r in sample.rows
    ]
    return [
        f"<p>{_e(intro)}</p>",
        _table(
            header,
            rows,
            table_id="sequences",
            column_classes=dict.fromkeys((1, 3, 4, 5, 6), "num"),
            row_classes=["behind" if r["behind"] else "" for r in sample.rows],
        ),
    ]


def _timeline_section(timeline: _Timeline, classes: Sequence[str]) -> list[str]:
    if timeline.total == 0:
        return ['<p class="note">No findings, so nothing to plot.</p>']
    if not timeline.counts:
        return [
            f'<p class="note">None of the {timeline.total:,} findings carries a record time '
            "a date can show (timestamp -1, or out of range), so there is nothing to plot.</p>"
        ]
    lines = [_plot_timeline(timeline, classes)]
    if timeline.untimed:
        one = timeline.untimed == 1
        lines.append(
            f'<p class="note">{timeline.untimed:,} of {timeline.total:,} findings '
            f"{'carries' if one else 'carry'} no record time (timestamp -1) or one out of the range dates "
            "show (producer clocks gone wrong), and "
            f"{'is' if one else 'are'} not plotted.</p>"
        )
    return lines


# --- plots -----------------------------------------------------------------------------------


def _svg(figure: Figure, salt: str) -> str:
    """The figure as an inline <svg> element (no XML prolog or DOCTYPE, which belong to files)."""
    buffer = io.StringIO()
    # Each plot salts its ids differently: both SVGs share one HTML document and its id space.
    with matplotlib.rc_context({"svg.hashsalt": f"kdiv-reconcile-{salt}"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    # The RDF metadata only names namespaces by URL; the page is plainer without it.
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", text[text.index("<svg") :], flags=re.DOTALL).strip()
    return f"<figure>\n{svg}\n</figure>"


def _plot_by_partition(partition_counts: list[tuple[str, int, str, int]], classes: Sequence[str]) -> str:
    topics = sorted({topic for topic, _, _, _ in partition_counts})
    plotted = topics[:TOPICS_PLOTTED]
    with matplotlib.rc_context(_PLOT_RC):  # type: ignore[arg-type]  # the stubs want literal rc keys
        figure = Figure(figsize=(9, 0.9 + 2.1 * len(plotted)), layout="constrained")
        axes = figure.subplots(len(plotted), 1, squeeze=False)[:, 0]
        drawn: list[str] = []
        for ax, topic in zip(axes, plotted, strict=False):
            per_cell = {(p, c): n for t, p, c, n in partition_counts if t == topic}
            partitions = sorted({p for p, _ in per_cell})
            bottoms = [0] * len(partitions)
            for cls in classes:
                heights = [per_cell.get((p, cls), 0) for p in partitions]
                if not any(heights):
                    continue
                ax.bar(partitions, heights, bottom=bottoms, width=0.8, color=_colour(cls, classes))
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=False)]
                if cls not in drawn:
                    drawn.append(cls)
            ax.set_title(f"topic {topic}", loc="left")
            ax.set_xlabel("partition")
            ax.set_ylabel("findings")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
        drawn.sort(key=classes.index)
        figure.legend(
            [Line2D([], [], color=_colour(c, classes), linewidth=8) for c in drawn],
            drawn,
            loc="outside upper center",
            ncols=min(len(drawn), 6),
            frameon=False,
        )
        svg = _svg(figure, "by-partition")
    note = ""
    if len(topics) > len(plotted):
        note = (
            f'\n<p class="note">Plotted: the first {len(plotted)} of {len(topics)} topics with findings, '
            "by name; the tables above count them all.</p>"
        )
    return svg + note


def _plot_timeline(timeline: _Timeline, classes: Sequence[str]) -> str:
    with matplotlib.rc_context(_PLOT_RC):  # type: ignore[arg-type]  # the stubs want literal rc keys
        return _svg(_timeline_figure(timeline, classes), "over-time")


def _timeline_figure(timeline: _Timeline, classes: Sequence[str]) -> Figure:
    width = timeline.bin_width_ms
    bins = list(range(timeline.first_bin_ms, timeline.last_bin_ms + 1, width))
    moments = [datetime.fromtimestamp(b / 1000, UTC) for b in bins]
    with matplotlib.rc_context(_PLOT_RC):  # type: ignore[arg-type]  # the stubs want literal rc keys
        figure = Figure(figsize=(9, 3.6), layout="constrained")
        ax = figure.subplots()
        # Stacked bars, one bin wide: classes at the same moments stack instead of hiding
        # each other, as lines over the same points would.
        bar_days = width / 86_400_000
        stacked = [0] * len(bins)
        for cls in classes:
            series = [timeline.counts.get((cls, b), 0) for b in bins]
            if any(series):
                ax.bar(
                    moments,  # type: ignore[arg-type]  # dates, through matplotlib's converters
                    series,
                    width=bar_days,
                    bottom=stacked,
                    align="edge",
                    color=_colour(cls, classes),
                    label=cls,
                )
                stacked = [a + b for a, b in zip(stacked, series, strict=True)]
        # The span of the findings, a bin either side: a single bin would otherwise get
        # matplotlib's default span of years.
        padding = timedelta(milliseconds=width)
        ax.set_xlim(moments[0] - padding, moments[-1] + 2 * padding)  # type: ignore[arg-type]
        locator = AutoDateLocator(tz=UTC)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=UTC))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"record time (UTC), bins of {_width_label(width)}")
        ax.set_ylabel("findings")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", frameon=False, ncols=3)
        return figure


# --- failure page ----------------------------------------------------------------------------


def _render_failure(summary: Mapping[str, Any]) -> str:
    error = summary.get("error") or "(no error message given)"
    body = [
        f'<h1 class="{STATUS_FAILED}">Failed</h1>',
        "<p>The reconciliation did not finish, so it has no findings to report: what the topics "
        "hold against the validator's tables is unknown tonight, not clean.</p>",
        f"<pre>{_e(error)}</pre>",
        "<h2>Run</h2>",
        _run_table(summary),
    ]
    return _page("kdiv reconciliation: Failed", body)
