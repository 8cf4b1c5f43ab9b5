"""The kinds of watched topic, each partition handled by the one handler of its topic's kind.

Every kind has the same lifecycle, and the worker calls it the same way for every partition:

- `load(keys)`: install what the worker keeps of the partitions (their saved state), once
  they are assigned, after their table's restore, or at their first batch; idempotent.
- `take(key, records, start, now)`: validate fetched records into the unit of work, from
  `start` on. It stops before a record that must come after a commit (a push marker, whose
  partition's earlier writes are written first) and says so; it takes nothing when the
  records must be read again (the partition was revoked meanwhile, or its log diverged).
- `forget(key)`: drop what is held of the partition (revoked, or read again from a log
  that is gone).

Kinds: DIV topics (`kdiv.worker.divtopics`), TiCDC changefeeds (row checksums, no state to
load) and the pipeline audit's observations topic (the trace judges, loaded from the traces
table).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kdiv.incident.builders import trace_incident
from kdiv.worker.audit import PipelineAudit
from kdiv.worker.changefeeds import ChangefeedChecks
from kdiv.worker.faustcompat.tables import partition_items
from kdiv.worker.unit import UnitOfWork

log = logging.getLogger("kdiv.worker")

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Taken:
    """How far `take` went: every record before `stopped_at` is validated (None: all of
    them); `commit_first`: the record at `stopped_at` waits for a commit of what came before
    it. Stopped without `commit_first`: the rest is not taken, and is read again."""

    stopped_at: int | None = None
    commit_first: bool = False


ALL_TAKEN = Taken()


class TopicKind(Protocol):
    """The handler of one kind of watched topic's partitions."""

    def is_loaded(self, key: Key) -> bool:
        """True once the partition can be judged here."""
        ...

    def loaded(self) -> set[Key]:
        """The partitions whose state is installed."""
        ...

    def load(self, keys: Collection[Key]) -> None:
        """Install the partitions' saved state, where not yet installed."""
        ...

    async def take(self, key: Key, records: Sequence, start: int, now_ms: int) -> Taken:
        """Validate `records[start:]` (in offset order) into the unit of work."""
        ...

    def forget(self, key: Key) -> None:
        """Drop what is held of the partition."""
        ...


class TopicKinds:
    """The kind of each watched topic, registered once."""

    def __init__(self) -> None:
        self._of: dict[str, TopicKind] = {}

    def register(self, topics: Iterable[str], kind: TopicKind) -> None:
        for topic in topics:
            if topic in self._of:
                raise ValueError(f"topic {topic} has a kind already")
            self._of[topic] = kind

    def of(self, topic: str) -> TopicKind | None:
        return self._of.get(topic)

    def kinds(self) -> list[TopicKind]:
        """Each kind once, in registration order."""
        return list(dict.fromkeys(self._of.values()))


class ChangefeedTopics:
    """TiCDC changefeed partitions: each row's checksum verified; nothing saved to load."""

    def __init__(
        self,
        changefeeds: ChangefeedChecks,
        unit: UnitOfWork,
        note_framing: Callable[[str, int, Sequence], None],
        clock: Callable[[], int],
    ) -> None:
        self.changefeeds = changefeeds
        self.unit = unit
        self.note_framing = note_framing
        self.clock = clock

    def is_loaded(self, key: Key) -> bool:
        return True

    def loaded(self) -> set[Key]:
        return set()

    def load(self, keys: Collection[Key]) -> None:
        return None

    async def take(self, key: Key, records: Sequence, start: int, now_ms: int) -> Taken:
        topic, partition = key
        records = records[start:] if start else records
        self.note_framing(topic, partition, records)
        await self.changefeeds.learn_schemas(records)
        incidents = self.changefeeds.verify(topic, partition, records, now_ms)
        if incidents:
            self.unit.add_incidents(key, incidents)
        self.unit.touch(key)
        return ALL_TAKEN

    def forget(self, key: Key) -> None:
        self.changefeeds.forget(*key)

    def give_up_held(self, unit: UnitOfWork) -> None:
        """Before a commit: rows held for a schema that did not come in time are reported."""
        for incident in self.changefeeds.give_up_held(self.clock()):
            unit.add_incident((incident.topic, incident.partition), incident)


class ObservationTopics:
    """The observations topic's partitions: the route records' observations, into the trace
    judge of their partition, whose open traces are saved in the traces table."""

    def __init__(self, audit: PipelineAudit, trace_table: Any, unit: UnitOfWork, clock: Callable[[], int]) -> None:
        self.audit = audit
        self.trace_table = trace_table
        self.unit = unit
        self.clock = clock

    def is_loaded(self, key: Key) -> bool:
        return key[1] in self.audit.judges

    def loaded(self) -> set[Key]:
        return {(self.audit.topic, partition) for partition in self.audit.judges}

    def load(self, keys: Collection[Key]) -> None:
        for _topic, partition in sorted(keys):
            if partition not in self.audit.judges:
                loaded = self.audit.load(partition, partition_items(self.trace_table, partition))
                log.info("pipeline audit: %d open traces loaded for observations partition %d", loaded, partition)

    async def take(self, key: Key, records: Sequence, start: int, now_ms: int) -> Taken:
        self.audit.receive(key[1], records[start:] if start else records, now_ms)
        self.unit.touch(key)
        return ALL_TAKEN

    def forget(self, key: Key) -> None:
        self.audit.unload(key[1])

    def judge_traces(self, unit: UnitOfWork) -> None:
        """Before a commit: the judges' verdicts (LOST, DUPLICATED, UNRESOLVED) become
        incidents, written with their observations partition's table changes."""
        now = self.clock()
        topic = self.audit.topic
        for partition, verdict in self.audit.judge(now):
            if verdict.outcome.value != "DELIVERED":
                unit.add_incident((topic, partition), trace_incident(verdict, now))
        for partition in self.audit.judges:
            unit.touch((topic, partition))
