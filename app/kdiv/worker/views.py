"""Read-only web views of a worker (JSON shapes in docs/web-views.md).

Any worker answers for all: a partition's state is served by the worker that owns it
(the request is forwarded there, as Faust's table routing does), and the list views ask
every worker of the group for its partitions and merge the answers. Incidents are read by
every worker from the incidents topic, so each serves them itself.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from importlib import resources
from typing import NamedTuple, cast

from aiohttp import ClientError, ClientTimeout, web
from faust.web import Request, Response, View
from yarl import URL

from kdiv.clock import renderable_ms
from kdiv.div.faults import Verdict
from kdiv.div.segment import Segment, SegmentStatus, as_segment, status_of
from kdiv.div.wire import ChecksumType
from kdiv.registry.subjects import SCHEMA_UNKNOWN, SUBJECT_MISMATCH
from kdiv.ticdc.checksum import FAULT_VERDICTS, ChecksumVerdict
from kdiv.untrusted import parse_json
from kdiv.worker import metrics
from kdiv.worker.faustcompat.internals import peer_topics
from kdiv.worker.incidents import DELETED_BEFORE_VALIDATION, LOG_REWOUND, PRODUCERS_LIMIT
from kdiv.worker.webauth import SignedRequests, answer_is_signed, authentication_middleware, sign_answer, sign_request
from kdiv.worker.webguard import allowed_host_names, host_check_middleware, matches, page_policy, security_headers

log = logging.getLogger("kdiv.views")

LOCAL = "local"
_PEER_TIMEOUT = ClientTimeout(total=5)
MAX_PAGE = 1000
PRODUCERS_PAGE = 100
# A peer's answer read at most (a worker's list of 1,000s of producers is a few MiB).
MAX_PEER_ANSWER = 64 << 20
# The longest integer a query parameter or path takes (int64), and time given as ISO 8601.
MAX_DIGITS = 19
MAX_TIME_TEXT = 40


class PeerAnswer(NamedTuple):
    """Another worker's answer: status and JSON body, both None when it did not answer or its
    answer was refused (`refused` then says why: not signed, not JSON, not a permitted peer)."""

    url: URL
    status: int | None
    body: dict | list | None
    refused: str | None = None


class BadRequest(Exception):
    """A query parameter the view cannot take; answered 400."""


@dataclass(slots=True)
class ProducerFaults:
    """A producer's incidents among those a worker holds: how many of each class, and when."""

    counts: dict[str, int] = field(default_factory=dict)
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, incident) -> None:
        self.counts[incident.verdict] = self.counts.get(incident.verdict, 0) + 1
        at = incident.detected_at_ms
        self.first_ms = at if self.first_ms is None else min(self.first_ms, at)
        self.last_ms = at if self.last_ms is None else max(self.last_ms, at)


def faults_by_producer(incidents) -> dict[tuple[str, int, str], ProducerFaults]:
    """(topic, partition, producer hex) -> its incidents' counts and times."""
    found: dict[tuple[str, int, str], ProducerFaults] = {}
    for incident in incidents:
        if incident.producer is not None:
            key = (incident.topic, incident.partition, incident.producer)
            found.setdefault(key, ProducerFaults()).add(incident)
    return found


def producer_json(topic: str, partition: int, guid: bytes, segment, faults: ProducerFaults | None = None) -> dict:
    """A producer's state as the views show it, with its incidents among those the worker holds."""
    faults = faults or ProducerFaults()
    return {
        "topic": topic,
        "partition": partition,
        "producer": guid.hex(),
        "segment": segment.segment_number,
        "seq": segment.sequence_number,
        "status": segment.status.name,
        "registered": segment.registered,
        "checksum_type": ChecksumType(segment.checksum_type).name,
        "last_offset": segment.last_offset,
        "last_producer_timestamp_ms": segment.last_producer_ts,
        "last_producer_time": iso_time(segment.last_producer_ts),
        "first_producer_timestamp_ms": segment.first_seen_ts if segment.first_seen_ts >= 0 else None,
        "first_producer_time": iso_time(segment.first_seen_ts),
        "incidents": dict(sorted(faults.counts.items())),
        "first_incident_ms": faults.first_ms,
        "first_incident_time": iso_time(faults.first_ms),
        "last_incident_ms": faults.last_ms,
        "last_incident_time": iso_time(faults.last_ms),
    }


def changefeed_partition_json(worker, topic: str, partition: int) -> dict:
    """A changefeed partition assigned here: verified by row checksum, so no DIV state
    (phase, producers); `records` and `counts` are the rows this worker verified since it started."""
    changefeeds = worker.changefeeds
    return {
        "topic": topic,
        "partition": partition,
        "recovering": False,
        "phase": None,
        "push_failed": None,
        "last_offset": changefeeds.last_offsets.get((topic, partition)),
        "records": changefeeds.records[(topic, partition)],
        "counts": changefeeds.partition_counts(topic, partition),
        "producers": None,
        "lag": worker.lag(topic, partition),
        "worker": str(worker.app.conf.canonical_url),
    }


def recovering_partition_json(worker, topic: str, partition: int) -> dict:
    """An assigned partition whose state is still being restored: its owner, no state yet."""
    return {
        "topic": topic,
        "partition": partition,
        "recovering": True,
        "phase": None,
        "push_failed": None,
        "last_offset": None,
        "records": None,
        "counts": None,
        "producers": None,
        "lag": None,
        "worker": str(worker.app.conf.canonical_url),
    }


def partition_json(worker, topic: str, partition: int, part) -> dict:
    """A partition's state, owner and lag as the views show it."""
    return {
        "topic": topic,
        "partition": partition,
        "recovering": False,
        "phase": "push" if part.in_push else "stream",
        "push_failed": part.push_failed,
        "last_offset": part.last_offset,
        "records": part.records,
        "counts": {verdict.value: n for verdict, n in part.counts.items()},
        "producers": len(part.tracker.segments),
        "lag": worker.lag(topic, partition),
        "worker": str(worker.app.conf.canonical_url),
    }


def _shown(raw: str, limit: int = 24) -> str:
    """A value from the request, quoted and cut short, for an error message."""
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")


def parse_count(raw: str, what: str) -> int:
    """A non-negative integer of ASCII digits (not "²", "٣", " 5", "1_0" or "+1", which int()
    takes or trips on), at most MAX_DIGITS long."""
    if not (raw.isascii() and raw.isdigit()):
        raise BadRequest(f"{what}={_shown(raw)} is not a non-negative integer (ASCII digits)")
    if len(raw) > MAX_DIGITS:
        raise BadRequest(f"{what}={_shown(raw)} has more than {MAX_DIGITS} digits")
    return int(raw)


def _int_param(request: Request, name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None):
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    value = parse_count(raw, f"query parameter {name}")
    if value < minimum or (maximum is not None and value > maximum):
        raise BadRequest(f"query parameter {name}={value} is outside {minimum}..{maximum if maximum else ''}")
    return value


# Every class an incident can have: the per-record faults, the subject check's, the rewinds
# and deletions before validation.
INCIDENT_CLASSES = tuple(
    dict.fromkeys(
        [v.value for v in Verdict if v.is_fault]
        + [SCHEMA_UNKNOWN, SUBJECT_MISMATCH, LOG_REWOUND, DELETED_BEFORE_VALIDATION, PRODUCERS_LIMIT]
        + [v.value for v in ChecksumVerdict if v in FAULT_VERDICTS]
        + ["LOST", "DUPLICATED", "UNRESOLVED"]
    )
)
SEVERITIES = ("fatal", "warning")
SCOPES = (LOCAL,)


def _scope(request: Request) -> str | None:
    """The request's scope: LOCAL, or None for the whole group; anything else is a 400."""
    return _choice_param(request, "scope", SCOPES)


# The query parameters each view takes (by its route); any other is a 400 naming it, so a
# misspelt filter is not taken for one that matched everything.
QUERY_PARAMETERS: dict[str, frozenset[str]] = {
    "/producers/": frozenset({"limit", "cursor", "topic", "partition", "status", "scope"}),
    "/producers/{guid}/": frozenset({"topic", "partition", "status", "scope"}),
    "/partitions/": frozenset({"topic", "scope"}),
    "/partitions/{topic}/{partition}/": frozenset({"scope"}),
    "/routes/": frozenset({"scope"}),
    "/changefeeds/": frozenset({"topic", "table", "scope"}),
    "/incidents/": frozenset(
        {"limit", "offset", "topic", "partition", "class", "severity", "producer", "since", "until", "scope"}
    ),
    "/ui/": frozenset(),
    "/reconcile/": frozenset(),
    "/health": frozenset(),
    "/metrics": frozenset(),
}


def query_problem(request: web.Request, taken: frozenset[str]) -> str | None:
    """What is wrong with the request's query for a view taking `taken`: an unknown or repeated
    parameter, or a bad scope; None when nothing is."""
    names = [name for name, _ in request.query.items()]  # keys() gives a repeated name once
    for name in dict.fromkeys(names):
        if name not in taken:
            known = ", ".join(sorted(taken)) or "none"
            return f"unknown query parameter {_shown(name, 40)} (this view takes: {known})"
        if names.count(name) > 1:
            return f"query parameter {_shown(name, 40)} is given {names.count(name)} times"
    # The same check of scope on every view that takes it, whichever way the view reads it.
    scope = request.query.get("scope", "")
    if scope not in ("", *SCOPES):
        return f"query parameter scope={_shown(scope)} is not one of {', '.join(SCOPES)}"
    return None


def _choice_param(request: Request, name: str, choices: tuple[str, ...]) -> str | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise BadRequest(f"query parameter {name}={raw!r} is not one of {', '.join(choices)}")
    return raw


def _time_param(request: Request, name: str) -> int | None:
    """A time as ms since the epoch, given as such or as ISO 8601 (UTC unless it says)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw.isascii() and raw.isdigit():  # not "²", which isdigit() takes and int() refuses
        return parse_count(raw, f"query parameter {name} (ms since the epoch)")
    if not raw.isascii() or len(raw) > MAX_TIME_TEXT:
        raise BadRequest(f"query parameter {name}={_shown(raw)} is neither ms since the epoch nor an ISO 8601 time")
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(
            f"query parameter {name}={_shown(raw)} is neither ms since the epoch nor an ISO 8601 time"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _is_hex_guid(raw: str) -> bool:
    return len(raw) == 32 and all(c in "0123456789abcdefABCDEF" for c in raw)


def _producers_cursor(request: Request) -> tuple[str, int, bytes] | None:
    """The `cursor` parameter of /producers/: "topic/partition/GUID", the last item of the
    previous page (its `next_cursor`); the page holds the producers after it."""
    raw = request.query.get("cursor")
    if raw is None or raw == "":
        return None
    parts = raw.rsplit("/", 2)
    if len(parts) != 3 or not parts[0] or not (parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= 10):
        raise BadRequest(f"query parameter cursor={raw[:80]!r} is not topic/partition/GUID (a page's next_cursor)")
    if not _is_hex_guid(parts[2]):
        raise BadRequest(f"query parameter cursor={raw[:80]!r} does not end in a producer GUID (32 hex digits)")
    return parts[0], int(parts[1]), bytes.fromhex(parts[2])


def _cursor_of(item: dict) -> str:
    return f"{item['topic']}/{item['partition']}/{item['producer']}"


def _is_producer_item(item: object) -> bool:
    """A peer's producer item with the fields pages are ordered by."""
    return (
        isinstance(item, dict)
        and isinstance(item.get("topic"), str)
        and isinstance(item.get("partition"), int)
        and isinstance(item.get("producer"), str)
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_time(ms: int | None) -> str | None:
    """ms since the epoch as ISO 8601 UTC; None for none (-1 or less: not known) and for a
    time no date can show (`renderable_ms`), whose raw number the views give beside it."""
    if not renderable_ms(ms):
        return None
    moment = _EPOCH + timedelta(milliseconds=cast(int, ms))
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def incident_json(incident) -> dict:
    """An incident as the views show it: its fields (kdiv/incident/schema.json), and its times
    also as ISO 8601 UTC."""
    fields = incident.to_json()
    fields["detected_at"] = iso_time(incident.detected_at_ms)
    fields["record_time"] = iso_time(incident.record_timestamp_ms)
    return fields


async def _read_capped(response, limit: int) -> bytes:
    """The whole body of a peer's answer; ValueError past `limit` bytes."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise ValueError(f"an answer larger than {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class Views:
    """The read-only web views: local answers, and the other workers' asked for the rest."""

    def __init__(self, app, worker) -> None:
        self.app = app
        self.worker = worker
        # The key of the requests and answers exchanged with peers (never sent itself);
        # without a token peers are asked and believed as they are (loopback only).
        self._token = worker.settings.web_token
        self._peer_patterns = worker.settings.web_peers

    # -- peers -------------------------------------------------------------------------------

    def _peer_urls(self) -> list[URL]:
        me = URL(str(self.app.conf.canonical_url))
        urls = {URL(str(url)) for url in peer_topics(self.app)}
        return sorted((u for u in urls if (u.host, u.port) != (me.host, me.port)), key=str)

    def not_a_peer(self, url: URL) -> str | None:
        """Why a URL advertised in the group is not asked (None: it is): a member's metadata
        is untrusted, and `KDIV_WEB_PEERS` may narrow who is."""
        if url.scheme not in ("http", "https") or not url.host:
            return "is not an http(s) URL"
        if self._peer_patterns and not matches(self._peer_patterns, url.host.lower().rstrip("."), url.port):
            return "is not in KDIV_WEB_PEERS"
        return None

    def owner_of(self, topic: str, partition: int) -> URL | None:
        """The URL of the worker that owns (topic, partition), from Faust's assignor."""
        for url, topics in peer_topics(self.app).items():
            if partition in topics.get(topic, ()):
                return URL(str(url))
        return None

    async def ask(self, url: URL, request: Request) -> PeerAnswer:
        """Ask another worker for its local answer to this request: signed with the token
        (not sending it), and taken only when the answer is signed too."""
        refused = self.not_a_peer(url)
        if refused is not None:
            log.warning("worker %s %s: not asked for %s", url, refused, request.path)  # type: ignore[attr-defined]
            return PeerAnswer(url, None, None, f"{url} {refused}")
        path = request.path  # type: ignore[attr-defined]  # aiohttp's Request
        target = url.with_path(path).with_query({**request.query, "scope": LOCAL})
        headers, request_sig = sign_request(self._token, "GET", target) if self._token else ({}, "")
        try:
            async with self.app.http_client.get(
                target, timeout=_PEER_TIMEOUT, headers=headers, allow_redirects=False
            ) as response:
                body = await _read_capped(response, MAX_PEER_ANSWER)
                status, answer_headers = response.status, response.headers
        except (TimeoutError, ClientError, ValueError) as bad:
            log.warning("worker %s did not answer %s: %s", url, request.url, bad)
            return PeerAnswer(url, None, None)
        if self._token and not answer_is_signed(self._token, request_sig, status, body, answer_headers):
            # Not from a worker holding the token (a rogue group member, or something else at
            # that address): its body is not looked at.
            log.warning("worker %s answered %s %s without this group's signature: refused", url, status, target.path)
            return PeerAnswer(url, None, None, f"{url} answered without this group's signature")
        try:
            return PeerAnswer(url, status, parse_json(body, max_bytes=MAX_PEER_ANSWER))
        except ValueError as bad:
            log.warning("worker %s answered %s with a body that is not JSON: %s", url, target.path, bad)
            return PeerAnswer(url, None, None, f"{url} answered with a body that is not JSON")

    async def gather(self, request: Request, local: list[dict], sort_key=None) -> dict:
        """Local items plus every peer's, unless this is itself a peer's request."""
        if _scope(request) == LOCAL:
            return {"items": local}
        answers = await asyncio.gather(*(self.ask(url, request) for url in self._peer_urls()))
        items = list(local)
        unavailable = []
        for answer in answers:
            items_there = answer.body.get("items") if isinstance(answer.body, dict) else None
            if answer.status != 200 or not isinstance(items_there, list):
                unavailable.append(str(answer.url))
            else:
                items.extend(items_there)
        items.sort(key=sort_key or (lambda item: (item["topic"], item["partition"], item.get("producer", ""))))
        return {"items": items, "unavailable_workers": unavailable}

    async def gather_producer_pages(self, request: Request, local: dict) -> dict:
        """This worker's page of producers merged with every peer's page for the same
        request (unless this is itself a peer's request): the first `limit` of them all."""
        if request.query.get("scope") == LOCAL:
            return local
        answers = await asyncio.gather(*(self.ask(url, request) for url in self._peer_urls()))
        items, total, more = list(local["items"]), local["total"], local["next_cursor"] is not None
        unavailable = []
        for answer in answers:
            body = answer.body
            there = body.get("items") if isinstance(body, dict) else None
            counted = body.get("total") if isinstance(body, dict) else None
            if answer.status != 200 or not isinstance(there, list) or not isinstance(counted, int):
                unavailable.append(str(answer.url))
                continue
            items.extend(item for item in there if _is_producer_item(item))
            total += counted
            more = more or cast(dict, body).get("next_cursor") is not None
        items.sort(key=lambda item: (item["topic"], item["partition"], item["producer"]))
        limit = local["limit"]
        page = items[:limit]
        more = more or len(items) > limit
        return {
            "items": page,
            "total": total,
            "limit": limit,
            "next_cursor": _cursor_of(page[-1]) if more and page else None,
            "unavailable_workers": unavailable,
        }

    # -- views -------------------------------------------------------------------------------

    def producer_page(self, request: Request) -> dict:
        """One page of this worker's producers matching the request's filters, in (topic,
        partition, GUID) order, after the request's cursor; `total` counts all that match.

        Each page costs a pass over the producers' keys, not a JSON object for each: a
        partition may track 100,000s of them."""
        limit = _int_param(request, "limit", PRODUCERS_PAGE, minimum=1, maximum=MAX_PAGE)
        cursor = _producers_cursor(request)
        topic = request.query.get("topic")
        partition = _int_param(request, "partition", None)
        status = request.query.get("status")
        if status is not None and status not in SegmentStatus.__members__:
            raise BadRequest(f"status={status!r} is not one of {', '.join(SegmentStatus.__members__)}")
        wanted = None if status is None else SegmentStatus[status]
        total = 0
        page: list[tuple[str, int, bytes, Segment | bytes]] = []
        for (t, p), part in sorted(self.worker.live.validator.partitions.items()):
            if (topic is not None and t != topic) or (partition is not None and p != partition):
                continue
            segments = part.tracker.segments
            matching = segments.keys() if wanted is None else [g for g, s in segments.items() if status_of(s) is wanted]
            total += len(matching)
            if cursor is not None and (t, p) < cursor[:2]:
                continue
            after = cursor[2] if cursor is not None and (t, p) == cursor[:2] else None
            # One more than the page: whether a next page exists.
            need = limit + 1 - len(page)
            if need > 0:
                candidates = matching if after is None else (g for g in matching if g > after)
                page.extend((t, p, g, segments[g]) for g in heapq.nsmallest(need, candidates))
        faults = faults_by_producer(self.worker.recent.newest_first()) if page else {}
        items = [
            producer_json(t, p, g, as_segment(state), faults.get((t, p, g.hex()))) for t, p, g, state in page[:limit]
        ]
        return {
            "items": items,
            "total": total,
            "limit": limit,
            "next_cursor": _cursor_of(items[-1]) if len(page) > limit else None,
        }

    def producers(self, request: Request, guid: str | None = None) -> list[dict]:
        """This worker's producers matching the request's filters."""
        topic = request.query.get("topic")
        partition = _int_param(request, "partition", None)
        status = request.query.get("status")
        if status is not None and status not in SegmentStatus.__members__:
            raise BadRequest(f"status={status!r} is not one of {', '.join(SegmentStatus.__members__)}")
        if guid is not None:
            try:
                wanted = bytes.fromhex(guid)
            except ValueError:
                raise BadRequest(f"producer {guid!r} is not a hex GUID") from None
        items = []
        faults = faults_by_producer(self.worker.recent.newest_first())
        for (t, p), part in sorted(self.worker.live.validator.partitions.items()):
            if (topic is not None and t != topic) or (partition is not None and p != partition):
                continue
            segments = part.tracker.segments
            shown = segments.items() if guid is None else [(wanted, segments[wanted])] if wanted in segments else []
            for g, state in shown:
                segment = as_segment(state)
                if status is not None and segment.status.name != status:
                    continue
                items.append(producer_json(t, p, g, segment, faults.get((t, p, g.hex()))))
        return items

    def partition(self, topic: str, partition: int) -> dict | None:
        """This worker's view of one partition: its state, or that it is recovering here
        (assigned, state not loaded yet); None when this worker has neither."""
        part = self.worker.live.validator.partitions.get((topic, partition))
        if part is not None:
            return partition_json(self.worker, topic, partition, part)
        if (topic, partition) in self.worker.assigned_partitions():
            if topic in self.worker.changefeed_topics:
                return changefeed_partition_json(self.worker, topic, partition)
            return recovering_partition_json(self.worker, topic, partition)
        return None

    def partitions(self, request: Request) -> list[dict]:
        """This worker's partitions: those with state, and those assigned and recovering."""
        topic = request.query.get("topic")
        loaded = self.worker.live.validator.partitions
        listed = sorted(set(loaded) | set(self.worker.assigned_partitions()))
        return [
            partition_json(self.worker, t, p, loaded[(t, p)])
            if (t, p) in loaded
            else changefeed_partition_json(self.worker, t, p)
            if t in self.worker.changefeed_topics
            else recovering_partition_json(self.worker, t, p)
            for t, p in listed
            if topic is None or t == topic
        ]

    def incidents(self, request: Request) -> dict:
        """Incidents matching the request, newest first, paginated."""
        limit = _int_param(request, "limit", 50, minimum=1, maximum=MAX_PAGE)
        offset = _int_param(request, "offset", 0)
        topic = request.query.get("topic")
        partition = _int_param(request, "partition", None)
        verdict = _choice_param(request, "class", INCIDENT_CLASSES)
        severity = _choice_param(request, "severity", SEVERITIES)
        producer = request.query.get("producer")
        if producer is not None and not _is_hex_guid(producer):
            raise BadRequest(f"producer={producer!r} is not a producer GUID (32 hex digits)")
        since = _time_param(request, "since")
        until = _time_param(request, "until")
        matching = [
            i
            for i in self.worker.recent.newest_first()
            if (topic is None or i.topic == topic)
            and (partition is None or i.partition == partition)
            and (verdict is None or i.verdict == verdict)
            and (severity is None or i.severity == severity)
            and (producer is None or i.producer == producer.lower())
            and (since is None or i.detected_at_ms >= since)
            and (until is None or i.detected_at_ms < until)
        ]
        page = matching[offset : offset + limit]
        return {
            "items": [incident_json(i) for i in page],
            "total": len(matching),
            "offset": offset,
            "limit": limit,
            "next_offset": offset + limit if offset + limit < len(matching) else None,
            "read_to": [{"partition": p, "offset": o} for p, o in sorted(self.worker.incidents_read_to.items())],
        }

    def last_reconciliation(self) -> tuple[int, dict]:
        """The summary of the latest run under KDIV_RECONCILE_REPORTS (runs are directories
        named by their snapshot time, so the greatest name is the latest). Not configured, or
        no run yet, is an answer (available: false), not an error."""
        reports = self.worker.settings.reconcile_reports
        if reports is None:
            return 200, {"available": False, "message": "KDIV_RECONCILE_REPORTS is not set on this worker"}
        runs = sorted(p for p in reports.glob("*/summary.json") if p.is_file()) if reports.is_dir() else []
        if not runs:
            return 200, {"available": False, "message": f"no reconciliation run under {reports} yet"}
        latest = runs[-1]
        try:
            summary = parse_json(latest.read_text(encoding="utf-8"), max_bytes=64 << 20)
        except (OSError, ValueError) as bad:
            return 500, {"error": "Internal Server Error", "message": f"{latest}: {bad}"}
        return 200, {"available": True, "run": latest.parent.name, "summary": summary}

    def health(self) -> tuple[int, dict]:
        """Ready, recovering or degraded, with the reasons."""
        recovery = self.worker.recovery_status()
        parts = self.worker.live.validator.partitions
        failed = [{"topic": t, "partition": p} for (t, p), part in sorted(parts.items()) if part.push_failed]
        assigned = self.worker.assigned_partitions()
        # While tables recover, assigned partitions not yet loaded are still being restored;
        # their state loads when recovery completes (or with a record that comes first).
        restoring = recovery["in_progress"] or not self.worker.state_schema_ready.is_set()
        loaded = self.worker.is_loaded
        ready = [{"topic": t, "partition": p} for t, p in assigned if loaded(t, p) or not restoring]
        recovering = [{"topic": t, "partition": p} for t, p in assigned if not loaded(t, p) and restoring]
        # Degraded: serving, but its state is under a subject its readers do not look in.
        findings = [f.to_json() for f in self.worker.state_check.open.values()]
        lookups = self.worker.lookups
        waiting = not self.worker.state_schema_ready.is_set()
        status = (
            "waiting_for_registry"
            if waiting
            else "recovering"
            if recovery["in_progress"]
            else "degraded"
            if findings
            else "ready"
        )
        body = {
            "status": status,
            "ready": ready,
            "recovering": recovering,
            "failed": failed,
            "recovery": recovery,
            "state_load_errors": self.worker.load_errors_seen,
            "state_schema_findings": findings,
            "schema_registry": {
                "configured": lookups.registry.configured,
                "url": lookups.registry.url if lookups.registry.configured else None,
                "state_schema_id": None if waiting else self.worker.values.schema_id,
                "available": lookups.available,
                "last_error": lookups.stats.last_error,
                "unchecked_records": self.worker.stats.schema_unchecked_records,
            },
        }
        # Recovering: not ready for traffic (a readiness probe fails); failed pushes are data
        # faults, reported but not a reason to restart the worker.
        return (503 if recovery["in_progress"] or waiting else 200), body


def register_views(app, worker) -> Views:
    """Serve the views on the app's web server."""
    views = Views(app, worker)

    def error(view: View, status: int, message: str) -> Response:
        return view.json({"error": HTTPStatus(status).phrase, "message": message}, status=status)

    @web.middleware
    async def json_errors(request, handler):
        # aiohttp answers unknown paths and methods with HTML; every error here is JSON.
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return web.json_response(
                {"error": exc.reason, "message": f"{request.method} {request.path}: {exc.reason}"}, status=exc.status
            )

    settings = worker.settings
    advertised = URL(str(app.conf.canonical_url))
    web_app = app.web.web_app
    # First: a page of a name that is not this worker's (DNS rebinding) gets nothing.
    web_app.middlewares.append(
        host_check_middleware(allowed_host_names(settings.web_host, advertised.host, settings.web_allowed_hosts))
    )
    web_app.middlewares.append(json_errors)
    if settings.web_token:
        # Inside json_errors: an unknown path or method is not revealed without the token.
        web_app.middlewares.append(
            authentication_middleware(settings.web_token, SignedRequests(settings.web_token, advertised))
        )

        async def sign_peer_answers(request, response) -> None:
            sign_answer(settings.web_token, request, response)

        web_app.on_response_prepare.append(sign_peer_answers)

    @web.middleware
    async def known_parameters(request, handler):
        route = request.match_info.route.resource
        taken = QUERY_PARAMETERS.get(route.canonical) if route is not None else None
        problem = query_problem(request, taken) if taken is not None else None
        if problem is not None:
            return web.json_response({"error": "Bad Request", "message": f"{request.path}: {problem}"}, status=400)
        return await handler(request)

    web_app.middlewares.append(known_parameters)
    # /incidents -> /incidents/ (and the other list views): aiohttp redirects when only the
    # path with the slash exists. Inside the token check, like every other path.
    web_app.middlewares.append(web.normalize_path_middleware(append_slash=True, merge_slashes=True))

    @app.page("/producers/")
    class ProducersView(View):
        async def get(self, request: Request) -> Response:
            try:
                return self.json(await views.gather_producer_pages(request, views.producer_page(request)))
            except BadRequest as bad:
                return error(self, 400, str(bad))

    @app.page("/producers/{guid}/")
    class ProducerView(View):
        async def get(self, request: Request, guid: str) -> Response:
            try:
                answer = await views.gather(request, views.producers(request, guid))
            except BadRequest as bad:
                return error(self, 400, str(bad))
            if _scope(request) != LOCAL and not answer["items"]:
                return error(self, 404, f"no state for producer {guid}")
            return self.json(answer)

    @app.page("/partitions/")
    class PartitionsView(View):
        async def get(self, request: Request) -> Response:
            try:
                return self.json(await views.gather(request, views.partitions(request)))
            except BadRequest as bad:
                return error(self, 400, str(bad))

    @app.page("/partitions/{topic}/{partition}/")
    class PartitionView(View):
        async def get(self, request: Request, topic: str, partition: str) -> Response:
            try:
                number = parse_count(partition, "partition")
                scope = _scope(request)
            except BadRequest as bad:
                return error(self, 400, str(bad))
            here = views.partition(topic, number)
            if here is not None:
                return self.json(here)
            owner = views.owner_of(topic, number)
            me = URL(str(views.app.conf.canonical_url))
            if owner is not None and (owner.host, owner.port) != (me.host, me.port) and scope != LOCAL:
                answer = await views.ask(owner, request)
                if answer.refused is not None:
                    # What the owner said is not passed on: it may not be a worker of this group.
                    return error(
                        self, 502, f"{topic}[{number}] is owned by {owner}, whose answer was refused: {answer.refused}"
                    )
                if answer.status is None:
                    return error(self, 503, f"{topic}[{number}] is owned by {owner}, which did not answer")
                # The owner's answer as it gave it: its 404 stays a 404, with its message.
                return self.json(answer.body, status=answer.status)
            return error(self, 404, f"{topic}[{number}] is not a watched partition with state here")

    @app.page("/routes/")
    class RoutesView(View):
        """The pipeline audit: per route and hop, traces judged by every worker."""

        async def get(self, request: Request) -> Response:
            try:
                gathered = await views.gather(
                    request, route_hop_items(views.worker), sort_key=lambda i: (i["route"], i["hop"])
                )
            except BadRequest as bad:
                return error(self, 400, str(bad))
            if _scope(request) == LOCAL:
                return self.json(gathered)
            return self.json(routes_summary(views.worker, gathered))

    @app.page("/changefeeds/")
    class ChangefeedsView(View):
        """TiCDC changefeed topics: rows verified per topic, partition and table, by verdict."""

        async def get(self, request: Request) -> Response:
            local = views.worker.changefeeds.table_counts(request.query.get("topic"), request.query.get("table"))
            try:
                return self.json(await views.gather(request, local))
            except BadRequest as bad:
                return error(self, 400, str(bad))

    @app.page("/incidents/")
    class IncidentsView(View):
        async def get(self, request: Request) -> Response:
            try:
                _scope(request)  # every worker reads the incidents itself: either scope is this
                return self.json(views.incidents(request))
            except BadRequest as bad:
                return error(self, 400, str(bad))

    dashboard = (
        resources.files("kdiv.worker")
        .joinpath("dashboard.html")
        .read_text(encoding="utf-8")
        .replace("__INCIDENT_CLASSES__", json.dumps(list(INCIDENT_CLASSES)))
    )

    web_app.on_response_prepare.append(security_headers({"/ui/": page_policy(dashboard)}))

    @app.page("/ui/")
    class DashboardView(View):
        async def get(self, request: Request) -> Response:
            return self.html(dashboard)

    @app.page("/reconcile/")
    class ReconcileView(View):
        async def get(self, request: Request) -> Response:
            status, body = views.last_reconciliation()
            return self.json(body, status=status)

    @app.page("/health")
    class HealthView(View):
        async def get(self, request: Request) -> Response:
            status, body = views.health()
            return self.json(body, status=status)

    @app.page("/metrics")
    class MetricsView(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(metrics.render(views.worker), content_type=metrics.CONTENT_TYPE)

    # The two views without a slash, asked for with one.
    for path in ("/metrics", "/health"):

        async def without_slash(request, path=path):
            raise web.HTTPPermanentRedirect(path + (f"?{request.query_string}" if request.query_string else ""))

        app.web.web_app.router.add_get(path + "/", without_slash)

    return views


def route_hop_items(worker) -> list[dict]:
    """This worker's counts per route and hop (what its judges decided, what it observed)."""
    audit = worker.audit
    if audit is None:
        return []
    items = []
    for route in audit.routes:
        for hop_index in range(len(route.hops)):
            stats = audit.hops.get((route.name, hop_index))
            outcomes = dict(stats.outcomes) if stats else {}
            items.append(
                {
                    "route": route.name,
                    "hop": hop_index,
                    "observed_in": audit.traced.get((route.name, hop_index), 0),
                    "observed_out": audit.traced.get((route.name, hop_index + 1), 0),
                    "outcomes": outcomes,
                    "latency_buckets": list(stats.latency_buckets) if stats else [],
                    "latency_sum_ms": stats.latency_sum_ms if stats else 0,
                    "open_traces": audit.open_traces(route.name) if hop_index == 0 else 0,
                }
            )
    return items


def routes_summary(worker, gathered: dict) -> dict:
    """Every worker's per-hop counts summed per route and hop, with the rates they imply."""
    audit = worker.audit
    routes = []
    merged: dict[tuple[str, int], dict] = {}
    for item in gathered["items"]:
        into = merged.setdefault(
            (item["route"], item["hop"]),
            {"observed_in": 0, "observed_out": 0, "outcomes": {}, "latency_sum_ms": 0, "latency_count": 0, "open": 0},
        )
        into["observed_in"] += item["observed_in"]
        into["observed_out"] += item["observed_out"]
        for outcome, count in item["outcomes"].items():
            into["outcomes"][outcome] = into["outcomes"].get(outcome, 0) + count
        into["latency_sum_ms"] += item["latency_sum_ms"]
        into["latency_count"] += sum(item["latency_buckets"])
        into["open"] += item["open_traces"]
    sampling = audit.settings.sampling if audit is not None else None
    for route in audit.routes if audit is not None else ():
        per_hop = [merged.get((route.name, index), {}) for index in range(len(route.hops))]
        delivered = sum(counts.get("outcomes", {}).get("DELIVERED", 0) for counts in per_hop)
        hops = []
        for index, (hop, counts) in enumerate(zip(route.hops, per_hop, strict=True)):
            outcomes = counts.get("outcomes", {})
            lost, duplicated = outcomes.get("LOST", 0), outcomes.get("DUPLICATED", 0)
            judged = delivered + lost
            latency_count = counts.get("latency_count", 0)
            hops.append(
                {
                    "hop": index,
                    "from": list(route.stages[index]),
                    "group": hop.group,
                    "to": list(route.stages[index + 1]),
                    "group_known": None if audit.known_groups is None else hop.group in audit.known_groups,
                    "observed_in": counts.get("observed_in", 0),
                    "observed_out": counts.get("observed_out", 0),
                    "lost": lost,
                    "duplicated": duplicated,
                    "unresolved": outcomes.get("UNRESOLVED", 0),
                    "loss_rate": lost / judged if judged else None,
                    "duplicate_rate": duplicated / judged if judged else None,
                    "mean_latency_ms": counts.get("latency_sum_ms", 0) / latency_count if latency_count else None,
                }
            )
        source = route.stages[0][0]
        rate = sampling.rate_for(source) if sampling is not None else None
        routes.append(
            {
                "route": route.name,
                "hops": hops,
                "delivered": delivered,
                "open_traces": sum(counts.get("open", 0) for counts in per_hop),
                "sampling_rate": rate,
                "note": (
                    "counts are of traced records only: writers trace a sample, so rates are estimates at the "
                    "sampling rate" + ("" if rate is not None else " (KDIV_TRACE_SAMPLING not set: rate unknown)")
                ),
            }
        )
    return {"routes": routes, "unavailable_workers": gathered.get("unavailable_workers", [])}
