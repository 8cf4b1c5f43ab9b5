"""What the live worker has not validated: records at rest past its consumer group's committed
offsets (the group is the worker's application id), found by the nightly job.

A worker that stalls commits nothing, and every comparison of the job treats a record beyond
the worker's reach as lag. Lag of minutes is normal; records written longer ago than
`KDIV_UNVALIDATED_AFTER_S` before the offsets were read, still past them, are not: each
partition holding some is a NOT_VALIDATED finding (how many, the oldest one's time). Newer
ones are counted as lag.

1. The driver reads the group's committed offsets before the snapshot (`fetch_worker_offsets`),
   so they are below the snapshot's end; the job saves them beside it (worker_offsets.json): a
   rerun on the snapshot judges the same offsets at the same time.
2. Only the records past them are read (`backlog_snapshot`): nothing when the worker keeps up.
3. Spark counts them per partition (`backlog_rows`); only a row per partition reaches the driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kdiv.clock import wall_clock_ms
from kdiv.reconcile.snapshot import PartitionRange, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from kdiv.config.security import KafkaSecurity

WORKER_OFFSETS_JSON = "worker_offsets.json"
_FORMAT_VERSION = 1

# summary["not_validated"]["status"]: checked; no worker state, so no worker to have validated
# anything (changefeeds or routes alone); a rerun whose snapshot has no saved offsets.
CHECKED, NO_WORKER, NOT_SAVED = "checked", "no_worker", "not_saved"


@dataclass(frozen=True)
class WorkerOffsets:
    """The worker group's committed offsets, as read before the snapshot."""

    group: str
    taken_at_ms: int
    # (topic, partition) -> committed offset (the next record the worker reads).
    offsets: Mapping[tuple[str, int], int]
    # Whether the cluster listed the group: one it does not has committed nothing.
    group_known: bool

    def committed(self, topic: str, partition: int) -> int | None:
        return self.offsets.get((topic, partition))

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _FORMAT_VERSION,
                "group": self.group,
                "taken_at_ms": self.taken_at_ms,
                "group_known": self.group_known,
                "offsets": [[t, p, o] for (t, p), o in sorted(self.offsets.items())],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> WorkerOffsets:
        """Raises ValueError naming `where` when `text` is not saved worker offsets."""
        try:
            data = json.loads(text)
            if data["version"] != _FORMAT_VERSION:
                raise ValueError(f"format version {data['version']!r} is unknown (expected {_FORMAT_VERSION})")
            offsets = {(str(t), int(p)): int(o) for t, p, o in data["offsets"]}
            return cls(str(data["group"]), int(data["taken_at_ms"]), offsets, bool(data["group_known"]))
        except KeyError as missing:
            raise ValueError(f"{where}: not saved worker offsets: no {missing} field") from None
        except (json.JSONDecodeError, TypeError, ValueError) as bad:
            raise ValueError(f"{where}: not saved worker offsets: {bad}") from None


async def fetch_worker_offsets(
    bootstrap: str,
    group: str,
    partitions: Mapping[str, int],
    *,
    security: KafkaSecurity | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> WorkerOffsets:
    """`group`'s committed offsets on every partition of `partitions` (topic -> count), named
    one by one (some brokers answer no whole-group OffsetFetch)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from kdiv.config.security import PLAINTEXT

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="kdiv-reconcile-backlog", **(security or PLAINTEXT).aiokafka_kwargs()
    )
    await admin.start()
    try:
        known = group in {g[0] for g in await admin.list_consumer_groups()}
        offsets: dict[tuple[str, int], int] = {}
        wanted = [TopicPartition(t, p) for t, n in sorted(partitions.items()) for p in range(n)]
        if known and wanted:
            found = await admin.list_consumer_group_offsets(group, partitions=wanted)
            offsets = {(tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}
        taken_at_ms = clock_ms()
    finally:
        await admin.close()
    return WorkerOffsets(group, taken_at_ms, offsets, known)


def backlog_snapshot(snapshot: Snapshot, offsets: WorkerOffsets, topics: Iterable[str]) -> Snapshot:
    """The part of `snapshot` past the worker's committed offsets, on `topics`: a partition
    without a committed offset from its start (the worker reads from the earliest)."""
    wanted = set(topics)
    ranges = []
    for r in snapshot.ranges:
        if r.topic not in wanted:
            continue
        committed = offsets.committed(r.topic, r.partition)
        start = r.start if committed is None else min(max(r.start, committed), r.end)
        ranges.append(PartitionRange(r.topic, r.partition, start, r.end))
    return Snapshot(snapshot.taken_at_ms, tuple(ranges), tuple(t for t in snapshot.missing if t in wanted))


@dataclass(frozen=True, order=True)
class Backlog:
    """One partition's records past the worker's committed offset."""

    topic: str
    partition: int
    committed: int | None
    # Written before the bound: the finding. `first_offset`, `oldest_ms` are theirs.
    unvalidated: int
    first_offset: int | None
    oldest_ms: int | None
    # Written after the bound: lag.
    lag: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "unvalidated": self.unvalidated,
            "first_offset": self.first_offset,
            "oldest_ms": self.oldest_ms,
            "lag": self.lag,
        }


def backlog_rows(records: DataFrame, offsets: WorkerOffsets, cutoff_ms: int) -> list[Backlog]:
    """Per partition with records in `records` (read from `backlog_snapshot`), how many were
    written before `cutoff_ms` (the oldest's time and first offset) and how many after."""
    from pyspark.sql import functions as F

    time_ms = F.unix_millis("timestamp")
    old = time_ms < F.lit(cutoff_ms)
    rows = (
        records.groupBy("topic", "partition")
        .agg(
            F.sum(F.when(old, 1).otherwise(0)).alias("unvalidated"),
            F.min(F.when(old, F.col("offset"))).alias("first_offset"),
            F.min(F.when(old, time_ms)).alias("oldest_ms"),
            F.sum(F.when(old, 0).otherwise(1)).alias("lag"),
        )
        .collect()
    )
    return sorted(
        Backlog(
            r["topic"],
            r["partition"],
            offsets.committed(r["topic"], r["partition"]),
            int(r["unvalidated"]),
            r["first_offset"],
            r["oldest_ms"],
            int(r["lag"]),
        )
        for r in rows
    )


def detail(row: Backlog, after_s: float, group: str) -> str:
    """The finding's detail: what the worker has not validated, and past what."""
    from kdiv.clock import iso_utc

    past = (
        f"past offset {row.committed} group {group} committed"
        if row.committed is not None
        else f"group {group} has committed nothing here"
    )
    return (
        f"{row.unvalidated} record(s) the live worker has not validated ({past}), the oldest written at "
        f"{iso_utc(row.oldest_ms)}, more than {after_s:g} s before its offsets were read: stalled or far behind"
    )


def findings(spark: SparkSession, rows: Iterable[Backlog], after_s: float, group: str) -> DataFrame:
    """A NOT_VALIDATED finding (FINDINGS_SCHEMA) per partition with unvalidated records."""
    from kdiv.reconcile.findings import FINDINGS_SCHEMA, NOT_VALIDATED

    found = [
        (
            NOT_VALIDATED,
            r.topic,
            r.partition,
            r.first_offset if r.first_offset is not None else -1,
            None,
            None,
            None,
            None,
            r.oldest_ms if r.oldest_ms is not None else -1,
            r.unvalidated,
            None,
            None,
            None,
            detail(r, after_s, group),
        )
        for r in rows
        if r.unvalidated
    ]
    return spark.createDataFrame(found, FINDINGS_SCHEMA)


def summary_of(status: str, offsets: WorkerOffsets | None, after_s: float, rows: Iterable[Backlog] = ()) -> dict:
    """summary["not_validated"]: how the check went, and each partition with records past the
    worker's committed offset."""
    rows = list(rows)
    return {
        "status": status,
        "group": offsets.group if offsets is not None else None,
        "group_known": offsets.group_known if offsets is not None else None,
        "offsets_taken_at_ms": offsets.taken_at_ms if offsets is not None else None,
        "after_s": after_s,
        "unvalidated": sum(r.unvalidated for r in rows),
        "lag": sum(r.lag for r in rows),
        "partitions": [r.to_json() for r in rows],
    }
