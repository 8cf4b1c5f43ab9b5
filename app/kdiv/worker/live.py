"""Live validation over persisted state: what a worker does between its consumer and its table.

Pure, like the validator it wraps: records and times come in, results and the state writes
to make come out; the worker does the I/O.

Crash consistency. A worker validates records in units (a batch of one partition) and
then writes, in this order, to one changelog partition: the unit's incidents (awaited),
the partition's state (phase, counters, last offset), then the state of each producer the
unit touched. Source offsets are committed only after those writes are flushed. A crash
therefore leaves a prefix of the writes, and records after the last commit come again:

- offset <= the partition's saved last offset, and <= the producer's saved last offset:
  the record's whole effect is saved; it is skipped (a replay, not a DUPLICATE).
- offset <= the partition's, > the producer's: the partition state counts it but the
  producer state never saw it; the producer is brought forward with partition-level
  effects suppressed, and any incident comes out with the same key as before.
- offset > the partition's: never saved; validated as new.

The second case re-runs validation in the partition's saved phase, so a unit never spans
a push boundary: START_OF_PUSH and END_OF_PUSH open a new unit (`opens_unit`).

The replay rule holds only while the offsets name the records validated there. When the
log is rewound under them (a topic recreated, a truncation) the worker says so (`rewind`,
from `check_topic_id`, the content of a re-delivered record, and the worker's high
watermark and leader epoch checks): the range is reported once and forgotten as
validated, so the records now at those offsets are judged as new.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from kdiv.div.exact import furthest_seen
from kdiv.div.ledger import packed_key_validation_of
from kdiv.div.record import ConsumedRecord, FetchedRecord
from kdiv.div.segment import Segment, as_segment
from kdiv.div.validator import (
    DataIntegrityValidator,
    Eviction,
    PartitionValidation,
    Semantics,
    ValidationResult,
)
from kdiv.div.wire import DivHeader, Kind, readable_scanned, scan_div_header
from kdiv.state.codec import StateDecodeError
from kdiv.state.tables import parse_key
from kdiv.state.values import StateValues
from kdiv.state.writes import StateWrites, ledger_writes, partition_writes_in_slices, run_slices
from kdiv.worker.retention import BehindDeletions, Deletion

_PUSH_MARKERS = (int(Kind.START_OF_PUSH), int(Kind.END_OF_PUSH))


@dataclass(frozen=True, slots=True)
class Rewind:
    """Validated offsets of a partition whose records are no longer in its log: the log was
    truncated (an unclean leader election, DeleteRecords) or the topic recreated, and new
    records may take those offsets. From `first_offset` on they are validated as new."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int  # the last validated offset when the rewind was found
    detected_by: str  # "topic id", "high watermark", "leader epoch" or "content"
    detail: str
    in_push: bool


@dataclass(frozen=True, slots=True)
class LoadError:
    """A table entry that could not be loaded, and why."""

    key: bytes
    reason: str


def _producer_of(found: int, raw: bytes | None) -> tuple[bytes | None, int | None]:
    """(GUID, kind) from a record's scanned div header, or (None, None) when it has no readable one."""
    header = readable_scanned(found, raw)
    if header is None:
        return None, None
    return header.guid, header.kind


class LiveValidation:
    """Validation over persisted state: what a re-delivered record is, and what to write when."""

    def __init__(
        self,
        validator: DataIntegrityValidator,
        values: StateValues | None = None,
        ledger_topics: frozenset[str] = frozenset(),
    ) -> None:
        self.validator = validator
        # How state is written to and read from the table (Confluent-framed Avro).
        self.values = values or StateValues.unregistered()
        # The content signal of log rewinds needs the exact semantics (Venice's knows none).
        self.detects_content_rewinds = validator.semantics is Semantics.EXACT
        # Compacted topics: their keys' last validated records go to the key ledger. Held
        # packed per key until the writes are taken: one entry per key and unit (None: the
        # key's last record was a DIV control record, which has no entry).
        self.ledger_topics = ledger_topics
        self._ledger: dict[tuple[str, int], dict[bytes, bytes | None]] = {}
        self._loaded: set[tuple[str, int]] = set()
        # Loaded partitions whose partition state came from the table (not started afresh).
        self._saved: set[tuple[str, int]] = set()
        self._dirty: dict[tuple[str, int], set[bytes]] = {}
        # Partitions whose every producer is written with the next unit (see `load_many`).
        self._rewrite: set[tuple[str, int]] = set()
        # Producers evicted over the producer limit since the last writes: deleted with them,
        # so a restore does not bring them back.
        self._evicted: dict[tuple[str, int], set[bytes]] = {}
        self.load_errors: list[LoadError] = []
        self.replays_skipped = 0
        # Found since the last `take_rewinds`, oldest first.
        self._rewinds: list[Rewind] = []
        # Producers last seen before records deleted before validation (`kdiv.worker.retention`).
        self.behind_deletions = BehindDeletions()

    # -- ownership ---------------------------------------------------------------------------

    def is_loaded(self, topic: str, partition: int) -> bool:
        """True when the partition's saved state is installed."""
        return (topic, partition) in self._loaded

    def load(self, topic: str, partition: int, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Install saved state for one partition from its table entries (other keys ignored)."""
        self.load_many({(topic, partition)}, items)

    def load_many(self, wanted: set[tuple[str, int]], items: Iterable[tuple[bytes, bytes]]) -> None:
        """Install saved state for several partitions from one pass over table entries.

        A value that cannot be decoded is recorded in `load_errors` and left out, so that
        producer starts afresh (its next record is judged as a new producer's) instead of
        the worker stopping.
        """
        parts: dict[tuple[str, int], PartitionValidation] = {}
        producers: dict[tuple[str, int], dict[bytes, bytes]] = {tp: {} for tp in wanted}
        for key, value in items:
            try:
                state_key = parse_key(key)
            except StateDecodeError as bad:
                self.load_errors.append(LoadError(key, str(bad)))
                continue
            tp = (state_key.topic, state_key.partition)
            if tp not in wanted or value is None:
                continue
            if state_key.guid is not None:
                # Kept packed (the tracker keeps idle producers so), read by slicing where it
                # was written packed: no million Segments, no million Avro decodes.
                try:
                    producers[tp][state_key.guid] = self.values.packed_producer(value)
                except StateDecodeError as bad:
                    self.load_errors.append(LoadError(key, str(bad)))
                continue
            try:
                state = self.values.decode(value)
            except StateDecodeError as bad:
                self.load_errors.append(LoadError(key, str(bad)))
                continue
            if not isinstance(state, PartitionValidation):
                self.load_errors.append(LoadError(key, f"holds a {type(state).__name__}, not what its key names"))
            else:
                parts[tp] = state
        for tp in wanted:
            part = parts.get(tp) or PartitionValidation(in_push=self.validator.start_in_push)
            self.validator.restore_partition(tp[0], tp[1], part, producers[tp])
            self._loaded.add(tp)
            if tp in parts:
                self._saved.add(tp)
            else:
                self._saved.discard(tp)
            # Written again with the first unit: a store kept on local disk may hold writes
            # whose changelog records a crash lost, and replays that are skipped would never
            # send them; the partition's next owner restores from the changelog.
            if tp in parts or producers[tp]:
                self._dirty[tp] = {b""}
                self._rewrite.add(tp)
            else:
                self._dirty[tp] = set()

    def unload(self, topic: str, partition: int) -> None:
        """Forget a partition (revoked): its next owner reads it from the table."""
        self._loaded.discard((topic, partition))
        self._saved.discard((topic, partition))
        self._dirty.pop((topic, partition), None)
        self._rewrite.discard((topic, partition))
        self._evicted.pop((topic, partition), None)
        self._ledger.pop((topic, partition), None)
        self.behind_deletions.forget(topic, partition)
        self.validator.clear_partition(topic, partition)

    def resume_offset(self, topic: str, partition: int) -> int | None:
        """The first offset a loaded partition's saved state has not validated (0 after a
        rewind); None when its state was not saved (nothing to resume from)."""
        if (topic, partition) not in self._saved:
            return None
        return self.validator.partitions[(topic, partition)].last_offset + 1

    @property
    def loaded(self) -> frozenset[tuple[str, int]]:
        """The partitions whose state is installed."""
        return frozenset(self._loaded)

    # -- log rewinds --------------------------------------------------------------------------

    def rewind(self, topic: str, partition: int, first_offset: int, detected_by: str, detail: str) -> Rewind | None:
        """Forget that offsets from `first_offset` on were validated (their records are gone):
        records there are validated as new, never skipped as replays. None when nothing
        validated lies at or past `first_offset`."""
        tp = (topic, partition)
        part = self.validator.partitions.get(tp)
        if part is None or first_offset > part.last_offset:
            return None
        found = Rewind(topic, partition, first_offset, part.last_offset, detected_by, detail, part.in_push)
        part.last_offset = first_offset - 1
        # The offset holes counted before are another log's: no evidence for a gap across.
        part.holes_from, part.holes = first_offset, 0
        dirty = self._dirty.setdefault(tp, set())
        dirty.add(b"")
        tracker = part.tracker
        tracker.rewound(first_offset)
        for guid, state in list(tracker.segments.items()):
            if as_segment(state).last_offset >= first_offset:
                segment = cast(Segment, tracker.segment(guid))
                segment.last_offset = first_offset - 1
                dirty.add(guid)
        self._rewinds.append(found)
        # Another log: producers behind a deletion in the old one say nothing of the new one.
        self.behind_deletions.forget(topic, partition)
        return found

    def _replay_rewritten(
        self, record: ConsumedRecord, part: PartitionValidation, header: DivHeader | None
    ) -> Rewind | None:
        """The content signal, for a record at an offset already validated: its producer's
        saved state covers the offset, yet the record names a segment or seq past anything
        that state has seen, so it is not the record validated there. The log is rewound from
        its offset (exact semantics only; None when the record may be the one validated)."""
        if not self.detects_content_rewinds or header is None:
            return None
        seen = part.tracker.segment(header.guid)
        if seen is None or seen.last_offset < record.offset:
            return None
        furthest = furthest_seen(seen)
        if (header.segment, header.seq) <= furthest:
            return None
        past = f"segment {header.segment} seq {header.seq}, past its segment {furthest[0]} seq {furthest[1]}"
        return self.rewind(
            record.topic,
            record.partition,
            record.offset,
            "content",
            f"the record at offset {record.offset} is {past}, though the state of producer "
            f"{header.guid.hex()} covers offsets up to {seen.last_offset}",
        )

    def check_topic_id(self, topic: str, partition: int, topic_id: str | None) -> Rewind | None:
        """Compare a loaded partition's saved topic ID with the topic's ID now: another ID
        is another log, and everything validated in the old one is gone from it."""
        part = self.validator.partitions.get((topic, partition))
        if part is None or topic_id is None or part.topic_id == topic_id:
            return None
        before, part.topic_id = part.topic_id, topic_id
        self._dirty.setdefault((topic, partition), set()).add(b"")
        if before is None:
            return None  # first seen: saved with the next unit
        return self.rewind(
            topic,
            partition,
            0,
            "topic id",
            f"topic {topic} was deleted and created again (topic id {before}, now {topic_id}): "
            f"the records validated at offsets 0..{part.last_offset} are not in the new log",
        )

    def take_rewinds(self) -> list[Rewind]:
        """Rewinds found since the last call."""
        found, self._rewinds = self._rewinds, []
        return found

    # -- records deleted before validation ----------------------------------------------------

    def validated_to(self, topic: str, partition: int) -> int | None:
        """The last offset of a loaded partition validated (or accounted for); None when it
        has none: the partition has no position a deletion could pass."""
        part = self.validator.partitions.get((topic, partition))
        if (topic, partition) not in self._loaded or part is None or part.last_offset < 0:
            return None
        return part.last_offset

    def log_starts_at(
        self, topic: str, partition: int, log_start: int, detected_by: str, detail: str
    ) -> Deletion | None:
        """The partition's log starts at `log_start` (the broker says): the offsets from the
        first one not validated to the one before it were deleted before they were validated.
        They are accounted for as read (none of them can be read any more), found once (None
        when nothing unvalidated was deleted), and every producer of the partition is behind
        the deletion until its next record (`deletion_behind`)."""
        validated = self.validated_to(topic, partition)
        if validated is None or log_start <= validated + 1:
            return None
        tp = (topic, partition)
        part = self.validator.partitions[tp]
        found = Deletion(topic, partition, validated + 1, log_start - 1, detected_by, detail, part.in_push)
        part.last_offset = log_start - 1
        # Deleted offsets are no holes: whether compaction had removed records there first
        # is not known, so a gap across them cannot be told from loss.
        part.holes_from, part.holes = log_start, 0
        self._dirty.setdefault(tp, set()).add(b"")
        self.behind_deletions.note(found, part.tracker.segments)
        return found

    def deletion_behind(self, result: ValidationResult) -> Deletion | None:
        """The deletion before validation that a result's loss lies in, if any
        (`kdiv.worker.retention.BehindDeletions.loss_in`). Every result of a partition must
        come here in record order, the OK ones of the producers behind a deletion included: the
        worker watches them (`producers_behind_deletions`)."""
        return self.behind_deletions.loss_in(result)

    def producers_behind_deletions(self, topic: str, partition: int) -> set[bytes]:
        """Producers of the partition behind a deletion whose next record has not come."""
        return self.behind_deletions.unseen(topic, partition)

    # -- validation --------------------------------------------------------------------------

    def opens_unit(self, record: ConsumedRecord, scanned: tuple[int, bytes | None] | None = None) -> bool:
        """True when pending writes of the record's partition must be made before it.

        `scanned`: the record's `scan_div_header`, when the caller has it (one scan a record)."""
        if not self._dirty.get((record.topic, record.partition)):
            return False
        # The kind byte first: the full rule (`_producer_of`) only for the rare push marker.
        found, raw = scanned or scan_div_header(record.headers)
        if found != 1 or raw is None or len(raw) < 2 or raw[1] not in _PUSH_MARKERS:
            return False
        _guid, kind = _producer_of(found, raw)
        return kind in _PUSH_MARKERS

    def process(
        self, record: ConsumedRecord, now_ms: int, scanned: tuple[int, bytes | None] | None = None
    ) -> ValidationResult | None:
        """Validate one record; None when it is a replay whose effect is already saved.

        `scanned`: the record's `scan_div_header`, when the caller has it (one scan a record)."""
        found, raw = scanned or scan_div_header(record.headers)
        tp = (record.topic, record.partition)
        if tp not in self._loaded:
            raise RuntimeError(f"{record.topic}[{record.partition}] is validated before its state is loaded")
        part = self.validator.partitions[tp]
        dirty = self._dirty.setdefault(tp, set())
        if record.topic in self.ledger_topics and record.key is not None:
            # Replays too: a crash may have saved the partition state but not the ledger
            # entry (another topic), and the entry of a replay is the same entry.
            self._ledger.setdefault(tp, {})[record.key] = packed_key_validation_of(record)
        if record.offset <= part.last_offset:
            header = readable_scanned(found, raw)
            if self._replay_rewritten(record, part, header) is None:
                guid = header.guid if header is not None else None
                seen = part.tracker.segment(guid) if guid is not None else None
                if guid is None or (seen is not None and seen.last_offset >= record.offset):
                    self.replays_skipped += 1
                    return None
                # The partition state already holds this record's effects: its producer's alone.
                result = self.validator.bring_forward(record, now_ms, found, raw)
                dirty.add(guid)
                return result
        result = self.validator.validate_scanned(record, now_ms, found, raw)
        if result.guid is not None:
            dirty.add(result.guid)
        else:
            # Counted in the partition state only: the unit still has something to write.
            dirty.add(b"")
        return result

    def process_run(
        self,
        topic: str,
        partition: int,
        records: Sequence[FetchedRecord],
        start: int,
        now_ms: int,
        watch: set[bytes],
        results: list[ValidationResult],
    ) -> int:
        """Validate new records of one partition from `records[start]` on, in bulk
        (`DataIntegrityValidator.validate_run`: results only for what is not an intact
        in-order record, or is `watch`ed); returns the index of the first record left for
        `opens_unit` and `process` (a re-delivery or a push marker), or `len(records)`."""
        tp = (topic, partition)
        if tp not in self._loaded:
            raise RuntimeError(f"{topic}[{partition}] is validated before its state is loaded")
        dirty = self._dirty.setdefault(tp, set())
        ledger = self._ledger.setdefault(tp, {}) if topic in self.ledger_topics else None
        return self.validator.validate_run(topic, partition, records, start, now_ms, dirty, watch, results, ledger)

    def take_ledger_writes(self, topic: str, partition: int) -> list[tuple[bytes, bytes]]:
        """Key ledger entries validated since the last call (the latest per key)."""
        entries = self._ledger.pop((topic, partition), None)
        if not entries:
            return []
        return ledger_writes(self.values, topic, partition, entries)

    def evict_over_limit(self, topic: str, partition: int) -> Eviction | None:
        """`DataIntegrityValidator.evict_over_limit`; the evicted producers' saved states are
        deleted with the partition's next writes."""
        eviction = self.validator.evict_over_limit(topic, partition)
        if eviction is not None:
            self._evicted.setdefault((topic, partition), set()).update(eviction.guids)
            self._dirty.setdefault((topic, partition), set()).update(eviction.guids)
        return eviction

    def take_writes(self, topic: str, partition: int) -> StateWrites | None:
        """The writes that save everything validated since the last call, or None."""
        return run_slices(self.take_writes_in_slices(topic, partition))

    def take_writes_in_slices(self, topic: str, partition: int) -> Generator[None, None, StateWrites | None]:
        """`take_writes`, pausing (a bare `yield`) between slices of producer states encoded
        (`partition_writes_in_slices`), for a caller that lets its event loop run there."""
        tp = (topic, partition)
        dirty = self._dirty.get(tp)
        if not dirty:
            return None
        evicted = self._evicted.pop(tp, set())
        if tp in self._rewrite:
            # Every producer is written again: the checkpoint's upserts are all of them.
            checkpoint = self.validator.checkpoint(topic, partition)
            self._rewrite.discard(tp)
            dirty.update(checkpoint.upserts)
        else:
            checkpoint = self.validator.checkpoint(topic, partition, dirty)
        changed = list(dirty)  # what the writes cover, should more be validated during the pauses
        yield  # a checkpoint may walk every producer of the partition
        writes = yield from partition_writes_in_slices(
            self.values, topic, partition, self.validator.partitions[tp], checkpoint, changed, evicted
        )
        # Only now: writes given up half way (the task cancelled) leave the producers dirty.
        dirty.difference_update(changed)
        return writes
