"""The consistent snapshot the reconciliation reads: per partition, the offsets [start, end).

It is planned once, on the driver, when the job starts. Every later read (Spark's or kdiv's
own data source, on any executor, retried or not) reads exactly these ranges, so records
written while the job runs never leak into one stage and not another.

Only the standard library is imported at module level: executors import this module (through
`kdiv.reconcile.kafka_source`) to parse the snapshot, and have no use for aiokafka or kdiv's app.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kdiv.clock import wall_clock_ms

if TYPE_CHECKING:
    from kdiv.config.security import KafkaSecurity

_FORMAT_VERSION = 1


@dataclass(frozen=True)
class PartitionRange:
    """Offsets [start, end) of one partition: `end` is exclusive."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.partition < 0 or self.start < 0 or self.end < self.start:
            raise ValueError(f"invalid range for {self.topic}[{self.partition}]: offsets [{self.start}, {self.end})")

    @property
    def records_planned(self) -> int:
        """Offsets in the range; an upper bound of the records (compaction, markers leave gaps)."""
        return self.end - self.start


@dataclass(frozen=True)
class Snapshot:
    taken_at_ms: int
    ranges: tuple[PartitionRange, ...]
    # Topics planned with missing_ok that did not exist: they read as no records.
    missing: tuple[str, ...] = ()

    @property
    def topics(self) -> tuple[str, ...]:
        """Topics with ranges, in first-seen order."""
        return tuple(dict.fromkeys(r.topic for r in self.ranges))

    @property
    def records_planned(self) -> int:
        return sum(r.records_planned for r in self.ranges)

    def ranges_of(self, topic: str) -> tuple[PartitionRange, ...]:
        return tuple(r for r in self.ranges if r.topic == topic)

    def only(self, topics: Iterable[str]) -> Snapshot:
        """The same snapshot restricted to `topics`."""
        wanted = set(topics)
        return Snapshot(
            self.taken_at_ms,
            tuple(r for r in self.ranges if r.topic in wanted),
            tuple(t for t in self.missing if t in wanted),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _FORMAT_VERSION,
                "taken_at_ms": self.taken_at_ms,
                "ranges": [[r.topic, r.partition, r.start, r.end] for r in self.ranges],
                "missing": list(self.missing),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        try:
            data = json.loads(text)
            version = data["version"]
            if version != _FORMAT_VERSION:
                raise ValueError(f"unsupported snapshot format version {version!r} (expected {_FORMAT_VERSION})")
            ranges = tuple(
                PartitionRange(str(topic), int(partition), int(start), int(end))
                for topic, partition, start, end in data["ranges"]
            )
            missing = tuple(str(t) for t in data.get("missing", ()))
            return cls(int(data["taken_at_ms"]), ranges, missing)
        except KeyError as field:
            raise ValueError(f"not a kdiv snapshot: no {field} field") from None
        except (json.JSONDecodeError, TypeError, AttributeError) as bad:
            raise ValueError(f"not a kdiv snapshot: {bad}") from None


async def plan_snapshot(
    bootstrap: str,
    topics: Iterable[str],
    *,
    security: KafkaSecurity | None = None,
    missing_ok: bool | Iterable[str] = False,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> Snapshot:
    """Every partition of `topics`, from its beginning offset to its exact end offset now.

    `security`: None means PLAINTEXT. A topic that does not exist raises LookupError naming
    it, unless `missing_ok` is True or names it: then it gets no ranges. End offsets are
    exact on every broker (`kdiv.kafka.tansu.end_offsets`), so every record written before
    the call is in the snapshot.
    """
    # Deferred: only the driver plans, and executors importing this module need none of it.
    from aiokafka import TopicPartition

    from kdiv.config.security import PLAINTEXT
    from kdiv.kafka.consume import partitions_by_topic, standalone_consumer
    from kdiv.kafka.tansu import detect_tansu, end_offsets

    topics = [topics] if isinstance(topics, str) else list(dict.fromkeys(topics))
    if missing_ok is True:
        optional = set(topics)
    else:
        optional = {missing_ok} if isinstance(missing_ok, str) else set(missing_ok or ())
    consumer = standalone_consumer(bootstrap, security=security or PLAINTEXT)
    await consumer.start()
    try:
        known = await partitions_by_topic(consumer)
        absent = [t for t in topics if t not in known and t not in optional]
        if absent:
            raise LookupError(f"topic(s) {', '.join(map(repr, absent))} do not exist on {bootstrap}")
        tps = [
            TopicPartition(topic, partition) for topic in topics if topic in known for partition in sorted(known[topic])
        ]
        missing = tuple(t for t in topics if t not in known)
        starts, ends = {}, {}
        if tps:
            starts = await consumer.beginning_offsets(tps)
            ends = await end_offsets(consumer, tps, tansu=await detect_tansu(consumer))
        # After the end offsets: every record in the snapshot was written before this time.
        taken_at_ms = clock_ms()
    finally:
        await consumer.stop()
    return Snapshot(
        taken_at_ms,
        tuple(PartitionRange(tp.topic, tp.partition, starts[tp], max(ends[tp], starts[tp])) for tp in tps),
        missing,
    )


def take_snapshot(
    bootstrap: str,
    topics: Iterable[str],
    *,
    security: KafkaSecurity | None = None,
    missing_ok: bool | Iterable[str] = False,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> Snapshot:
    """`plan_snapshot` from sync code (the Spark driver), on a private event loop."""
    from kdiv.kafka.discovery import run_in_own_loop

    return run_in_own_loop(
        plan_snapshot(bootstrap, topics, security=security, missing_ok=missing_ok, clock_ms=clock_ms)
    )
