"""report.html: one self-contained page for a person, from the summary and the aggregates.

Inline CSS, plots as inline SVG, no script and nothing fetched from anywhere. The page depends
on nothing but its inputs (no clock, no path, no random id), so a rerun on the same findings
writes the same bytes and two nights' pages diff cleanly.

(Not html.py: spark-submit runs job.py as a script, which puts this folder first on sys.path,
where an html.py would stand in for the standard library's html.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kdiv.reconcile.aggregates import SequenceSample, Timeline
from kdiv.reconcile.changefeed_route_tables import changefeed_section, routes_section
from kdiv.reconcile.findings import NOT_VALIDATED
from kdiv.reconcile.legend import colour, meaning
from kdiv.reconcile.live_incidents_markup import live_incidents_cell, live_incidents_notes, live_incidents_total
from kdiv.reconcile.markup import breakable, clipped, duration, escaped, key_markup, number, page, table, utc_time
from kdiv.reconcile.plots import plot_by_partition, plot_timeline
from kdiv.reconcile.summary import STATUS_FAILED, run_topics

# A finding's detail is cut here: a stack trace or a whole record would drown the table.
DETAIL_CHARS = 500


class FindingRow(Protocol):
    """A collected row (pyspark's Row): its values by column name."""

    def __getitem__(self, name: str, /) -> Any: ...


def render_report(
    summary: Mapping[str, Any],
    *,
    partition_counts: list[tuple[str, int, str, int]],
    timeline: Timeline,
    first_findings: Mapping[str, Sequence[FindingRow]],
    sequence_sample: SequenceSample | None,
) -> str:
    """The page of a run that finished (or failed with its findings): `summary` as
    kdiv.reconcile.summary.summary_with_counts returns it."""
    counts: dict[str, int] = summary["counts"]
    records: dict[str, int] = summary["records"]
    by_topic: dict[str, dict[str, int]] = summary["by_topic"]
    classes = list(counts)
    total = sum(counts.values())
    status = summary["status"]
    title = headline(status, total, records.get(NOT_VALIDATED, 0))

    body = [f'<h1 class="{escaped(status)}">{escaped(title)}</h1>']
    if status == STATUS_FAILED:
        body.append(f"<pre>{escaped(summary.get('error') or '(no error message given)')}</pre>")
    elif total == 0:
        body.append("<p>Clean: every topic reconciled with the validator's tables; no finding in any class.</p>")
    else:
        topics_found = sum(1 for per_class in by_topic.values() if any(per_class.values()))
        classes_found = sum(1 for n in counts.values() if n)
        standing_for = sum(records.values())
        # Topics here include the state changelogs a finding may be on, which the run table
        # does not list among the watched topics: only those with findings are counted.
        body.append(
            f"<p>{number(total)} finding row{'' if total == 1 else 's'} standing for {number(standing_for)} "
            f"record{'' if standing_for == 1 else 's'}, in {classes_found} class{'' if classes_found == 1 else 'es'} "
            f"across {topics_found} topic{'' if topics_found == 1 else 's'}.</p>"
        )

    body += ["<h2>Run</h2>", _run_table(summary)]
    if summary.get("vanished"):
        body.append("<h2>Deleted before they could be read</h2>")
        body += _vanished_section(summary["vanished"])

    body.append("<h2>Findings by class</h2>")
    body.append(_counts_by_class(counts, records))

    body.append("<h2>Findings by topic and class</h2>")
    incidents = summary.get("incidents")
    if incidents is not None:
        body += live_incidents_notes(incidents, by_topic)
    body.append(_counts_by_topic(summary, counts, by_topic))

    if "changefeeds" in summary:
        body.append("<h2>Changefeed row checksums</h2>")
        body += changefeed_section(summary["changefeeds"] or {})

    if "routes" in summary:
        body.append("<h2>Pipeline routes at rest</h2>")
        body += routes_section(summary["routes"] or {})

    body.append("<h2>Findings by partition</h2>")
    if total == 0:
        body.append('<p class="note">No findings, so nothing to plot.</p>')
    else:
        body.append(plot_by_partition(partition_counts, classes))

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

    return page(f"kdiv reconciliation: {title}", body)


def render_failure(summary: Mapping[str, Any]) -> str:
    """The page of a run that ended without findings to report: the error and what is known of the run."""
    error = summary.get("error") or "(no error message given)"
    body = [
        f'<h1 class="{STATUS_FAILED}">Failed</h1>',
        "<p>The reconciliation did not finish, so it has no findings to report: what the topics "
        "hold against the validator's tables is unknown tonight, not clean.</p>",
        f"<pre>{escaped(error)}</pre>",
        "<h2>Run</h2>",
        _run_table(summary),
    ]
    return page("kdiv reconciliation: Failed", body)


def headline(status: str, total: int, not_validated: int = 0) -> str:
    """The page's first line; `not_validated`: records the live worker has not validated
    (NOT_VALIDATED), named there: a stalled worker is the night's first news."""
    if status == STATUS_FAILED:
        return "Failed"
    if total == 0:
        return "Clean: no discrepancies"
    line = f"{total:,} discrepanc{'y' if total == 1 else 'ies'}"
    if not_validated:
        line += f", {not_validated:,} record{'' if not_validated == 1 else 's'} the live worker has not validated"
    return line


def _run_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    snapshot = summary.get("snapshot") or {}
    records_read = summary.get("records_read") or {}
    topics = run_topics(summary)
    rows = [
        ("Status", escaped(summary.get("status", "—"))),
        ("Cluster", f"<code>{escaped(summary['cluster_id'])}</code>" if summary.get("cluster_id") else "—"),
        ("Snapshot taken", escaped(utc_time(snapshot.get("taken_at_ms")))),
        ("Finished", escaped(utc_time(summary.get("finished_at_ms")))),
        ("Duration", escaped(duration(summary.get("duration_s")))),
        ("Topics", f"{len(topics):,}: " + ", ".join(f"<code>{escaped(t)}</code>" for t in topics) if topics else "—"),
        ("Records read", escaped(number(sum(records_read.values())) if records_read else "—")),
    ]
    topic_ids = summary.get("topic_ids") or {}
    if topic_ids:
        rows.append(
            ("Topic ids", ", ".join(f"<code>{escaped(t)}</code> {escaped(i)}" for t, i in sorted(topic_ids.items())))
        )
    if "exit_code" in summary:
        rows.append(("Exit code", escaped(summary["exit_code"])))
    return rows


def _vanished_section(vanished: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = [
        (
            f"<code>{escaped(v.get('topic'))}</code>",
            number(v.get("partition")),
            f"[{number(v.get('from'))}, {number(v.get('to'))})",
            number(v.get("log_start")),
        )
        for v in vanished
    ]
    return [
        '<p class="note">Offsets in the snapshot that were deleted (DeleteRecords, retention, compaction) '
        "after the job took it and before it read them: not compared tonight. A key whose validated record "
        "went with them is LOST.</p>",
        table(
            ("Topic", "Partition", "Offsets vanished", "Log start after the read"),
            rows,
            table_id="vanished",
            column_classes={1: "num", 3: "num"},
        ),
    ]


def _run_table(summary: Mapping[str, Any]) -> str:
    lines = ['<table id="run">']
    lines += [f"<tr><th>{escaped(name)}</th><td>{markup}</td></tr>" for name, markup in _run_rows(summary)]
    lines.append("</table>")
    return "\n".join(lines)


def _counts_by_class(counts: Mapping[str, int], records: Mapping[str, int]) -> str:
    classes = list(counts)
    total = sum(counts.values())
    class_rows = [
        (
            f'<span class="swatch" style="background:{colour(c, classes)}"></span>{escaped(c)}',
            number(counts[c]),
            number(records[c]),
            escaped(meaning(c)),
        )
        for c in classes
    ]
    class_rows.append(("All classes", number(total), number(sum(records.values())), ""))
    return table(
        ("Class", "Findings", "Records", "Meaning"),
        class_rows,
        table_id="counts-by-class",
        column_classes={1: "num", 2: "num"},
        row_classes=[""] * len(classes) + ["total"],
    )


def _counts_by_topic(
    summary: Mapping[str, Any], counts: Mapping[str, int], by_topic: Mapping[str, Mapping[str, int]]
) -> str:
    # Only the classes found: a column per class a run can report is wider than the page, and
    # "Findings by class" lists them all.
    classes = [c for c in counts if counts[c]]
    records_read = summary.get("records_read") or {}
    changelog_records_read = summary.get("changelog_records_read") or {}
    incidents = summary.get("incidents")
    # The workers' incidents per topic, a column of their own beside the night's findings.
    live = [] if incidents is None else [live_incidents_cell(incidents, topic) for topic in sorted(by_topic)]
    topic_rows = []
    for index, topic in enumerate(sorted(by_topic)):
        per_class = by_topic[topic]
        read = records_read.get(topic, changelog_records_read.get(topic))
        topic_rows.append(
            (
                f"<code>{breakable(topic)}</code>",
                number(read),
                *(number(per_class.get(c, 0)) for c in classes),
                number(sum(per_class.values())),
                *live[index : index + 1],
            )
        )
    topic_rows.append(
        (
            "All topics",
            number(sum(records_read.values())) if records_read else "—",
            *(number(counts[c]) for c in classes),
            number(sum(counts.values())),
            *([] if incidents is None else [live_incidents_total(incidents, by_topic)]),
        )
    )
    column_classes = dict.fromkeys(range(1, len(classes) + 3), "num")
    if incidents is not None:
        column_classes[len(classes) + 3] = "incidents"
    return table(
        ("Topic", "Records read", *classes, "All classes", *([] if incidents is None else ["Live incidents"])),
        topic_rows,
        table_id="counts-by-topic",
        column_classes=column_classes,
        row_classes=[""] * (len(topic_rows) - 1) + ["total"],
    )


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


def _findings_section(cls: str, count: int, rows: Sequence[FindingRow]) -> list[str]:
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

    def optional_cell(row: FindingRow, name: str) -> str:
        value = row[name]
        if value is None:
            return "—"
        if name == "registered_subjects":
            return ", ".join(f"<code>{escaped(s)}</code>" for s in value) or '<span class="note">(none)</span>'
        if name == "copies":
            return "<br>".join(_copy(copy) for copy in value)
        if name in ("producer", "expected_subject", "table", "row_key", "route", "group", "trace_id"):
            return f"<code>{escaped(value)}</code>"
        if name in _NUMBERED_IDS or name == "image":
            return escaped(value)
        return number(value)

    table_rows = [
        (
            f"<code>{escaped(r['topic'])}</code>",
            number(r["partition"]),
            number(r["offset"]),
            key_markup(r["key"]),
            *(optional_cell(r, name) for name in optional),
            escaped(utc_time(r["timestamp_ms"])),
            number(r["count"]),
            escaped(clipped(r["detail"], DETAIL_CHARS)),
        )
        for r in rows
    ]
    numeric = {1, 2, len(header) - 2} | {
        4 + i
        for i, name in enumerate(optional)
        if name in ("segment", "seq", "schema_id", "hop", "committed_offset", *_NUMBERED_IDS)
    }
    return [
        f"<h3>{escaped(heading)}</h3>",
        f'<p class="note">{escaped(meaning(cls))}. Ordered by topic, partition, offset.</p>',
        table(
            header,
            table_rows,
            table_id=f"findings-{cls.lower()}",
            column_classes={**dict.fromkeys(numeric, "num"), len(header) - 1: "detail"},
        ),
    ]


def _copy(copy: FindingRow) -> str:
    """Escaped markup for one position of a trace: a topic's record, or a file sink's."""
    if copy["file"] is None:
        return f"<code>{escaped(copy['topic'])}[{copy['partition']}]@{copy['offset']}</code>"
    if copy["partition"] is not None:
        at = f"[{copy['partition']}]@{copy['offset']}"
        return f'<code title="{escaped(copy["file"])}">{escaped(copy["topic"])}{escaped(at)}</code>'
    return f"<code>{escaped(copy['file'])}</code> row {number(copy['row'])}"


def _sequence_section(sample: SequenceSample) -> list[str]:
    shown = len(sample.rows)
    intro = (
        f"{sample.total:,} producer-partitions compared, {sample.behind:,} with the topic behind the table. "
        + ("All shown" if shown == sample.total else f"First {shown:,} shown")
        + ", those behind first."
    )
    header = ("Topic", "Partition", "Producer", "Topic segment", "Topic seq", "Table segment", "Table seq", "Behind")
    rows = [
        (
            f"<code>{escaped(r['topic'])}</code>",
            number(r["partition"]),
            f"<code>{escaped(r['producer'])}</code>" if r["producer"] is not None else "—",
            number(r["topic_segment"]),
            number(r["topic_seq"]),
            number(r["table_segment"]),
            number(r["table_seq"]),
            "behind" if r["behind"] else "no",
        )
        for r in sample.rows
    ]
    return [
        f"<p>{escaped(intro)}</p>",
        table(
            header,
            rows,
            table_id="sequences",
            column_classes=dict.fromkeys((1, 3, 4, 5, 6), "num"),
            row_classes=["behind" if r["behind"] else "" for r in sample.rows],
        ),
    ]


def _timeline_section(timeline: Timeline, classes: Sequence[str]) -> list[str]:
    if timeline.total == 0:
        return ['<p class="note">No findings, so nothing to plot.</p>']
    if not timeline.counts:
        return [
            f'<p class="note">None of the {timeline.total:,} findings carries a record time '
            "a date can show (timestamp -1, or out of range), so there is nothing to plot.</p>"
        ]
    lines = [plot_timeline(timeline, classes)]
    if timeline.untimed:
        one = timeline.untimed == 1
        lines.append(
            f'<p class="note">{timeline.untimed:,} of {timeline.total:,} findings '
            f"{'carries' if one else 'carry'} no record time (timestamp -1) or one out of the range dates "
            "show (producer clocks gone wrong), and "
            f"{'is' if one else 'are'} not plotted.</p>"
        )
    return lines
