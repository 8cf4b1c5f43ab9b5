"""Routes: the chains of topics and processor groups a traced record travels through.

Text: routes separated by ";", each `name=topic>group>topic>group>topic...`: topics and
consumer groups alternate, starting and ending with a topic, at least one hop. A topic
position may list alternatives, `a|b`: a record goes to one of them.

The last stage may also be files a processor writes (an archive in object storage):
`parquet:PATH` or `avro:PATH` (`FILE_FORMATS`), e.g. `orders=orders>archiver>parquet:s3a://b/orders`.
Only the nightly job reads files; the live worker judges such a route up to its last Kafka
stage (`Route.live`). A path cannot hold ">", "|" or ";", the chain's separators.

The model: stage 0 is the first topic; hop k is the processor (its consumer group) that
reads stage k and writes to one of the topics of stage k+1. A hop reads its whole stage, so
with alternatives the next hop's group consumes every one of them (`Hop.sources` is the
stage). A route whose branches continue differently cannot be written as one route; every
topic appears once in a route, so a topic tells its stage.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

ROUTE_SEPARATOR = ";"
HOP_SEPARATOR = ">"
ALTERNATIVE_SEPARATOR = "|"
# Never in a topic name, so a sink holding it is a file sink: `format:path`.
FILE_SINK_SEPARATOR = ":"
FILE_FORMATS = ("parquet", "avro")
# Kafka's rule for topic names; route names follow it too (they key state and label metrics).
_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_NAME_RULE = "[a-zA-Z0-9._-], 1 to 249 characters"


class RouteError(ValueError):
    """A route is invalid; the message names the route text and what is wrong."""


def _check_topic(topic: str) -> str | None:
    if not _NAME.fullmatch(topic) or topic in (".", ".."):
        return f"{topic!r} is not a valid topic name ({_NAME_RULE}, not '.' or '..')"
    return None


def is_file_sink(sink: str) -> bool:
    """Whether a stage member is a file sink (`format:path`) rather than a topic."""
    return FILE_SINK_SEPARATOR in sink


@dataclass(frozen=True)
class FileSink:
    """Files a route's last hop writes: read at rest by the nightly job with Spark's reader for `format`."""

    format: str
    path: str

    @property
    def name(self) -> str:
        """As the route text names it, and as the audit names the stage: `format:path`."""
        return f"{self.format}{FILE_SINK_SEPARATOR}{self.path}"

    @classmethod
    def parse(cls, text: str) -> FileSink:
        """The file sink `text` names; RouteError saying what is wrong (format, empty path)."""
        file_format, _, path = text.partition(FILE_SINK_SEPARATOR)
        if file_format not in FILE_FORMATS:
            raise RouteError(
                f"file sink {text!r}: format {file_format!r} is not one of {', '.join(FILE_FORMATS)} "
                f"(a topic name cannot hold {FILE_SINK_SEPARATOR!r})"
            )
        if not path.strip():
            raise RouteError(f"file sink {text!r} has an empty path")
        return cls(file_format, path)


@dataclass(frozen=True)
class Hop:
    """One processor: its consumer group reads `sources` (a stage) and writes to one of `sinks`."""

    sources: tuple[str, ...]
    group: str
    sinks: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.sources or not self.sinks:
            raise RouteError(f"hop of group {self.group!r} needs at least one source and one sink topic")
        if not self.group:
            raise RouteError(f"hop {self.sources}>{self.sinks} has an empty group")

    @property
    def source(self) -> str:
        """The hop's one source topic; RouteError when it reads several alternatives."""
        if len(self.sources) != 1:
            raise RouteError(f"hop of group {self.group!r} reads {len(self.sources)} topics {self.sources}, not one")
        return self.sources[0]


@dataclass(frozen=True)
class Route:
    """A named chain of hops; hop k+1 reads exactly what hop k writes to."""

    name: str
    hops: tuple[Hop, ...]

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise RouteError(f"route name {self.name!r} is not valid ({_NAME_RULE})")
        if not self.hops:
            raise RouteError(f"route {self.name!r} has no hop")
        for index in range(1, len(self.hops)):
            if self.hops[index].sources != self.hops[index - 1].sinks:
                raise RouteError(
                    f"route {self.name!r}: hop {index} reads {self.hops[index].sources}, "
                    f"not what hop {index - 1} writes to {self.hops[index - 1].sinks}"
                )
        seen: set[str] = set()
        for topic in (topic for stage in self.stages for topic in stage):
            if topic in seen:
                raise RouteError(f"route {self.name!r}: topic {topic!r} appears twice")
            seen.add(topic)
        for index, stage in enumerate(self.stages[:-1]):
            for sink in stage:
                if is_file_sink(sink):
                    raise RouteError(
                        f"route {self.name!r}: file sink {sink!r} is stage {index}, but only the last stage "
                        "can be files (no consumer group reads them)"
                    )
        for sink in self.stages[-1]:
            if is_file_sink(sink):
                try:
                    FileSink.parse(sink)
                except RouteError as bad:
                    raise RouteError(f"route {self.name!r}: {bad}") from None

    @cached_property
    def stages(self) -> tuple[tuple[str, ...], ...]:
        """Stage 0 is the first hop's sources, stage k+1 hop k's sinks."""
        return (self.hops[0].sources,) + tuple(hop.sinks for hop in self.hops)

    @cached_property
    def topics(self) -> tuple[str, ...]:
        """Every stage member, file sinks (`format:path`) included: what `stage_of` knows."""
        return tuple(topic for stage in self.stages for topic in stage)

    @cached_property
    def kafka_topics(self) -> tuple[str, ...]:
        """The route's topics, without its file sinks."""
        return tuple(topic for topic in self.topics if not is_file_sink(topic))

    @cached_property
    def file_sinks(self) -> tuple[FileSink, ...]:
        return tuple(FileSink.parse(sink) for sink in self.stages[-1] if is_file_sink(sink))

    def live(self) -> Route | None:
        """The route as the live worker can judge it: without a last hop that writes files, even
        as one alternative (it observes topics only), so a trace is delivered on reaching that
        hop's input. None when nothing is left: the route's one hop writes files."""
        if not self.file_sinks:
            return self
        if len(self.hops) == 1:
            return None
        return Route(self.name, self.hops[:-1])

    @cached_property
    def _stage_by_topic(self) -> dict[str, int]:
        return {topic: index for index, stage in enumerate(self.stages) for topic in stage}

    def stage_of(self, topic: str) -> int | None:
        return self._stage_by_topic.get(topic)

    @property
    def last_stage(self) -> int:
        return len(self.hops)


def parse_routes(text: str) -> tuple[Route, ...]:
    """The routes of `text`; RouteError naming the route text and what is wrong. Empty text: none."""
    routes: list[Route] = []
    names: set[str] = set()
    for entry in text.split(ROUTE_SEPARATOR):
        if not entry.strip():
            continue  # a trailing ";" is harmless
        route = _parse_route(entry.strip())
        if route.name in names:
            raise RouteError(f"route {entry.strip()!r}: route name {route.name!r} is used twice")
        names.add(route.name)
        routes.append(route)
    return tuple(routes)


def _parse_route(entry: str) -> Route:
    def error(problem: str) -> RouteError:
        return RouteError(f"route {entry!r}: {problem}")

    name, equals, chain = entry.partition("=")
    name = name.strip()
    if not equals:
        raise error("missing '=' between the route name and its chain (name=topic>group>topic)")
    if not name:
        raise error("the route name is empty")
    if not _NAME.fullmatch(name):
        raise error(f"route name {name!r} is not valid ({_NAME_RULE})")
    segments = [segment.strip() for segment in chain.split(HOP_SEPARATOR)]
    for position, segment in enumerate(segments, start=1):
        if not segment:
            raise error(f"segment {position} of the chain is empty")
    if len(segments) < 3:
        raise error("needs at least one hop: topic>group>topic")
    if len(segments) % 2 == 0:
        raise error(f"ends with the group {segments[-1]!r}; a chain ends with a topic")
    stages: list[tuple[str, ...]] = []
    groups: list[str] = []
    where: dict[str, int] = {}
    for position, segment in enumerate(segments, start=1):
        if position % 2 == 0:
            if ALTERNATIVE_SEPARATOR in segment:
                raise error(f"segment {position} {segment!r} is a group and cannot list alternatives")
            groups.append(segment)
            continue
        topics = tuple(topic.strip() for topic in segment.split(ALTERNATIVE_SEPARATOR))
        for topic in topics:
            if not topic:
                raise error(f"segment {position} {segment!r} has an empty alternative")
            if is_file_sink(topic):
                if position != len(segments):
                    raise error(
                        f"segment {position}: file sink {topic!r} is not the last stage; only the last "
                        "stage can be files (no consumer group reads them)"
                    )
                try:
                    FileSink.parse(topic)
                except RouteError as bad:
                    raise error(f"segment {position}: {bad}") from None
            else:
                problem = _check_topic(topic)
                if problem is not None:
                    raise error(f"segment {position}: {problem}")
            if topic in where:
                raise error(
                    f"topic {topic!r} appears twice (segments {where[topic]} and {position}), so its stage is ambiguous"
                )
            where[topic] = position
        stages.append(topics)
    hops = tuple(Hop(stages[index], group, stages[index + 1]) for index, group in enumerate(groups))
    return Route(name, hops)


def stage_map(routes: Iterable[Route]) -> dict[str, tuple[tuple[str, int], ...]]:
    """Topic (or file sink) name -> the (route, stage)s it is: what an observer of its records
    reports them as."""
    stages: dict[str, list[tuple[str, int]]] = {}
    for route in routes:
        for index, stage in enumerate(route.stages):
            for name in stage:
                stages.setdefault(name, []).append((route.name, index))
    return {name: tuple(pairs) for name, pairs in stages.items()}


def validate_routes(
    routes: Sequence[Route], existing_topics: Collection[str], known_groups: Collection[str] | None = None
) -> list[str]:
    """What is wrong with `routes` on this cluster: missing topics, unknown groups (when known_groups
    is given). File sinks are not the cluster's, so not looked for."""
    problems: list[str] = []
    for route in routes:
        for stage, topics in enumerate(route.stages):
            for topic in topics:
                if topic not in existing_topics and not is_file_sink(topic):
                    problems.append(
                        f"route {route.name!r}: topic {topic!r} (stage {stage}) does not exist on the cluster"
                    )
        if known_groups is None:
            continue
        for index, hop in enumerate(route.hops):
            if hop.group not in known_groups:
                problems.append(
                    f"route {route.name!r}: group {hop.group!r} (hop {index}, reading {'|'.join(hop.sources)}) "
                    "is not known to the cluster, so the audit cannot see its committed offsets"
                )
    return problems
