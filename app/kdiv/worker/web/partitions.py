"""The partitions' views: `GET /partitions/` (every watched partition of the group, with its
owner), `GET /partitions/{topic}/{partition}/` (one, answered by its owner) and
`GET /changefeeds/` (the rows verified on changefeed topics, per table)."""

from __future__ import annotations

from faust.web import Request
from yarl import URL

from kdiv.worker.readmodel import WorkerReadModel
from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.params import LOCAL, parse_count, scope, shown
from kdiv.worker.web.shapes import changefeed_partition_json, partition_json, recovering_partition_json


async def partitions_view(site: Site, request: Request) -> Answer:
    """Every worker's partitions: those with state, and those assigned and recovering."""
    return Answer(await site.peers.gather(request, partitions(site.worker, request)))


async def partition_view(site: Site, request: Request, topic: str, partition: str) -> Answer:
    """One partition's state, from the worker that owns it."""
    number = parse_count(partition, "partition")
    asked_scope = scope(request)
    here = partition_state(site.worker, topic, number)
    if here is not None:
        return Answer(here)
    owner = site.peers.owner_of(topic, number)
    me = URL(site.worker.canonical_url)
    if owner is not None and (owner.host, owner.port) != (me.host, me.port) and asked_scope != LOCAL:
        answer = await site.peers.ask(owner, request)
        if answer.refused is not None:
            # What the owner said is not passed on: it may not be a worker of this group.
            return Answer.error(
                502, f"{topic}[{number}] is owned by {owner}, whose answer was refused: {answer.refused}"
            )
        if answer.status is None:
            return Answer.error(503, f"{topic}[{number}] is owned by {owner}, which did not answer")
        # The owner's answer as it gave it: its 404 stays a 404, with its message.
        return Answer(answer.body, answer.status)
    return Answer.error(404, f"{shown(topic)}[{number}] is not a watched partition with state here")


async def changefeeds_view(site: Site, request: Request) -> Answer:
    """TiCDC changefeed topics: rows verified per topic, partition and table, by verdict."""
    local = site.worker.changefeed_tables(request.query.get("topic"), request.query.get("table"))
    return Answer(await site.peers.gather(request, local))


def partition_state(worker: WorkerReadModel, topic: str, partition: int) -> dict | None:
    """This worker's view of one partition: its state, or that it is recovering here
    (assigned, state not loaded yet); None when this worker has neither."""
    part = worker.partition_state(topic, partition)
    if part is not None:
        return partition_json(worker, topic, partition, part)
    if (topic, partition) in worker.assigned_partitions():
        if worker.is_changefeed(topic):
            return changefeed_partition_json(worker, topic, partition)
        return recovering_partition_json(worker, topic, partition)
    return None


def partitions(worker: WorkerReadModel, request: Request) -> list[dict]:
    """This worker's partitions: those with state, and those assigned and recovering."""
    topic = request.query.get("topic")
    loaded = worker.partition_states()
    listed = sorted(set(loaded) | set(worker.assigned_partitions()))
    return [
        partition_json(worker, t, p, loaded[(t, p)])
        if (t, p) in loaded
        else changefeed_partition_json(worker, t, p)
        if worker.is_changefeed(t)
        else recovering_partition_json(worker, t, p)
        for t, p in listed
        if topic is None or t == topic
    ]
