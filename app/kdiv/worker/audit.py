"""The pipeline audit in the worker: traced records seen on a route's topics, judged across hops.

Every record with a trace header on a route's topic is an observation. Observations are sent
to the observations topic keyed by (route, trace id), so all observations of one trace meet in
one partition, whose owner judges them (`kdiv.trace.judge.TraceJudge`, one per partition, its
per-trace state saved in the `traces` table). The source records' offsets are committed only
after their observations are acknowledged, and the judge ignores an observation it already
holds, so a crash or a rebalance replays without double counting.

Loss is told from lag by the processors' committed offsets, polled from the cluster: a trace is
LOST only once the hop's group has committed past it and the grace has passed without it
appearing downstream.
"""

from __future__ import annotations

import bisect
import logging
import struct
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kdiv.config.settings import Settings
from kdiv.kafka.partitioner import keyed_partition
from kdiv.trace.header import TRACE_ID_SIZE, TraceHeaderError, find_trace
from kdiv.trace.judge import (
    Observation,
    ObservationError,
    TraceJudge,
    TraceOutcome,
    TraceState,
    TraceVerdict,
    state_key,
)
from kdiv.trace.routes import Route, stage_map
from kdiv.untrusted import preview

log = logging.getLogger("kdiv.worker.audit")

_OBSERVATION_VERSION = 1
_FIXED = struct.Struct(">BHiqqq16s")  # version, stage, partition, offset, timestamp, origin, trace id
_TABLE_PARTITION = struct.Struct(">H")
# Latency buckets (ms) of the per-hop histogram.
LATENCY_BUCKETS_MS = (10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000, 3_600_000)


def encode_observation(observation: Observation) -> bytes:
    return _FIXED.pack(
        _OBSERVATION_VERSION,
        observation.stage,
        observation.partition,
        observation.offset,
        observation.timestamp_ms,
        observation.origin_ms,
        observation.trace_id,
    ) + _observation_tail(observation.route, observation.topic)


def _observation_tail(route: str, topic: str) -> bytes:
    """What follows the fixed fields: the route's name (length-prefixed), then the topic's."""
    name = route.encode()
    return struct.pack(">H", len(name)) + name + topic.encode()


def decode_observation(raw: bytes) -> Observation:
    """ValueError naming what is wrong with an observation record's value."""
    if len(raw) < _FIXED.size + 2:
        raise ValueError(f"observation of {len(raw)} bytes is shorter than {_FIXED.size + 2}")
    version, stage, partition, offset, timestamp, origin, trace_id = _FIXED.unpack_from(raw)
    if version != _OBSERVATION_VERSION:
        raise ValueError(f"observation version {version} is not {_OBSERVATION_VERSION}")
    # The route and topic: the few a worker's routes have, decoded once each.
    tail = bytes(raw[_FIXED.size :])
    names = _NAMES.get(tail)
    if names is None:
        (route_length,) = struct.unpack_from(">H", tail)
        names = tail[2 : 2 + route_length].decode(), tail[2 + route_length :].decode()
        if len(_NAMES) < _NAMES_KEPT and len(tail) <= _NAMES_TAIL_KEPT:
            _NAMES[tail] = names
    return Observation(trace_id, names[0], stage, names[1], partition, offset, timestamp, origin)


_NAMES: dict[bytes, tuple[str, str]] = {}
# At most this many, each of a route and a topic name a worker could have (a topic name is at
# most 249 characters): an observation of a megabyte of name is decoded, never kept.
_NAMES_KEPT = 1024
_NAMES_TAIL_KEPT = 1024


def observation_partition(key: bytes, partitions: Sequence[int]) -> int:
    """The observations partition of the observation keyed `key`, among the topic's
    `partitions` (in order): Kafka's default partitioner, murmur2 of the key, as the Java
    client and aiokafka place a keyed record sent without a partition. Every observation of a
    trace has the same key, so they meet in one partition whichever worker sends them."""
    return keyed_partition(key, partitions)


def observations_by_partition(
    records: Iterable[tuple[bytes, bytes]], partitions: Sequence[int]
) -> dict[int, list[tuple[bytes, bytes]]]:
    """Observation records (key, value) grouped by `observation_partition`, in their order."""
    grouped: dict[int, list[tuple[bytes, bytes]]] = {}
    for record in records:
        partition = observation_partition(record[0], partitions)
        batch = grouped.get(partition)
        if batch is None:
            grouped[partition] = [record]
        else:
            batch.append(record)
    return grouped


def table_key(partition: int, route: str, trace_id: bytes) -> bytes:
    """The `traces` table key: the observations partition first, so a partition loads alone."""
    return _TABLE_PARTITION.pack(partition) + state_key(route, trace_id)


@dataclass
class HopStats:
    """What this worker judged of one route hop since it started."""

    outcomes: Counter[str] = field(default_factory=Counter)
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    latency_sum_ms: int = 0

    def add_latency(self, latency_ms: int) -> None:
        self.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS_MS, latency_ms)] += 1
        self.latency_sum_ms += latency_ms


class PipelineAudit:
    """Observations out of the route topics' batches; judges of the observations partitions."""

    def __init__(self, settings: Settings) -> None:
        audit = settings.audit
        self.settings = audit
        self.routes: tuple[Route, ...] = audit.routes
        self.topic = settings.observations
        # topic -> the (route, stage) pairs it is part of.
        self._stages = stage_map(self.routes)
        self._encoded: dict[str, list[tuple[str, int, bytes, bytes]]] = {}
        self.judges: dict[int, TraceJudge] = {}
        # (group, topic, partition) -> committed offset, as last polled.
        self.committed: dict[tuple[str, str, int], int] = {}
        self.known_groups: frozenset[str] | None = None
        self._outgoing: dict[tuple[str, int], list[tuple[bytes, bytes]]] = {}
        self.traced: Counter[tuple[str, int]] = Counter()  # (route, stage) -> observations sent
        self.hops: dict[tuple[str, int], HopStats] = {}
        self.header_errors = 0
        self.bad_observations = 0

    def is_route_topic(self, topic: str) -> bool:
        return topic in self._stages

    # -- observations out ---------------------------------------------------------------

    def observe(self, topic: str, partition: int, records: Sequence) -> None:
        """Observations of the traced records among one partition's fetched records."""
        stages = self._encoded_stages(topic)
        traced = self.traced
        outgoing = None
        for record in records:
            headers = record.headers
            if not headers:
                continue
            try:
                stamp = find_trace(headers)
            except TraceHeaderError as bad:
                self.header_errors += 1
                log.error("unreadable trace header at %s[%d]@%d: %s", topic, partition, record.offset, bad)
                continue
            if stamp is None:
                continue
            if outgoing is None:
                outgoing = self._outgoing.setdefault((topic, partition), [])
            trace_id = stamp.trace_id  # TRACE_ID_SIZE bytes: the header's layout
            for route, stage, key_prefix, tail in stages:
                # `state_key` and `encode_observation`, without an Observation per record.
                value = _FIXED.pack(
                    _OBSERVATION_VERSION, stage, partition, record.offset, record.timestamp, stamp.origin_ms, trace_id
                )
                outgoing.append((key_prefix + trace_id, value + tail))
                traced[(route, stage)] += 1

    def _encoded_stages(self, topic: str) -> list[tuple[str, int, bytes, bytes]]:
        """(route, stage, key prefix, value tail) of each route stage `topic` is: what the
        observations of its records share."""
        encoded = self._encoded.get(topic)
        if encoded is None:
            encoded = self._encoded[topic] = []
            for route, stage in self._stages[topic]:
                key_prefix = state_key(route, bytes(TRACE_ID_SIZE))[:-TRACE_ID_SIZE]
                encoded.append((route, stage, key_prefix, _observation_tail(route, topic)))
        return encoded

    def take_observations(self, topic: str, partition: int) -> list[tuple[bytes, bytes]]:
        """(key, value) records to send for one source partition, before its offsets commit."""
        return self._outgoing.pop((topic, partition), [])

    def forget_source(self, topic: str, partition: int) -> None:
        self._outgoing.pop((topic, partition), None)

    # -- observations in: the judges ------------------------------------------------------

    def _judge_of(self, partition: int) -> TraceJudge:
        judge = self.judges.get(partition)
        if judge is None:
            judge = self.judges[partition] = TraceJudge(
                self.routes, grace_ms=self.settings.grace_ms, max_wait_ms=self.settings.max_wait_ms
            )
            for (group, topic, p), offset in self.committed.items():
                judge.committed(group, topic, p, offset)
        return judge

    def load(self, partition: int, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Install the saved traces of one observations partition; how many."""
        judge = self._judge_of(partition)
        prefix = _TABLE_PARTITION.pack(partition)
        loaded = 0
        for key, value in items:
            if not key.startswith(prefix) or value is None:
                continue
            try:
                state = TraceState.unpack(value)
                route, trace_id = _split_state_key(key[len(prefix) :])
            except ValueError as bad:
                self.bad_observations += 1
                log.error(
                    "unreadable trace state %s in the traces table: %s; that trace starts afresh", preview(key), bad
                )
                continue
            try:
                judge.load(route, trace_id, state)
            except ObservationError as bad:
                self.bad_observations += 1
                log.error("saved trace %s not loaded: %s", preview(key), bad)
                continue
            loaded += 1
        judge.take_changed()  # loaded, not changed
        return loaded

    def unload(self, partition: int) -> None:
        self.judges.pop(partition, None)

    def receive(self, partition: int, records: Sequence, now_ms: int) -> None:
        """Observation records of one observations partition, into its judge."""
        judge = self._judge_of(partition)
        for record in records:
            if record.value is None:
                continue
            try:
                observation = decode_observation(record.value)
            except (ValueError, UnicodeDecodeError, struct.error) as bad:
                self.bad_observations += 1
                log.error("unreadable observation at %s[%d]@%d: %s", self.topic, partition, record.offset, bad)
                continue
            try:
                judge.observe(observation, now_ms)
            except ObservationError as bad:  # e.g. a route changed since it was sent
                self.bad_observations += 1
                log.error("observation at %s[%d]@%d not judged: %s", self.topic, partition, record.offset, bad)

    def note_committed(self, offsets: Mapping[tuple[str, str, int], int]) -> None:
        """The route groups' committed offsets as polled (monotonic per partition)."""
        for (group, topic, partition), offset in offsets.items():
            if offset > self.committed.get((group, topic, partition), -1):
                self.committed[(group, topic, partition)] = offset
                for judge in self.judges.values():
                    judge.committed(group, topic, partition, offset)

    def judge(self, now_ms: int) -> list[tuple[int, TraceVerdict]]:
        """Verdicts of every loaded judge, with their observations partition."""
        verdicts = []
        for partition, judge in self.judges.items():
            for verdict in judge.judge(now_ms):
                verdicts.append((partition, verdict))
                self._count(verdict)
        return verdicts

    def take_changes(self, partition: int) -> list[tuple[bytes, bytes | None]]:
        """Table writes (key, packed state or None to delete) of one observations partition."""
        judge = self.judges.get(partition)
        if judge is None:
            return []
        prefix = _TABLE_PARTITION.pack(partition)
        heads: dict[str, bytes] = {}  # route -> the start of its `table_key`s
        changes: list[tuple[bytes, bytes | None]] = []
        for route, trace_id, state in judge.take_changed():
            head = heads.get(route)
            if head is None:
                head = heads[route] = prefix + state_key(route, trace_id)[:-TRACE_ID_SIZE]
            changes.append((head + trace_id, None if state is None else state.pack()))
        return changes

    def _count(self, verdict: TraceVerdict) -> None:
        stats = self.hops.get((verdict.route, verdict.hop))
        if stats is None:
            stats = self.hops[(verdict.route, verdict.hop)] = HopStats()
        stats.outcomes[verdict.outcome.value] += 1
        if verdict.outcome is TraceOutcome.DELIVERED:
            for hop, latency in enumerate(verdict.latencies_ms):
                hop_stats = self.hops.get((verdict.route, hop))
                if hop_stats is None:
                    hop_stats = self.hops[(verdict.route, hop)] = HopStats()
                hop_stats.add_latency(latency)

    def open_traces(self, route: str | None = None) -> int:
        return sum(judge.open_traces(route) for judge in self.judges.values())


def _split_state_key(key: bytes) -> tuple[str, bytes]:
    """(route, trace id) of a `state_key`: the route's name, a zero byte, 16 id bytes."""
    if len(key) < 18 or key[-17] != 0:
        raise ValueError(f"trace key {preview(key)} is not a route name, a zero byte and a 16-byte trace id")
    return key[:-17].decode(), key[-16:]
