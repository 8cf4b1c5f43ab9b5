"""The producers' views: `GET /producers/` (pages of every producer the group tracks) and
`GET /producers/{guid}/` (one producer on every partition it writes to)."""

from __future__ import annotations

import heapq
from typing import NamedTuple

from faust.web import Request

from kdiv.div.segment import SegmentStatus, as_segment, status_of
from kdiv.worker.readmodel import ProducerState, WorkerReadModel
from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.params import LOCAL, MAX_PAGE, BadRequest, int_param, producers_cursor, scope, shown
from kdiv.worker.web.shapes import cursor_of, faults_by_producer, producer_json

PRODUCERS_PAGE = 100


class ProducerFilters(NamedTuple):
    """The filters of both producer views, None where not given."""

    topic: str | None
    partition: int | None
    status: str | None

    def take(self, topic: str, partition: int) -> bool:
        """Whether the producers of this partition are looked at."""
        return (self.topic is None or topic == self.topic) and (self.partition is None or partition == self.partition)


def producer_filters(request: Request) -> ProducerFilters:
    """The request's `topic`, `partition` and `status` (a SegmentStatus name)."""
    topic = request.query.get("topic")
    partition = int_param(request, "partition", None)
    status = request.query.get("status")
    if status is not None and status not in SegmentStatus.__members__:
        raise BadRequest(f"status={shown(status)} is not one of {', '.join(SegmentStatus.__members__)}")
    return ProducerFilters(topic, partition, status)


async def producers_view(site: Site, request: Request) -> Answer:
    """Every worker's page of producers for the request, merged: the first `limit` of them all."""
    return Answer(await site.peers.gather_producer_pages(request, producer_page(site.worker, request)))


async def producer_view(site: Site, request: Request, guid: str) -> Answer:
    """One producer's state on every partition of the group that tracks it."""
    answer = await site.peers.gather(request, producers(site.worker, request, guid))
    if scope(request) != LOCAL and not answer["items"]:
        return Answer.error(404, f"no state for producer {shown(guid)}")
    return Answer(answer)


def producer_page(worker: WorkerReadModel, request: Request) -> dict:
    """One page of this worker's producers matching the request's filters, in (topic,
    partition, GUID) order, after the request's cursor; `total` counts all that match.

    Each page costs a pass over the producers' keys, not a JSON object for each: a
    partition may track 100,000s of them."""
    limit = int_param(request, "limit", PRODUCERS_PAGE, minimum=1, maximum=MAX_PAGE)
    cursor = producers_cursor(request)
    filters = producer_filters(request)
    wanted = None if filters.status is None else SegmentStatus[filters.status]
    total = 0
    page: list[tuple[str, int, bytes, ProducerState]] = []
    for t, p in worker.partition_states():
        if not filters.take(t, p):
            continue
        segments = worker.producers_of(t, p)
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
    faults = faults_by_producer(worker.recent_incidents()) if page else {}
    items = [producer_json(t, p, g, as_segment(state), faults.get((t, p, g.hex()))) for t, p, g, state in page[:limit]]
    return {
        "items": items,
        "total": total,
        "limit": limit,
        "next_cursor": cursor_of(items[-1]) if len(page) > limit else None,
    }


def producers(worker: WorkerReadModel, request: Request, guid: str | None = None) -> list[dict]:
    """This worker's producers matching the request's filters."""
    filters = producer_filters(request)
    if guid is not None:
        try:
            wanted = bytes.fromhex(guid)
        except ValueError:
            raise BadRequest(f"producer {shown(guid)} is not a hex GUID") from None
    items = []
    faults = faults_by_producer(worker.recent_incidents())
    for t, p in worker.partition_states():
        if not filters.take(t, p):
            continue
        segments = worker.producers_of(t, p)
        listed = segments.items() if guid is None else [(wanted, segments[wanted])] if wanted in segments else []
        for g, state in listed:
            segment = as_segment(state)
            if filters.status is not None and segment.status.name != filters.status:
                continue
            items.append(producer_json(t, p, g, segment, faults.get((t, p, g.hex()))))
    return items
