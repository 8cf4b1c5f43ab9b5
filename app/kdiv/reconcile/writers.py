"""How the report's files reach the disk: Parquet through Spark, text files whole.

Parquet is laid out so that its bytes depend on the rows alone (one sorted file per
directory), and text files are renamed into place, so a dashboard or a collector reading the
report directory during a run never sees half a file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pyspark.sql import DataFrame


def write_findings_parquet(findings: DataFrame, path: Path) -> None:
    # One task per (topic, class), rows in offset order: each directory gets one file whose
    # contents depend only on the findings.
    (
        findings.repartition("topic", "class")
        .sortWithinPartitions("topic", "class", "partition", "offset", "key")
        .write.mode("overwrite")
        .partitionBy("topic", "class")
        .parquet(str(path))
    )


def write_empty_findings_parquet(findings: DataFrame, path: Path) -> None:
    # No rows: partitionBy would leave only _SUCCESS, which no reader can take a schema from
    # (Spark: UNABLE_TO_INFER_SCHEMA; pandas: no columns). One empty file keeps every column.
    findings.limit(0).coalesce(1).write.mode("overwrite").parquet(str(path))


def write_sequences_parquet(sequences: DataFrame, path: Path) -> None:
    # repartition, not coalesce: coalesce(1) would run the whole upstream scan in one task.
    (
        sequences.repartition(1)
        .sortWithinPartitions("topic", "partition", "producer")
        .write.mode("overwrite")
        .parquet(str(path))
    )


def write_text(path: Path, text: str) -> None:
    # Written beside and renamed, so a reader (a dashboard, a collector) never sees half a file.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8", newline="\n")
    os.replace(partial, path)


def remove_stale(path: Path) -> None:
    """Remove the directory a previous run left at `path`, if any."""
    if path.is_dir():
        shutil.rmtree(path)
