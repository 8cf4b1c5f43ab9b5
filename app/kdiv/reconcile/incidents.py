"""The live validator's incidents beside the night's findings: how many the workers' incidents
topic holds per topic and class, in the run's window (summary["incidents"]).

The topic is read like the others, to the end offset taken with the snapshot. It is compacted
and a replay rewrites an incident's key, so each key counts once, by its latest record (a
tombstone deletes it). An incident counts when its detection time falls in the window
[from_ms, to_ms): from where the previous run's window ended (its snapshot time; runs that
failed or could not read the incidents do not count) or, without one, from the topic's start,
to this run's snapshot. The bounds match the workers' /incidents/ view (since inclusive, until
exclusive), so consecutive nights neither overlap nor leave a gap. Values are untrusted: one that is not an incident is
counted and the first named, never a failure of the run.

summary["incidents"]: {"topic", "status" (kdiv.reconcile.summary.INCIDENTS_*), "window":
{"from_ms", "to_ms"}, "by_topic" {topic: {class: incidents in the window}}, "held" (incidents the topic holds),
"outside_window", "malformed", "first_malformed" {"partition", "offset", "error"} or None,
"error" (when unreadable)}.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from kdiv.config.redact import redacted
from kdiv.reconcile.summary import INCIDENTS_READ

# A malformed value's error text is cut here: it quotes part of the value.
ERROR_CHARS = 300

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_PARSED_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("topic", StringType(), True),
        StructField("class", StringType(), True),
        StructField("detected_at_ms", LongType(), True),
        StructField("error", StringType(), True),
    ]
)


@dataclass(frozen=True)
class IncidentWindow:
    """Detection times [from_ms, to_ms); from_ms None: from the incidents topic's start."""

    from_ms: int | None
    to_ms: int


def previous_window_end_ms(reports_dir: Path, before_ms: int, summary_file: str) -> int | None:
    """Where the newest earlier run's window of incidents ended (its snapshot time), among the
    runs under `reports_dir` (each in a directory of its own holding `summary_file`) that
    counted them; None without one. A run that failed, or could not read the incidents, opened
    no window: the next one starts where the last counted one ended, so no incident falls
    between two reports. A file that is not such a summary is passed over."""
    newest = None
    for path in reports_dir.glob(f"*/{summary_file}"):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        incidents = summary.get("incidents") if isinstance(summary, dict) else None
        if not isinstance(incidents, dict) or incidents.get("status") != INCIDENTS_READ:
            continue
        window = incidents.get("window")
        ended = window.get("to_ms") if isinstance(window, dict) else None
        if type(ended) is int and ended < before_ms and (newest is None or ended > newest):
            newest = ended
    return newest


def not_read(incidents_topic: str, window: IncidentWindow, status: str, error: str | None = None) -> dict[str, Any]:
    """summary["incidents"] of a run that could not count them: unknown, never zeros."""
    entry: dict[str, Any] = {"topic": incidents_topic, "status": status, "window": _window_json(window)}
    if error is not None:
        entry["error"] = redacted(error)
    return entry


def count_incidents(records: DataFrame, incidents_topic: str, window: IncidentWindow) -> dict[str, Any]:
    """summary["incidents"] from the incidents topic's records (KAFKA_SCHEMA rows): parsed on
    the executors, only counts per (topic, class) and the first malformed value collected."""
    # Each key's latest record; a record without a key has no identity to rewrite, so it stands alone.
    alone = F.when(F.col("key").isNull(), F.col("offset"))
    latest = Window.partitionBy("partition", "key", alone).orderBy(F.col("offset").desc())
    current = (
        records.select("partition", "offset", "key", "value")
        .withColumn("rank", F.row_number().over(latest))
        .where((F.col("rank") == 1) & F.col("value").isNotNull())
    )
    parsed = records.sparkSession.createDataFrame(current.rdd.mapPartitions(_parsed), _PARSED_SCHEMA)
    detected = F.col("detected_at_ms")
    in_window = detected < window.to_ms
    if window.from_ms is not None:
        in_window = in_window & (detected >= window.from_ms)
    readable = F.col("error").isNull()
    rows = (
        parsed.where(readable)
        .groupBy("topic", "class")
        .agg(F.count(F.when(in_window, 1)).alias("in_window"), F.count(F.lit(1)).alias("held"))
        .collect()
    )
    malformed = parsed.where(~readable)
    first = malformed.orderBy("partition", "offset").limit(1).collect()
    by_topic: dict[str, dict[str, int]] = {}
    for row in sorted(rows, key=lambda r: (r["topic"], r["class"])):
        if row["in_window"]:
            by_topic.setdefault(row["topic"], {})[row["class"]] = row["in_window"]
    held = sum(r["held"] for r in rows)
    return {
        "topic": incidents_topic,
        "status": INCIDENTS_READ,
        "window": _window_json(window),
        "by_topic": by_topic,
        "held": held,
        "outside_window": held - sum(r["in_window"] for r in rows),
        "malformed": malformed.count(),
        "first_malformed": _malformed_json(first[0]) if first else None,
    }


def _window_json(window: IncidentWindow) -> dict[str, int | None]:
    return {"from_ms": window.from_ms, "to_ms": window.to_ms}


def _malformed_json(row: Row) -> dict[str, Any]:
    return {"partition": row["partition"], "offset": row["offset"], "error": row["error"]}


def _parsed(rows: Iterable[Row]) -> Iterator[tuple]:
    """(partition, offset, topic, class, detected_at_ms, error) of each incident value; runs on
    the executors."""
    # The one reader of the incident shape: the report counts what the views show.
    from kdiv.incident.shape import Incident

    for row in rows:
        try:
            incident = Incident.from_value(bytes(row["value"]))
        except Exception as bad:  # noqa: BLE001 - what the parser refuses is the value's fault, not the run's
            yield (row["partition"], row["offset"], None, None, None, _clipped(str(bad)))
            continue
        if not _LONG_MIN <= incident.detected_at_ms <= _LONG_MAX:  # JSON numbers have no bound; Spark's longs do
            yield (row["partition"], row["offset"], None, None, None, "incident field detected_at_ms is out of range")
            continue
        yield (row["partition"], row["offset"], incident.topic, incident.verdict, incident.detected_at_ms, None)


def _clipped(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "…"
