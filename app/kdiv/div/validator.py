"""The validator façade: one PartitionTracker and push phase per (topic, partition).

It turns tracker exceptions into verdicts and does what Venice's ingestion task does around
the tracker: outside a push a fatal fault is reported and a second pass with everything
tolerated moves state past it; inside a push the fault is reported, state stays as the
tracker left it, and the push is FAILED until the next START_OF_PUSH.

Pure: no I/O, and time comes in with each call.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from kdiv.div import exact
from kdiv.div.compaction import Evidence, holes_at, weigh_gap
from kdiv.div.exact import NOT_WEIGHED, UNTOLD_HOLES, Gap, GapLog, GapReport, Seen
from kdiv.div.faults import (
    FATAL_VERDICTS,
    DataValidationError,
    FatalDataValidation,
    ImproperlyStartedSegment,
    Verdict,
)
from kdiv.div.ledger import DATA_FLAGS, TOMBSTONE_FLAGS, pack_fields, packed_key_validation_of
from kdiv.div.record import ConsumedRecord, FetchedRecord, consumed
from kdiv.div.segment import Segment, last_offsets, last_producer_times, last_producer_ts, latest_producer_ts
from kdiv.div.tracker import PartitionTracker, UnpackedBudget
from kdiv.div.wire import (
    COMMON_SIZE,
    DATA_VERSIONS,
    HEADER_NAME,
    DivHeader,
    Kind,
    MalformedHeader,
    decode,
    record_crc,
    scan_div_header,
    unpack_common,
)

DISABLED = -1
# Recent seqs per producer whose CRCs the exact semantics keeps (8 bytes each).
DEFAULT_WINDOW = 8
_UINT64_MASK = (1 << 64) - 1


class Semantics(enum.Enum):
    """Which verdicts: Venice's exactly, or kdiv's exact ones beside them (the default)."""

    EXACT = "exact"  # LATE and DIVERGENT told from DUPLICATE; one gap, one incident
    VENICE = "venice"


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """What the validator must know of a topic's configuration."""

    # The topic's min.compaction.lag.ms when cleanup.policy includes compact, else None.
    compaction_lag_ms: int | None = None


class ValidationResult(NamedTuple):
    """The verdict on one record, with the producer, segment and sequence it names."""

    # A tuple, not a dataclass: one is made per consumed record.
    record: ConsumedRecord
    verdict: Verdict
    guid: bytes | None = None
    segment: int | None = None
    seq: int | None = None
    fatal: bool = False
    detail: str = ""
    # The gap a MISSING or LATE record belongs to, as it stands after the record (exact
    # semantics): its incident is the gap's, one per gap.
    gap: GapReport | None = None


@dataclass(slots=True)
class PartitionValidation:
    """Everything the validator keeps for one (topic, partition)."""

    tracker: PartitionTracker = field(default_factory=PartitionTracker)
    in_push: bool = False
    # The last push failed; cleared by the next START_OF_PUSH.
    push_failed: bool = False
    last_offset: int = -1
    records: int = 0
    # Offset holes: offsets between two records validated one after the other at which no
    # record was read (removed by compaction; transaction markers and aborted records under
    # read_committed), counted from 0 at offset `holes_from` (-1: from the first record the
    # partition validates; moved on, the count restarted, where the offsets before are not
    # the log's evidence: records deleted before validation, a rewound log). Each producer
    # state notes the count at its last record, so the holes after it are a subtraction
    # (`kdiv.div.compaction`).
    holes: int = 0
    holes_from: int = -1
    # Gaps in a compacted topic that compaction may have made but whose offset holes are not
    # known, so cannot be told from loss: reported MISSING, saying so.
    untold_gaps: int = 0
    # Per verdict other than OK; OK is records minus their sum (kept out of the hot path).
    verdict_counts: dict[Verdict, int] = field(default_factory=dict)
    # Latest producer timestamp over the producer states saved at the previous checkpoint:
    # the data-relative anchor of maxAge expiry (Venice's calculateLatestMessageTimeInMs).
    checkpoint_anchor_ms: int = -1
    # The broker's ID of the topic the offsets above count in (None: not known): a topic
    # deleted and created again gets a new one, and its offsets start over.
    topic_id: str | None = None
    # The producer limit's overflow episode (`evict_over_limit`): the partition's last offset
    # at its first eviction (-1: none under way), and producers evicted since. Not saved.
    evicting_since: int = -1
    evicted: int = 0

    @property
    def counts(self) -> dict[Verdict, int]:
        """Records of the partition by verdict, OK included."""
        ok = self.records - sum(self.verdict_counts.values())
        return {Verdict.OK: ok, **self.verdict_counts} if ok else dict(self.verdict_counts)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What to save for one partition: producer states to upsert and expired GUIDs to delete."""

    # Idle producers' states are packed (`kdiv.div.segment.as_segment` reads either).
    upserts: Mapping[bytes, Segment | bytes]
    expired: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Eviction:
    """Producers a partition stopped tracking to stay within the producer limit."""

    topic: str
    partition: int
    limit: int
    # Evicted now, least recently seen first, and the last offset of the latest of them.
    guids: tuple[bytes, ...]
    newest_last_offset: int
    # The episode these belong to: the partition's last offset at its first eviction, and
    # producers evicted since (these included).
    since_offset: int
    episode_evicted: int


_UNTRACKED_DETAIL = "no div header"
_DATA = int(Kind.DATA)
_PUSH_MARKERS = (int(Kind.START_OF_PUSH), int(Kind.END_OF_PUSH))
_OK = Verdict.OK
_unpack_common = unpack_common
_scan_div_header = scan_div_header
# Builds the result tuple without NamedTuple's Python-level __new__: it is made per record.
_new_result = tuple.__new__


class DataIntegrityValidator:
    """Venice's DIV checks over consumed records, per topic-partition, with push phases and expiry."""

    def __init__(
        self,
        policy: Callable[[str], TopicPolicy] = lambda topic: TopicPolicy(),
        *,
        start_in_push: bool = False,
        max_age_ms: int = DISABLED,
        semantics: Semantics = Semantics.EXACT,
        window: int = DEFAULT_WINDOW,
        max_producers: int = 0,
    ) -> None:
        self.semantics = semantics
        # Producers tracked per partition at most (0: no limit); kdiv's, not Venice's.
        self.max_producers = max_producers
        self._exact = semantics is Semantics.EXACT
        self.window = window if self._exact else 0
        # The latest validation time seen (`now_ms`): under the exact semantics, producer
        # timestamps further ahead of it than maxAge anchor no expiry (`checkpoint`).
        self._validated_at_ms = -1
        self._policy = policy
        self._policies: dict[str, TopicPolicy] = {}
        self._start_in_push = start_in_push
        self.max_age_ms = max_age_ms
        self.partitions: dict[tuple[str, int], PartitionValidation] = {}
        # The unpacked producer states all partitions may hold, shared among them.
        self._unpacked = UnpackedBudget()

    @property
    def start_in_push(self) -> bool:
        """True when partitions start inside a push (faults fatal)."""
        return self._start_in_push

    def partition(self, topic: str, partition: int) -> PartitionValidation:
        """The partition's validation state, created on first use."""
        key = (topic, partition)
        state = self.partitions.get(key)
        if state is None:
            state = self.partitions[key] = PartitionValidation(
                tracker=PartitionTracker(self.window, self._exact, self._unpacked), in_push=self._start_in_push
            )
            self._unpacked.shared_by(len(self.partitions))
        return state

    def restore_partition(
        self, topic: str, partition: int, state: PartitionValidation, producers: Mapping[bytes, Segment | bytes]
    ) -> None:
        """Install saved state (e.g. from a changelog), replacing what the partition had."""
        state.tracker.window = self.window
        state.tracker.implicit_segments = self._exact
        state.tracker.install(producers)
        state.tracker.budget = self._unpacked
        self.partitions[(topic, partition)] = state
        self._unpacked.shared_by(len(self.partitions))

    def clear_partition(self, topic: str, partition: int) -> None:
        """Forget a partition's state (its owner moved it elsewhere)."""
        self.partitions.pop((topic, partition), None)
        self._unpacked.shared_by(len(self.partitions))

    def _topic_policy(self, topic: str) -> TopicPolicy:
        policy = self._policies.get(topic)
        if policy is None:
            policy = self._policies[topic] = self._policy(topic)
        return policy

    def validate(self, record: ConsumedRecord, now_ms: int) -> ValidationResult:
        """The verdict on one record, its effects applied to the partition's state."""
        found, raw = _scan_div_header(record.headers)
        return self.validate_scanned(record, now_ms, found, raw)

    def validate_scanned(self, record: ConsumedRecord, now_ms: int, found: int, raw: bytes | None) -> ValidationResult:
        """`validate`, for a caller that already scanned the headers (`scan_div_header`)."""
        if now_ms > self._validated_at_ms:
            self._validated_at_ms = now_ms
        # Fast path: an intact in-order DATA record of a known producer, read straight from
        # the header bytes. Anything else takes the full path below.
        if found == 1 and raw is not None and len(raw) == COMMON_SIZE:
            version, kind, guid, segment, seq, producer_ts, header_crc = _unpack_common(raw)
            if version in DATA_VERSIONS and kind == _DATA:
                part = self.partitions.get((record.topic, record.partition))
                if part is not None:
                    offset = record.offset
                    last = part.last_offset
                    holes = part.holes + offset - last - 1 if last >= 0 and offset > last else part.holes
                    if part.tracker.accept_in_order(
                        guid,
                        segment,
                        seq,
                        producer_ts,
                        header_crc,
                        record_crc(_DATA, record.key, record.value),
                        offset,
                        holes if offset > last else -1,
                    ):
                        part.records += 1
                        if offset > last:
                            if last < 0:
                                part.holes_from = offset
                            part.last_offset = offset
                            part.holes = holes
                        return _new_result(ValidationResult, (record, _OK, guid, segment, seq, False, "", None))
        return self._validate_full(record, now_ms, found, raw)

    def bring_forward(self, record: ConsumedRecord, now_ms: int, found: int, raw: bytes | None) -> ValidationResult:
        """The verdict on a record whose partition-level effects the partition state already
        holds (saved before a crash that lost its producer's state): applied to its producer's
        state alone. The partition's phase, push outcome, last offset and counts stay as they
        are, so the record is judged in the phase it was first judged in and counted once."""
        return self._validate_full(record, now_ms, found, raw, partition_effects=False)

    def validate_run(
        self,
        topic: str,
        partition: int,
        records: Sequence[FetchedRecord],
        start: int,
        now_ms: int,
        touched: set[bytes],
        watch: set[bytes],
        results: list[ValidationResult],
        ledger: dict[bytes, bytes | None] | None = None,
    ) -> int:
        """Validate `records[start:]` of `topic`[`partition`], in offset order, as `validate`
        would one by one, without a result (or a ConsumedRecord) per intact in-order record.

        Appends to `results` the result of every record the fast path does not take (faults,
        control records, records without a producer) and of the fast path's records whose
        producer is in `watch`; a producer with a fault here joins `watch`. Adds each
        record's producer GUID (b"" for none) to `touched`. Stops before a record at or
        below the partition's last offset (a re-delivery: the caller decides whether it is a
        replay) and before a push marker (which may close the caller's unit of writes), and
        returns the index it stopped at (`len(records)` when it took them all).

        `ledger` (a compacted topic's): each keyed record's packed key ledger entry is put
        under its key (None for a DIV control record), from the header fields and CRC the
        validation read: a ledger entry costs no second header scan or CRC.
        """
        if now_ms > self._validated_at_ms:
            self._validated_at_ms = now_ms
        part = self.partition(topic, partition)
        accept_in_order = part.tracker.accept_in_order
        last = part.last_offset
        holes = part.holes
        accepted = 0
        i = start
        end = len(records)
        while i < end:
            record = records[i]
            offset = record.offset
            if offset <= last:
                break
            headers = record.headers
            if len(headers) == 1:
                name, raw = headers[0]
                found = 1 if name == HEADER_NAME else 0
            else:
                found, raw = _scan_div_header(headers)
            if found == 1 and raw is not None:
                if len(raw) == COMMON_SIZE:
                    version, kind, guid, segment, seq, producer_ts, header_crc = _unpack_common(raw)
                    if version in DATA_VERSIONS and kind == _DATA:
                        crc = record_crc(_DATA, record.key, record.value)
                        # The partition's holes with this record's (offsets only grow here).
                        at = holes + offset - last - 1 if last >= 0 else holes
                        in_order = accept_in_order(guid, segment, seq, producer_ts, header_crc, crc, offset, at)
                    else:
                        in_order = False
                    if in_order:
                        accepted += 1
                        if last < 0:
                            part.holes_from = offset
                        holes = at
                        last = offset
                        touched.add(guid)
                        if ledger is not None:
                            key = record.key
                            if key is not None:
                                flags = DATA_FLAGS if record.value is not None else TOMBSTONE_FLAGS
                                ledger[key] = pack_fields(offset, record.timestamp, crc, flags, guid, segment, seq)
                        if guid in watch:
                            results.append(
                                _new_result(
                                    ValidationResult,
                                    (consumed(topic, partition, record), _OK, guid, segment, seq, False, "", None),
                                )
                            )
                        i += 1
                        continue
                if len(raw) > 1 and raw[1] in _PUSH_MARKERS:
                    break
            # Everything else, one by one: the counters first, as the full path reads them.
            part.records += accepted
            accepted = 0
            part.last_offset = last
            part.holes = holes
            result = self._validate_full(consumed(topic, partition, record), now_ms, found, raw)
            last = part.last_offset
            holes = part.holes
            results.append(result)
            if ledger is not None and record.key is not None:
                ledger[record.key] = packed_key_validation_of(record)
            guid = result.guid
            if guid is None:
                touched.add(b"")
            else:
                touched.add(guid)
                if result.verdict is not _OK:
                    watch.add(guid)
            i += 1
        part.records += accepted
        part.last_offset = last
        part.holes = holes
        part.tracker.pack_crowded()  # producers unpacked by the fast path
        return i

    def _validate_full(
        self, record: ConsumedRecord, now_ms: int, found: int, raw: bytes | None, partition_effects: bool = True
    ) -> ValidationResult:
        count = self._count if partition_effects else _uncounted
        if not found:
            return count(record, ValidationResult(record, Verdict.UNTRACKED, detail=_UNTRACKED_DETAIL))
        if found > 1:
            return count(
                record, ValidationResult(record, Verdict.MALFORMED, detail=f"{found} div headers, expected one")
            )
        try:
            header = decode(raw)
        except MalformedHeader as bad:
            return count(record, ValidationResult(record, Verdict.MALFORMED, detail=str(bad)))

        part = self.partition(record.topic, record.partition)
        kind = header.kind
        crc = record_crc(kind, record.key, record.value)
        tracker = part.tracker
        tracker.pack_crowded()  # before the producer's state is read: none is held meanwhile

        is_push_marker = kind == Kind.START_OF_PUSH or kind == Kind.END_OF_PUSH
        # START_OF_PUSH and END_OF_PUSH are validated as inside the push they delimit.
        inside_push = part.in_push or is_push_marker
        eop = not inside_push
        lag_ms = self._topic_policy(record.topic).compaction_lag_ms

        before = tracker.segment(header.guid) if self._exact else None
        # The producer's record before this one: a gap's first missing record came after it.
        previous_ts = before.last_producer_ts if before is not None else -1
        previous_seq = before.sequence_number if before is not None else -1
        seen = exact.look(before, header.segment, header.seq) if before is not None else None
        # The partition's offset holes up to this record (bounds: exact unless the record lies
        # behind the partition's last offset), which its producer's state notes.
        prior = before if self._exact or record.offset > part.last_offset else tracker.segment(header.guid)
        holes_low, holes_high = holes_at(
            part.last_offset,
            part.holes,
            record.offset,
            prior.last_offset if prior is not None else -1,
            prior.partition_holes if prior is not None else -1,
            part.holes_from,
        )
        evidence: list[Evidence] = []  # weighed once, when a branch asks

        def tolerate_compacted_gap() -> bool:
            # Compaction may have removed superseded records once they are min.compaction.lag.ms
            # old. Venice asks that of the incoming record, by the wall clock.
            if lag_ms is None:
                return False
            if not self._exact:
                return now_ms - record.timestamp >= lag_ms
            # The exact semantics asks it of the oldest record that can be missing, the one
            # after the producer's previous record (a gap closed by a fresh record may still be
            # old records the cleaner removed), as a necessary condition only: the wall clock
            # of a worker running behind says little. What decides is the log's evidence
            # (`kdiv.div.compaction`): an offset hole for each missing record.
            old = now_ms - record.timestamp >= lag_ms or (previous_ts >= 0 and now_ms - previous_ts >= lag_ms)
            if not old or before is None or seen is None:
                return False
            if not evidence:
                missing = header.seq - seen.high - 1 if seen.seen is Seen.AHEAD else 0
                evidence.append(
                    weigh_gap(
                        missing,
                        before.last_offset,
                        before.partition_holes,
                        part.holes_from,
                        record.offset,
                        holes_low,
                        holes_high,
                    )
                )
            return evidence[0].explains

        verdict = Verdict.OK
        detail = ""
        try:
            tracker.validate(header, crc, record.offset, eop, tolerate_compacted_gap)
        except DataValidationError as fault:
            verdict = fault.verdict
            detail = fault.detail
            if verdict is Verdict.MISSING and evidence and evidence[0].detail:
                detail = f"{detail}; {evidence[0].detail}"
                if evidence[0].untold and partition_effects:
                    part.untold_gaps += 1
            if eop and isinstance(fault, FatalDataValidation) and not isinstance(fault, ImproperlyStartedSegment):
                # Reported; now force state past the fault so one loss is one report.
                try:
                    tracker.validate(header, crc, record.offset, True, _always, tolerate_segment_jump=True)
                except DataValidationError:
                    pass  # e.g. DUPLICATE for a corrupt END_OF_SEGMENT: the record is skipped
        # Whatever the verdict, the producer's state has now seen this record: a consumer that
        # reads it again (a replay after a crash) can tell so from the offset.
        after = tracker.segment(header.guid)
        if after is not None and record.offset >= after.last_offset:
            after.last_offset = record.offset
            after.partition_holes = holes_low if holes_low == holes_high else -1
        if (
            after is before
            and after is not None
            and lag_ms is not None
            and verdict is Verdict.OK
            and header.seq > previous_seq + 1
            and after.checksum is not None
        ):
            # A gap excused as compaction: the segment's checksum now misses the removed
            # records' share, so its END_OF_SEGMENT can no longer be checked against it.
            after.checksum = None
        gap = None
        venice_verdict = verdict
        if seen is not None and after is not None:
            if after is not before:  # a new segment: the producer's gaps go on with it
                after.gaps = cast(Segment, before).gaps
            gap_holes = NOT_WEIGHED
            if evidence and evidence[0].detail:
                gap_holes = UNTOLD_HOLES if evidence[0].untold else evidence[0].holes
            verdict, detail, gap = self._judge_exactly(
                seen, after, header, crc, record.offset, verdict, detail, inside_push, gap_holes
            )

        fatal = inside_push and verdict in FATAL_VERDICTS
        result = ValidationResult(record, verdict, header.guid, header.segment, header.seq, fatal, detail, gap)
        if not partition_effects:
            return result
        if is_push_marker and venice_verdict is not Verdict.DUPLICATE:
            part.in_push = kind == Kind.START_OF_PUSH
            if part.in_push:
                part.push_failed = False
        if fatal:
            part.push_failed = True
        return self._count(record, result, part)

    def _judge_exactly(
        self,
        seen: exact.Look,
        state: Segment,
        header: DivHeader,
        crc: int,
        offset: int,
        verdict: Verdict,
        detail: str,
        inside_push: bool,
        gap_holes: int = NOT_WEIGHED,
    ) -> tuple[Verdict, str, GapReport | None]:
        """The exact verdict on a record Venice's rule judged `verdict`, and the producer's
        exact state (`state`, after Venice's rule) updated by it. `gap_holes`: what the offset
        holes said of a gap the record closes (`Gap.holes`)."""
        segment, seq = header.segment, header.seq
        # The CRC the producer stamped (a corrupt record's re-send compares equal to it).
        claimed = header.crc if header.kind == Kind.DATA else crc
        gaps = state.gaps
        gap: Gap | None = None
        how = seen.seen
        if how is Seen.LATE:
            gap = cast(Gap, seen.gap)
            if header.kind == Kind.DATA and crc != header.crc:
                # Not the record that was lost: the gap waits on for an intact one.
                verdict = Verdict.CORRUPT
                detail = (
                    f"seq {seq} of segment {segment} arrived late (it is in the gap reported MISSING at offset "
                    f"{gap.found_offset}), and its record CRC32 {crc:08x} differs from {header.crc:08x} in its div header"
                )
            else:
                gap.arrive(seq, offset)
                if (
                    verdict is Verdict.DUPLICATE  # Venice's state is past it: its share is not counted yet
                    and segment == state.segment_number
                    and state.registered
                    and state.checksum is not None
                    and not state.checksum_finalized
                ):
                    state.checksum = (state.checksum + crc) & _UINT64_MASK
                verdict = Verdict.LATE
                detail = (
                    f"seq {seq} of segment {segment} arrived late, after seq {seen.high}: it is in the gap "
                    f"reported MISSING at offset {gap.found_offset}"
                )
        elif how is Seen.AGAIN:
            if claimed == seen.crc_then:
                verdict = Verdict.DUPLICATE
                detail = f"seq {seq} of segment {segment} was already seen, with the same CRC {claimed:08x}"
            else:
                verdict = Verdict.DIVERGENT
                detail = (
                    f"seq {seq} of segment {segment} was already seen with CRC {seen.crc_then:08x}; this one has "
                    f"{claimed:08x}: other bytes under one seq, which consumers that skip duplicates would lose"
                )
        elif how is Seen.PAST:
            if verdict is Verdict.DUPLICATE:
                detail += f" (not among the last {self.window} seqs kdiv compares: judged by Venice's rule)"
        elif how is Seen.NEXT:
            if verdict is Verdict.MISSING and gaps is not None:
                # Inside a push Venice's state stays before a gap: this record is judged after it.
                gap = gaps.latest(segment)
                if gap is not None:
                    gap.judged += 1
                    gap.last_judged_offset = offset
        elif how is Seen.AHEAD:
            if verdict is Verdict.MISSING:
                if gaps is None:
                    gaps = state.gaps = GapLog(segment, seen.high)
                gap = Gap(segment, seen.high + 1, seq - 1, offset, seq, fatal=inside_push, holes=gap_holes)
                gaps.add(gap)
        elif segment < state.segment_number and verdict is Verdict.DUPLICATE:
            detail += " (an earlier segment: not compared)"
        if how is not Seen.AGAIN and how is not Seen.PAST:
            if segment == state.segment_number and state.recent is not None:
                exact.remember(state.recent, seq, claimed)
            if (segment, seq) > (state.segment_number, state.sequence_number):
                # Seen past Venice's state (a fault inside a push leaves that state behind):
                # kept, so a record re-delivered here is known for one validated before.
                if gaps is None:
                    gaps = state.gaps = GapLog(segment, seq)
                else:
                    gaps.see(segment, seq)
            elif gaps is not None and segment == state.segment_number:
                gaps.see(segment, seq)
        report = None
        if gap is not None:
            report = gap.report()
            if verdict is Verdict.MISSING and (how is Seen.NEXT or seen.high != seen.venice_high):
                # Venice's range counts records seen after an earlier gap: name the one gap.
                detail += f"; one gap: {report.describe()}"
        return verdict, detail, report

    def _count(
        self, record: ConsumedRecord, result: ValidationResult, part: PartitionValidation | None = None
    ) -> ValidationResult:
        if part is None:
            part = self.partition(record.topic, record.partition)
        part.records += 1
        if result.verdict is not Verdict.OK:
            part.verdict_counts[result.verdict] = part.verdict_counts.get(result.verdict, 0) + 1
        offset = record.offset
        last = part.last_offset
        if offset > last:
            if last >= 0:
                part.holes += offset - last - 1
            else:
                part.holes_from = offset
            part.last_offset = offset
        return result

    def evict_over_limit(self, topic: str, partition: int) -> Eviction | None:
        """Forget the least recently seen producers (lowest last offset) of a partition
        holding more than `max_producers`, down to that many; None when none is forgotten.

        Not Venice's: Venice keeps every producer until maxAge expires it. An evicted producer
        seen again is judged as one never seen (Venice's rule for an unknown GUID). An
        overflow episode lasts from the first eviction until the partition holds fewer than
        `max_producers` again (maxAge expiry, a rewind)."""
        part = self.partitions.get((topic, partition))
        limit = self.max_producers
        if part is None or limit <= 0:
            return None
        segments = part.tracker.segments
        over = len(segments) - limit
        if over <= 0:
            if over < 0:
                part.evicting_since, part.evicted = -1, 0
            return None
        # (last offset, GUID): ties go the same way on every worker and every replay.
        # A sort in C: heapq.nsmallest's Python loop took most of a second for 100,000.
        oldest = sorted(last_offsets(segments))[:over]
        guids = tuple(guid for _, guid in oldest)
        part.tracker.evict(list(guids))
        if part.evicting_since == -1:
            part.evicting_since, part.evicted = part.last_offset, 0
        part.evicted += over
        return Eviction(topic, partition, limit, guids, oldest[-1][0], part.evicting_since, part.evicted)

    def checkpoint(self, topic: str, partition: int, changed: Collection[bytes] | None = None) -> Checkpoint:
        """Producer states to persist now, after dropping those expired by maxAge.

        Expiry is data-relative, as in Venice: a producer is kept iff its last producer
        timestamp is >= (latest timestamp saved at the previous checkpoint) - maxAge. Under
        the exact semantics the latest timestamp is that of the producers whose clocks are
        credible: not further ahead of the validation's time than maxAge. One record stamped
        2^60 (or in microseconds) would otherwise expire every other producer of its
        partition at the next checkpoint but one; Venice's rule keeps that weakness.

        `changed`: the GUIDs of every producer validated or evicted since the previous
        checkpoint (a superset will do). Given, the checkpoint asks only those, where the
        partition's `ProducerTimes` can answer for the others (most checkpoints), and its
        upserts are those producers' states only; None walks every producer (the reference).
        """
        part = self.partition(topic, partition)
        part.tracker.pack_idle()
        segments = part.tracker.segments
        times = part.tracker.times
        threshold = None
        if self.max_age_ms != DISABLED and part.checkpoint_anchor_ms != -1:
            threshold = part.checkpoint_anchor_ms - self.max_age_ms
        credible = None
        if self._exact and self.max_age_ms != DISABLED and self._validated_at_ms >= 0:
            credible = self._validated_at_ms + self.max_age_ms
        if changed is not None:
            upserts: dict[bytes, Segment | bytes] = {}
            fold = times.fold
            for guid in changed:
                state = segments.get(guid)
                if state is None:
                    fold(guid, None, credible)
                else:
                    upserts[guid] = state
                    fold(guid, last_producer_ts(state), credible)
            if times.answers(threshold, credible):
                times.answered(credible)
                part.checkpoint_anchor_ms = times.latest
                return Checkpoint(upserts=upserts, expired=())
        expired: list[bytes] = []
        if threshold is not None:
            # Sorted: the same deletions in the same order on every worker and replay.
            expired = sorted(guid for guid, s in segments.items() if last_producer_ts(s) < threshold)
            for guid in expired:
                del segments[guid]
        if changed is not None:
            # One walk gives the bounds and, with them, the anchor the reference computes.
            times.walked(last_producer_times(segments), credible)
            part.checkpoint_anchor_ms = times.latest
            for guid in expired:
                upserts.pop(guid, None)
            return Checkpoint(upserts=upserts, expired=tuple(expired))
        part.checkpoint_anchor_ms = latest_producer_ts(segments, at_most=credible)
        times.forget()
        return Checkpoint(upserts=segments.copy(), expired=tuple(expired))


def _uncounted(
    record: ConsumedRecord, result: ValidationResult, part: PartitionValidation | None = None
) -> ValidationResult:
    return result


def _always() -> bool:
    return True
