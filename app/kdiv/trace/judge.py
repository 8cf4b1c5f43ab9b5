"""The Inca judge: the observations of each trace along its route, turned into verdicts.

A trace is observed on the topics of its route's stages. Hop k's group reads stage k and
writes stage k+1. Per trace (route, trace id) the judge decides:

* DUPLICATED: a stage k >= 1 holds more than one record of the trace; about hop k-1, once
  per stage. The trace stays open.
* DELIVERED: the trace reached the last stage. It waits, at most the grace, for stages it
  has not seen yet (observations of one trace arrive in any order), so the per-hop latencies
  are complete when it can.
* LOST: the trace is stuck at stage k < last, hop k's group has committed past every record
  of it at stage k (committed offset > record offset: Kafka's committed offset is the next
  one to read), and for `grace_ms` since the judge first saw that, nothing arrived at
  stage k+1. Until the group commits past it, the trace is lagging however long it waits.
* UNRESOLVED: neither, `max_wait_ms` after its first observation.

Committed offsets are monotonic: a lower one later is ignored, as an offset reset backwards
is a replay, not a loss. Time is the judge's (`now_ms` passed in), never the records'.

Crash safety: each trace's state (`TraceState`) packs to bytes the worker keeps in its
table, written as `take_changed` reports; replayed observations (same topic, partition,
offset) are recognised and ignored. A judge restarted from those states, and fed the
committed offsets again, gives the verdicts the uninterrupted one would have.

Resolved traces are remembered (`remember_resolved` of them, the oldest resolved forgotten
first), as states like the open ones, so that an observation arriving after the verdict is
still judged with what came before: a further copy after DELIVERED is DUPLICATED, a replay
is ignored, and a trace reported LOST or UNRESOLVED that then moves on is judged again (its
DELIVERED says it was reported before: the grace or the wait was too short). Beyond that
memory, a late observation opens a new trace.
"""

from __future__ import annotations

import enum
import heapq
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdiv.trace.header import TRACE_ID_SIZE
from kdiv.trace.routes import Route
from kdiv.untrusted import preview

# A record's position: (topic, partition, offset).
Where = tuple[str, int, int]
TraceKey = tuple[str, bytes]
PENDING = "PENDING"


class ObservationError(ValueError):
    """An observation or a state does not fit the configured routes."""


@dataclass(frozen=True, slots=True)
class Observation:
    """A traced record seen on a route's topic."""

    trace_id: bytes
    route: str
    stage: int
    topic: str
    partition: int
    offset: int
    timestamp_ms: int  # the record's Kafka timestamp
    origin_ms: int  # from the trace header


class TraceOutcome(enum.Enum):
    DELIVERED = "DELIVERED"
    LOST = "LOST"
    DUPLICATED = "DUPLICATED"
    UNRESOLVED = "UNRESOLVED"


@dataclass(frozen=True)
class TraceVerdict:
    """A verdict about one trace and one hop of its route, with what to replay or inspect."""

    outcome: TraceOutcome
    route: str
    trace_id: bytes
    # LOST: the hop that lost it; DUPLICATED: the hop whose output has copies; DELIVERED: the
    # last hop; UNRESOLVED: the hop the trace waits on.
    hop: int
    group: str | None = None
    # The record at the hop's input, to replay it.
    source: Where | None = None
    # DUPLICATED: every copy at the hop's output.
    copies: tuple[Where, ...] = ()
    # LOST and UNRESOLVED: the group's committed offset on the source partition.
    committed_offset: int | None = None
    # DELIVERED: per hop, output record timestamp minus input record timestamp (empty when a
    # stage was never observed).
    latencies_ms: tuple[int, ...] = ()
    # DELIVERED: last stage record timestamp minus the trace's origin.
    end_to_end_ms: int | None = None
    detail: str = ""
    # The trace header's origin (the producer's wall time when it stamped the record): the
    # incident's record time, the one time every hop's copy shares.
    origin_ms: int | None = None

    @property
    def trace_id_hex(self) -> str:
        return self.trace_id.hex()


@dataclass(slots=True)
class TraceState:
    """What the judge holds about one trace of one route.

    `observations`: stage -> record position -> (record timestamp, judge time first seen),
    so a replay is recognised by its position. `committed_since_ms`: stage -> judge time at
    which the hop's group was first seen committed past every record of the trace there.
    """

    first_seen_ms: int  # judge time of the first observation (or of the reopening)
    origin_ms: int
    observations: dict[int, dict[Where, tuple[int, int]]] = field(default_factory=dict)
    committed_since_ms: dict[int, int] = field(default_factory=dict)
    duplicates_reported: set[int] = field(default_factory=set)
    # The terminal verdict given (DELIVERED, LOST or UNRESOLVED), None while open.
    resolved: TraceOutcome | None = None
    resolved_ms: int | None = None
    # The terminal verdict given before the trace moved on and reopened.
    earlier: TraceOutcome | None = None

    @property
    def highest_stage(self) -> int:
        return max(self.observations)

    def copies(self, stage: int) -> list[Where]:
        """The records at `stage`, the earliest (by record timestamp) first."""
        records = self.observations.get(stage, {})
        return sorted(records, key=lambda where: (records[where][0], where))

    def timestamp(self, stage: int) -> int:
        """The earliest record timestamp at `stage`."""
        return min(timestamp for timestamp, _ in self.observations[stage].values())

    def arrived_ms(self, stage: int) -> int:
        """Judge time of the first observation at `stage`."""
        return min(seen for _, seen in self.observations[stage].values())

    def unreported_duplicates(self) -> list[int]:
        """Stages >= 1 holding several records of the trace, not reported yet, in order."""
        found = [
            stage
            for stage, records in self.observations.items()
            if len(records) > 1 and stage >= 1 and stage not in self.duplicates_reported
        ]
        if len(found) > 1:
            found.sort()
        return found

    # -- binary form ---------------------------------------------------------------------
    #
    # version B (1), resolved B, earlier B (outcome codes), first_seen_ms q, origin_ms q,
    # [resolved_ms q when resolved], topics H + each (length H, UTF-8), observations I + each
    # (stage H, topic index H, partition i, offset q, timestamp q, seen q), committed_since
    # H + each (stage H, ms q), duplicates reported H + each (stage H). Big-endian.

    def pack(self) -> bytes:
        # Written once per change of every trace: the common shapes (one record per stage,
        # one topic, nothing committed or reported) take no sort and no encoding.
        observations = self.observations
        parts = [
            _HEAD.pack(_STATE_VERSION, _CODES[self.resolved], _CODES[self.earlier], self.first_seen_ms, self.origin_ms)
        ]
        if self.resolved is not None:
            parts.append(_Q.pack(self.resolved_ms if self.resolved_ms is not None else 0))
        count = 0
        names: set[str] = set()
        for records in observations.values():
            count += len(records)
            for where in records:
                names.add(where[0])
        topics = tuple(sorted(names)) if len(names) > 1 else tuple(names)
        parts.append(_topics_entry(topics))
        topic_index = {topic: index for index, topic in enumerate(topics)}
        parts.append(_I.pack(count))
        pack_observation = _OBSERVATION.pack
        for stage in sorted(observations) if len(observations) > 1 else observations:
            records = observations[stage]
            for where in sorted(records) if len(records) > 1 else records:
                timestamp, seen = records[where]
                topic, partition, offset = where
                parts.append(pack_observation(stage, topic_index[topic], partition, offset, timestamp, seen))
        committed = self.committed_since_ms
        parts.append(_H.pack(len(committed)))
        for stage in sorted(committed) if len(committed) > 1 else committed:
            parts.append(_COMMITTED.pack(stage, committed[stage]))
        reported = self.duplicates_reported
        parts.append(_H.pack(len(reported)))
        for stage in sorted(reported) if len(reported) > 1 else reported:
            parts.append(_H.pack(stage))
        return b"".join(parts)

    @classmethod
    def unpack(cls, raw: bytes) -> TraceState:
        """The state `pack` wrote; ValueError naming what is wrong with `raw`."""
        reader = _Reader(bytes(raw))
        version = reader.read(_B, "the version")[0]
        if version != _STATE_VERSION:
            raise ValueError(f"trace state version {version} is unknown (this kdiv reads {_STATE_VERSION})")
        reader.offset = 0
        _, resolved_code, earlier_code, first_seen_ms, origin_ms = reader.read(_HEAD, "the header")
        resolved = _outcome_of(resolved_code, "resolved")
        earlier = _outcome_of(earlier_code, "earlier")
        resolved_ms = reader.read(_Q, "resolved_ms")[0] if resolved is not None else None
        topics = []
        for index in range(reader.read(_H, "the topic count")[0]):
            length = reader.read(_H, f"topic {index}'s length")[0]
            try:
                topics.append(reader.take(length, f"topic {index}").decode())
            except UnicodeDecodeError as bad:
                raise ValueError(f"trace state topic {index} is not UTF-8: {bad}") from None
        observations: dict[int, dict[Where, tuple[int, int]]] = {}
        for index in range(reader.read(_I, "the observation count")[0]):
            stage, topic_index, partition, offset, timestamp, seen = reader.read(_OBSERVATION, f"observation {index}")
            if topic_index >= len(topics):
                raise ValueError(f"trace state observation {index} names topic {topic_index} of {len(topics)}")
            where = (topics[topic_index], partition, offset)
            records = observations.setdefault(stage, {})
            if where in records:
                raise ValueError(f"trace state observation {index} repeats {_text(where)}")
            records[where] = (timestamp, seen)
        committed_since_ms = {}
        for index in range(reader.read(_H, "the committed count")[0]):
            stage, since = reader.read(_COMMITTED, f"committed entry {index}")
            committed_since_ms[stage] = since
        duplicates_reported = {
            reader.read(_H, f"duplicate entry {index}")[0] for index in range(reader.read(_H, "the duplicate count")[0])
        }
        if reader.offset != len(reader.raw):
            raise ValueError(f"trace state has {len(reader.raw) - reader.offset} bytes after its end")
        return cls(
            first_seen_ms,
            origin_ms,
            observations,
            committed_since_ms,
            duplicates_reported,
            resolved,
            resolved_ms,
            earlier,
        )


_STATE_VERSION = 1
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">q")
_HEAD = struct.Struct(">BBBqq")
_OBSERVATION = struct.Struct(">HHiqqq")
_COMMITTED = struct.Struct(">Hq")
# DUPLICATED is never terminal, so it has no code.
_CODES: dict[TraceOutcome | None, int] = {
    None: 0,
    TraceOutcome.DELIVERED: 1,
    TraceOutcome.LOST: 2,
    TraceOutcome.UNRESOLVED: 3,
}
_OUTCOMES = {code: outcome for outcome, code in _CODES.items()}


_TOPIC_ENTRIES: dict[tuple[str, ...], bytes] = {}


def _topics_entry(topics: tuple[str, ...]) -> bytes:
    """The packed topic list (count, then each length-prefixed), cached: a judge's states name
    the few topics of its routes."""
    entry = _TOPIC_ENTRIES.get(topics)
    if entry is None:
        encoded = [topic.encode() for topic in topics]
        entry = _H.pack(len(topics)) + b"".join(_H.pack(len(e)) + e for e in encoded)
        if len(_TOPIC_ENTRIES) < 1024:
            _TOPIC_ENTRIES[topics] = entry
    return entry


def _outcome_of(code: int, what: str) -> TraceOutcome | None:
    if code not in _OUTCOMES:
        raise ValueError(f"trace state {what} outcome code {code} is unknown")
    return _OUTCOMES[code]


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.offset = 0

    def take(self, size: int, what: str) -> bytes:
        end = self.offset + size
        if end > len(self.raw):
            raise ValueError(f"trace state of {len(self.raw)} bytes is truncated in {what} (at byte {self.offset})")
        chunk = self.raw[self.offset : end]
        self.offset = end
        return chunk

    def read(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size, what))


def state_key(route: str, trace_id: bytes) -> bytes:
    """The key a trace's state is stored under: the route name, a zero byte, the 16-byte id."""
    if len(trace_id) != TRACE_ID_SIZE:
        raise ValueError(f"trace id must be {TRACE_ID_SIZE} bytes, got {len(trace_id)}")
    # The zero byte ends the name, so one route's keys are a prefix range of their own.
    return route.encode() + b"\x00" + trace_id


# -- verdicts ------------------------------------------------------------------------------

CommittedLookup = Callable[[str, str, int], int | None]
_TOPIC_NAME_MAX = 249


def _text(where: Where) -> str:
    topic, partition, offset = where
    # An observation's topic is read from the record: as long as a topic name can be, or cut.
    return f"{topic if len(topic) <= _TOPIC_NAME_MAX else preview(topic)}[{partition}]@{offset}"


def _head(route: Route, trace_id: bytes) -> str:
    return f"trace {trace_id.hex()} on route {route.name}"


def _earlier_note(state: TraceState) -> str:
    if state.earlier is None:
        return ""
    return f"; it had been reported {state.earlier.value} before it moved on (the grace or the wait is too short)"


def _committed_past(route: Route, state: TraceState, stage: int, committed: CommittedLookup) -> bool:
    """Whether hop `stage`'s group has committed past every record of the trace at `stage`."""
    group = route.hops[stage].group
    for topic, partition, offset in state.observations[stage]:
        position = committed(group, topic, partition)
        if position is None or position <= offset:
            return False
    return True


def _duplicated(route: Route, trace_id: bytes, state: TraceState, stage: int) -> TraceVerdict:
    hop = route.hops[stage - 1]
    copies = tuple(state.copies(stage))
    inputs = state.copies(stage - 1)
    source = inputs[0] if inputs else None
    detail = (
        f"{_head(route, trace_id)}: hop {stage - 1} (group {hop.group}) wrote {len(copies)} copies of one record: "
        + ", ".join(_text(where) for where in copies)
        + (f", from {_text(source)}" if source is not None else "")
    )
    if len(inputs) > 1:
        detail += f"; its input stage already held {len(inputs)} copies, so they may come from upstream"
    return TraceVerdict(
        TraceOutcome.DUPLICATED,
        route.name,
        trace_id,
        stage - 1,
        hop.group,
        source,
        copies,
        detail=detail,
        origin_ms=state.origin_ms,
    )


def _delivered(route: Route, trace_id: bytes, state: TraceState) -> TraceVerdict:
    last = route.last_stage
    hop = route.hops[-1]
    arrival = state.copies(last)[0]
    end_to_end = state.timestamp(last) - state.origin_ms
    missing = [stage for stage in range(last) if stage not in state.observations]
    if missing:
        latencies: tuple[int, ...] = ()
        hops_text = f"stage(s) {', '.join(map(str, missing))} never observed, so no per-hop latencies"
    else:
        latencies = tuple(state.timestamp(stage + 1) - state.timestamp(stage) for stage in range(last))
        hops_text = "per hop " + ", ".join(f"{latency} ms" for latency in latencies)
    inputs = state.copies(last - 1)
    return TraceVerdict(
        TraceOutcome.DELIVERED,
        route.name,
        trace_id,
        last - 1,
        hop.group,
        inputs[0] if inputs else None,
        latencies_ms=latencies,
        end_to_end_ms=end_to_end,
        detail=f"{_head(route, trace_id)} delivered to {_text(arrival)}, {end_to_end} ms after its origin ({hops_text})"
        + _earlier_note(state),
        origin_ms=state.origin_ms,
    )


def _lost(
    route: Route,
    trace_id: bytes,
    state: TraceState,
    stage: int,
    committed: CommittedLookup,
    since_text: str,
) -> TraceVerdict:
    hop = route.hops[stage]
    copies = state.copies(stage)
    source = copies[0]
    position = committed(hop.group, source[0], source[1])
    others = (
        f" (and its {len(copies) - 1} other copies: " + ", ".join(map(_text, copies[1:])) + ")"
        if len(copies) > 1
        else ""
    )
    detail = (
        f"{_head(route, trace_id)} lost at hop {stage}: group {hop.group} committed {source[0]}[{source[1]}] "
        f"to offset {position}, past the record at offset {source[2]}{others}{since_text}, "
        f"and it never appeared on {'|'.join(hop.sinks)}; replay {_text(source)}"
    )
    return TraceVerdict(
        TraceOutcome.LOST,
        route.name,
        trace_id,
        stage,
        hop.group,
        source,
        committed_offset=position,
        detail=detail,
        origin_ms=state.origin_ms,
    )


def _unresolved(
    route: Route, trace_id: bytes, state: TraceState, committed: CommittedLookup, now_ms: int, grace_ms: int
) -> TraceVerdict:
    stage = state.highest_stage
    hop = route.hops[stage]
    source = state.copies(stage)[0]
    position = committed(hop.group, source[0], source[1])
    since = state.committed_since_ms.get(stage)
    if since is not None:
        why = (
            f"group {hop.group} committed past it {now_ms - since} ms ago (offset {position}), "
            f"still within the grace of {grace_ms} ms"
        )
    elif position is None:
        why = f"group {hop.group} has no committed offset on {source[0]}[{source[1]}]: it is lagging or stopped"
    else:
        why = (
            f"group {hop.group} has not committed past it (committed offset {position}, "
            f"record offset {source[2]}): it is lagging or stopped"
        )
    detail = (
        f"{_head(route, trace_id)} unresolved {now_ms - state.first_seen_ms} ms after it was first seen: "
        f"last seen at stage {stage} on {_text(source)}, not yet on {'|'.join(hop.sinks)}; {why}"
    )
    return TraceVerdict(
        TraceOutcome.UNRESOLVED,
        route.name,
        trace_id,
        stage,
        hop.group,
        source,
        committed_offset=position,
        detail=detail,
        origin_ms=state.origin_ms,
    )


# -- the live judge ------------------------------------------------------------------------


class TraceJudge:
    """Judges the traces of one observations partition as their observations and offsets arrive."""

    def __init__(
        self, routes: Sequence[Route], *, grace_ms: int, max_wait_ms: int, remember_resolved: int = 100_000
    ) -> None:
        if grace_ms < 0 or max_wait_ms < 0 or remember_resolved < 0:
            raise ValueError(
                f"grace_ms ({grace_ms}), max_wait_ms ({max_wait_ms}) and remember_resolved "
                f"({remember_resolved}) must not be negative"
            )
        self._routes: dict[str, Route] = {}
        for route in routes:
            if route.name in self._routes:
                raise ValueError(f"route name {route.name!r} is given twice")
            self._routes[route.name] = route
        self.grace_ms = grace_ms
        self.max_wait_ms = max_wait_ms
        self.remember_resolved = remember_resolved
        # (group, topic, partition) -> committed offset, the highest seen.
        self._committed: dict[tuple[str, str, int], int] = {}
        self._open: dict[TraceKey, TraceState] = {}
        self._resolved: dict[TraceKey, TraceState] = {}
        # (resolved_ms, route, trace id) of the resolved states, to forget the oldest first;
        # entries of states reopened or forgotten since are skipped.
        self._eviction: list[tuple[int, str, bytes]] = []
        # Resolved traces with a new copy to report (dicts as ordered sets).
        self._attention: dict[TraceKey, None] = {}
        self._changed: dict[TraceKey, None] = {}
        # What `judge` looks at: an open trace only when something it depends on may have
        # changed, not every open trace on every call. Its verdict depends on its state (looked
        # at after every observation: `_dirty`), on time (the earliest `now_ms` at which a
        # verdict falls due: `_deadlines`), and, while its group has not committed past it, on
        # the committed offsets (a record of it the group has not passed: `_waits`).
        self._dirty: dict[TraceKey, None] = {}
        # Per open trace, the order it was opened in: traces are looked at in that order.
        self._opened: dict[TraceKey, int] = {}
        self._next_opened = 0
        # Heap of (due ms, opened, key); `_due` holds each trace's current one, others are stale.
        self._deadlines: list[tuple[int, int, TraceKey]] = []
        self._due: dict[TraceKey, int] = {}
        # (group, topic, partition) -> heap of (record offset, opened, key); `_waiting` holds
        # each trace's current one.
        self._waits: dict[tuple[str, str, int], list[tuple[int, int, TraceKey]]] = {}
        self._waiting: dict[TraceKey, tuple[tuple[str, str, int], int]] = {}
        self._stale_waits = 0

    def _committed_offset(self, group: str, topic: str, partition: int) -> int | None:
        return self._committed.get((group, topic, partition))

    def _route_of(self, name: str, what: str) -> Route:
        route = self._routes.get(name)
        if route is None:
            raise ObservationError(
                f"{what}: route {preview(name)} is not configured ({', '.join(self._routes) or 'none'})"
            )
        return route

    def observe(self, obs: Observation, now_ms: int) -> bool:
        """Take in one observation; False when it is a replay of one already held.

        ObservationError when it does not fit the routes (an unknown route, a topic not on it
        or at another stage: observations written before the routes were changed).
        """
        where = (obs.topic, obs.partition, obs.offset)
        route = self._routes.get(obs.route)
        stage = None if route is None else route.stage_of(obs.topic)
        if stage is None or stage != obs.stage or len(obs.trace_id) != TRACE_ID_SIZE:
            raise self._misfit(obs)
        key = (obs.route, obs.trace_id)
        state = self._open.get(key)
        if state is None:
            state = self._resolved.get(key)
        if state is None:
            state = self._open[key] = TraceState(now_ms, obs.origin_ms)
            self._opened_now(key)
        elif where in state.observations.get(stage, ()):
            return False
        observations = state.observations
        progress = not observations or stage > max(observations)
        records = observations.get(stage)
        if records is None:
            observations[stage] = {where: (obs.timestamp_ms, now_ms)}
        else:
            records[where] = (obs.timestamp_ms, now_ms)
        if progress and state.committed_since_ms:
            # The grace clocks of stages it has moved past no longer matter.
            for passed in [s for s in state.committed_since_ms if s < stage]:
                del state.committed_since_ms[passed]
        if state.resolved is not None:
            if progress and state.resolved is not TraceOutcome.DELIVERED:
                # Reported LOST or UNRESOLVED, and yet it moved on: judge it again from here.
                state.earlier, state.resolved, state.resolved_ms = state.resolved, None, None
                state.first_seen_ms = now_ms
                del self._resolved[key]
                self._open[key] = state
                self._opened_now(key)
                self._attention.pop(key, None)
            elif state.unreported_duplicates():
                self._attention[key] = None
        if state.resolved is None:
            self._dirty[key] = None
        self._changed[key] = None
        return True

    def _opened_now(self, key: TraceKey) -> None:
        self._opened[key] = self._next_opened
        self._next_opened += 1
        self._dirty[key] = None

    def _misfit(self, obs: Observation) -> ObservationError:
        what = f"observation {_text((obs.topic, obs.partition, obs.offset))} of trace {obs.trace_id.hex()}"
        route = self._route_of(obs.route, what)
        stage = route.stage_of(obs.topic)
        if stage is None:
            return ObservationError(f"{what}: topic {preview(obs.topic)} is not on route {route.name!r}")
        if stage != obs.stage:
            return ObservationError(
                f"{what}: topic {preview(obs.topic)} is stage {stage} of route {route.name!r}, not {obs.stage} "
                "(was the route changed?)"
            )
        return ObservationError(f"{what}: the trace id is {len(obs.trace_id)} bytes, not {TRACE_ID_SIZE}")

    def committed(self, group: str, topic: str, partition: int, offset: int) -> None:
        """The group's committed offset on a partition (the next offset it will read)."""
        key = (group, topic, partition)
        # Monotonic: an offset reset backwards replays records, it does not lose them.
        if offset > self._committed.get(key, -1):
            self._committed[key] = offset
            waits = self._waits.get(key)
            while waits and waits[0][0] < offset:
                record_offset, _, trace = heapq.heappop(waits)
                if self._waiting.get(trace) == (key, record_offset):
                    del self._waiting[trace]
                    self._dirty[trace] = None
                else:
                    self._stale_waits -= 1
            if waits == []:
                del self._waits[key]

    def judge(self, now_ms: int) -> list[TraceVerdict]:
        """The verdicts due at `now_ms`, ordered by route and trace id."""
        verdicts: list[TraceVerdict] = []
        for key in self._attention:
            state = self._resolved.get(key)
            if state is not None:
                verdicts.extend(self._report_duplicates(key, state))
        self._attention.clear()
        # Every open trace a full walk would give a verdict or change: those observed or
        # loaded since the last call, those due, those the group may have committed past.
        # The others' verdicts and states stay as they are until one of those happens.
        looked_at, self._dirty = self._dirty, {}
        deadlines, due = self._deadlines, self._due
        while deadlines and deadlines[0][0] <= now_ms:
            when, _, key = heapq.heappop(deadlines)
            if due.get(key) == when:
                del due[key]
                looked_at[key] = None
        opened = self._opened
        keys = [key for key in looked_at if key in opened]
        if len(keys) > 1:
            keys.sort(key=opened.__getitem__)  # the order of a walk over the open traces
        for key in keys:
            state = self._open[key]
            verdicts.extend(self._report_duplicates(key, state))
            verdict = self._terminal(key, state, now_ms)
            if verdict is not None:
                verdicts.append(verdict)
                self._resolve(key, state, verdict.outcome, now_ms)
            else:
                self._schedule(key, state)
        self._evict()
        verdicts.sort(key=lambda verdict: (verdict.route, verdict.trace_id))
        return verdicts

    def _schedule(self, key: TraceKey, state: TraceState) -> None:
        """When an open trace just looked at, without a verdict, needs looking at again: the
        earliest time a verdict falls due, and, while its hop's group has not committed past
        it, the first of its records that group has yet to pass (committed offsets only grow,
        so nothing else changes until then or until it is observed again)."""
        route = self._routes[key[0]]
        stage = max(state.observations)
        when = state.first_seen_ms + self.max_wait_ms
        wait = None
        if stage == route.last_stage:
            when = min(when, state.arrived_ms(stage) + self.grace_ms)
        else:
            since = state.committed_since_ms.get(stage)
            if since is not None:
                when = min(when, since + self.grace_ms)
            else:
                group = route.hops[stage].group
                committed = self._committed
                for topic, partition, offset in state.observations[stage]:
                    position = committed.get((group, topic, partition))
                    if position is None or position <= offset:
                        wait = ((group, topic, partition), offset)
                        break
        waiting = self._waiting.get(key)
        if waiting != wait:
            if waiting is not None:
                del self._waiting[key]
                self._stale_waits += 1
            if wait is not None:
                self._wait(key, *wait)
        due = self._due
        if due.get(key) != when:
            due[key] = when
            heapq.heappush(self._deadlines, (when, self._opened[key], key))
            if len(self._deadlines) > 2 * len(self._due) + 1024:
                # Mostly entries of traces resolved or rescheduled since: keep the current ones.
                self._deadlines = [(when, self._opened[k], k) for k, when in self._due.items()]
                heapq.heapify(self._deadlines)

    def _wait(self, key: TraceKey, where: tuple[str, str, int], offset: int) -> None:
        self._waiting[key] = (where, offset)
        waits = self._waits.get(where)
        if waits is None:
            waits = self._waits[where] = []
        heapq.heappush(waits, (offset, self._opened[key], key))
        if self._stale_waits > len(self._waiting) + 1024:
            self._waits = {}
            for trace, (position, record_offset) in self._waiting.items():
                self._waits.setdefault(position, []).append((record_offset, self._opened[trace], trace))
            for waits in self._waits.values():
                heapq.heapify(waits)
            self._stale_waits = 0

    def _closed(self, key: TraceKey) -> None:
        """An open trace resolved or forgotten: what `judge` kept to look at it again goes."""
        del self._opened[key]
        self._due.pop(key, None)
        if self._waiting.pop(key, None) is not None:
            self._stale_waits += 1

    def _report_duplicates(self, key: TraceKey, state: TraceState) -> list[TraceVerdict]:
        for records in state.observations.values():
            if len(records) > 1:
                break
        else:
            return []  # no copies at all: what most traces look like
        stages = state.unreported_duplicates()
        if not stages:
            return []
        route = self._routes[key[0]]
        state.duplicates_reported.update(stages)
        self._changed[key] = None
        return [_duplicated(route, key[1], state, stage) for stage in stages]

    def _terminal(self, key: TraceKey, state: TraceState, now_ms: int) -> TraceVerdict | None:
        route = self._routes[key[0]]
        trace_id = key[1]
        stage = state.highest_stage
        waited_out = now_ms - state.first_seen_ms >= self.max_wait_ms
        if stage == route.last_stage:
            complete = len(state.observations) == route.last_stage + 1
            if complete or waited_out or now_ms - state.arrived_ms(stage) >= self.grace_ms:
                return _delivered(route, trace_id, state)
            return None
        since = state.committed_since_ms.get(stage)
        if _committed_past(route, state, stage, self._committed_offset):
            if since is None:
                since = state.committed_since_ms[stage] = now_ms
                self._changed[key] = None
            if now_ms - since >= self.grace_ms:
                since_text = f" {now_ms - since} ms ago (grace {self.grace_ms} ms)"
                return _lost(route, trace_id, state, stage, self._committed_offset, since_text)
        elif since is not None:
            # A new copy the group has not read yet: its grace starts when the group passes it.
            del state.committed_since_ms[stage]
            self._changed[key] = None
        if waited_out:
            return _unresolved(route, trace_id, state, self._committed_offset, now_ms, self.grace_ms)
        return None

    def _resolve(self, key: TraceKey, state: TraceState, outcome: TraceOutcome, now_ms: int) -> None:
        state.resolved, state.resolved_ms = outcome, now_ms
        del self._open[key]
        self._closed(key)
        self._resolved[key] = state
        heapq.heappush(self._eviction, (now_ms, key[0], key[1]))
        self._changed[key] = None

    def _evict(self) -> None:
        while len(self._resolved) > self.remember_resolved:
            resolved_ms, route, trace_id = heapq.heappop(self._eviction)
            key = (route, trace_id)
            state = self._resolved.get(key)
            if state is None or state.resolved_ms != resolved_ms:
                continue
            del self._resolved[key]
            self._attention.pop(key, None)
            self._changed[key] = None

    def open_traces(self, route: str | None = None) -> int:
        """Traces awaiting a verdict, of `route` or of every route (resolved ones remembered
        are not counted)."""
        if route is None:
            return len(self._open)
        return sum(1 for name, _ in self._open if name == route)

    def states(self) -> Mapping[tuple[str, bytes], TraceState]:
        """Every state held, open and resolved, keyed by (route, trace id): the judge's own objects."""
        return {**self._open, **self._resolved}

    def load(self, route: str, trace_id: bytes, state: TraceState) -> None:
        """Install a saved state (the judge takes it over); ObservationError when it does not fit the route."""
        what = f"saved state of trace {trace_id.hex()}"
        configured = self._route_of(route, what)
        for stage, records in state.observations.items():
            for where in records:
                if configured.stage_of(where[0]) != stage:
                    raise ObservationError(
                        f"{what}: {_text(where)} is not stage {stage} of route {route!r} (was the route changed?)"
                    )
        if not state.observations:
            raise ObservationError(f"{what} has no observation")
        key = (route, trace_id)
        self.forget(route, trace_id)
        self._changed.pop(key, None)
        if state.resolved is None:
            self._open[key] = state
            self._opened_now(key)
            return
        self._resolved[key] = state
        heapq.heappush(self._eviction, (state.resolved_ms or 0, route, trace_id))
        if state.unreported_duplicates():
            self._attention[key] = None
        self._evict()

    def forget(self, route: str, trace_id: bytes) -> None:
        """Drop a trace's state, open or resolved."""
        key = (route, trace_id)
        removed = self._open.pop(key, None)
        if removed is not None:
            self._closed(key)
        else:
            removed = self._resolved.pop(key, None)
        self._attention.pop(key, None)
        if removed is not None:
            self._changed[key] = None

    def take_changed(self) -> list[tuple[str, bytes, TraceState | None]]:
        """(route, trace id, state or None when removed) of each state changed since the last call."""
        changed = []
        for key in self._changed:
            state = self._open.get(key)
            if state is None:
                state = self._resolved.get(key)
            changed.append((key[0], key[1], state))
        self._changed.clear()
        return changed


# -- the judge at rest ---------------------------------------------------------------------


@dataclass(frozen=True)
class AtRestResult:
    """Verdicts at rest, and per route the count of each outcome's verdicts and of pending traces."""

    verdicts: list[TraceVerdict]
    counts: dict[str, dict[str, int]]


def judge_at_rest(
    routes: Sequence[Route], observations: Iterable[Observation], committed: Mapping[tuple[str, str, int], int]
) -> AtRestResult:
    """Judge every trace once, with all observations and offsets in (the nightly check).

    No grace: everything has settled. DUPLICATED for each stage >= 1 with copies; DELIVERED
    when the last stage is reached; LOST when the hop's group has committed past every record
    of the trace at the stage it stopped at; otherwise the trace is PENDING (lagging) and
    only counted. `committed` is keyed by (group, topic, partition).
    """
    by_name = {route.name: route for route in routes}
    if len(by_name) != len(routes):
        raise ValueError("route names are given twice")
    states: dict[TraceKey, TraceState] = {}
    for obs in observations:
        where = (obs.topic, obs.partition, obs.offset)
        route = by_name.get(obs.route)
        if route is None:
            raise ObservationError(
                f"observation {_text(where)}: route {preview(obs.route)} is not among the routes judged"
            )
        stage = route.stage_of(obs.topic)
        if stage is None:
            raise ObservationError(
                f"observation {_text(where)}: topic {preview(obs.topic)} is not on route {route.name!r}"
            )
        if stage != obs.stage:
            raise ObservationError(
                f"observation {_text(where)}: topic {preview(obs.topic)} is stage {stage} of route {route.name!r}, not {obs.stage}"
            )
        state = states.get((obs.route, obs.trace_id))
        if state is None:
            state = states[(obs.route, obs.trace_id)] = TraceState(0, obs.origin_ms)
        # setdefault: a replay (same position) counts once.
        state.observations.setdefault(stage, {}).setdefault(where, (obs.timestamp_ms, 0))

    def lookup(group: str, topic: str, partition: int) -> int | None:
        return committed.get((group, topic, partition))

    counts = {route.name: {outcome.value: 0 for outcome in TraceOutcome} | {PENDING: 0} for route in routes}
    verdicts: list[TraceVerdict] = []
    for (name, trace_id), state in sorted(states.items()):
        route = by_name[name]
        found = [_duplicated(route, trace_id, state, stage) for stage in state.unreported_duplicates()]
        stage = state.highest_stage
        if stage == route.last_stage:
            found.append(_delivered(route, trace_id, state))
        elif _committed_past(route, state, stage, lookup):
            found.append(_lost(route, trace_id, state, stage, lookup, ""))
        else:
            counts[name][PENDING] += 1
        for verdict in found:
            counts[name][verdict.outcome.value] += 1
        verdicts.extend(found)
    return AtRestResult(verdicts, counts)
