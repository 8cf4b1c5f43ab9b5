"""What one reconciliation run leaves behind, in its own directory `out_dir`:

  summary.json     the run's summary (keys: see kdiv.reconcile.prometheus) plus, from the findings,
                   `counts` {class: finding rows}, `records` {class: records the findings
                   stand for} and `by_topic` {topic: {class: finding rows}}; with TiCDC
                   changefeeds, `changefeeds` {topic: rows per verdict and per table}; with
                   pipeline routes, `routes` {route: traces per outcome, and per hop}; from the
                   job, `incidents`: the workers' live incidents per topic and class in the
                   run's window, or why they are unknown (kdiv.reconcile.incidents)
  discrepancies/   Parquet of every finding (FINDINGS_SCHEMA, plus CHECKSUM_COLUMNS and
                   ROUTE_COLUMNS when the findings carry them, as the job's do), partitioned
                   topic=.../class=...
  sequences/       Parquet of the per producer-partition sequence comparison, when there is one
  report.html      one self-contained page for a person: inline CSS, plots as inline SVG,
                   no script and nothing fetched from anywhere

`out_dir` holds one run: writing a report there replaces the Parquet a previous run left.
This module puts the parts together: kdiv.reconcile.aggregates reduces the findings in Spark
(only aggregates and capped samples reach the driver), kdiv.reconcile.summary adds their
counts to the summary, kdiv.reconcile.report_page draws the page and kdiv.reconcile.writers
puts the files in place. summary.json and report.html depend on nothing but the inputs (no
clock, no path, no random id), so a rerun on the same inputs writes the same bytes and two
nights' reports diff cleanly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from kdiv.config.redact import redacted
from kdiv.reconcile import aggregates, writers
from kdiv.reconcile.findings import CHECKSUM_FIELDS, FINDING_FIELDS, ROUTE_FIELDS, with_report_columns
from kdiv.reconcile.report_page import render_failure, render_report
from kdiv.reconcile.summary import STATUS_FAILED, summary_json, summary_with_counts

SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
DISCREPANCIES_DIR = "discrepancies"
SEQUENCES_DIR = "sequences"


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
        sequences = sequences.select(*aggregates.SEQUENCE_FIELDS)
        if sequences_cached_here:
            sequences = sequences.persist()
    try:
        class_counts = aggregates.class_counts(findings)
        full_summary = summary_with_counts(summary, class_counts)
        out_dir.mkdir(parents=True, exist_ok=True)

        discrepancies_dir = out_dir / DISCREPANCIES_DIR
        if class_counts:
            writers.write_findings_parquet(findings.select(*written_fields), discrepancies_dir)
        else:
            writers.write_empty_findings_parquet(findings.select(*written_fields), discrepancies_dir)
        sequences_dir: Path | None = out_dir / SEQUENCES_DIR
        sequence_sample = None
        if sequences is not None:
            writers.write_sequences_parquet(sequences, out_dir / SEQUENCES_DIR)
            sequence_sample = aggregates.sequence_sample(sequences)
        else:
            writers.remove_stale(out_dir / SEQUENCES_DIR)
            sequences_dir = None

        page = render_report(
            full_summary,
            partition_counts=aggregates.partition_counts(findings),
            timeline=aggregates.timeline(findings),
            first_findings=aggregates.first_findings(findings),
            sequence_sample=sequence_sample,
        )
    finally:
        if findings_cached_here:
            findings.unpersist()
        if sequences_cached_here and sequences is not None:
            sequences.unpersist()

    summary_path = out_dir / SUMMARY_JSON
    html_path = out_dir / REPORT_HTML
    writers.write_text(summary_path, summary_json(full_summary))
    writers.write_text(html_path, page)
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
        writers.remove_stale(out_dir / stale)
    summary_path = out_dir / SUMMARY_JSON
    html_path = out_dir / REPORT_HTML
    writers.write_text(summary_path, summary_json(full_summary))
    writers.write_text(html_path, render_failure(full_summary))
    return ReportFiles(summary_path, html_path, None, None, full_summary)
