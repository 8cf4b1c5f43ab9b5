"""Produce requests that fit what the broker accepts.

aiokafka's sender puts every ready batch for a node into one produce request, with no bound on
the whole: a worker with a state changelog of 1,000 partitions, each with a full batch ready,
sent requests of 107 MB, which the broker refused (`socket.request.max.bytes`, 100 MiB by
default: it closes the connection) and which aiokafka sent again and again. Kafka's Java
producer bounds a request by `max.request.size`; `bound_requests` does the same for an aiokafka
producer: each request carries the ready batches that fit in its `max_request_size` (at least
one), the others wait for the next request to that node, in the order aiokafka would have sent
them. The bound is applied where aiokafka chooses the batches (its accumulator's drain,
`drain_bounded`).

`request_limit` picks the bound from the cluster: the producer's own limit, and the brokers'
`socket.request.max.bytes` less room for the request's own fields.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import LeaderNotAvailableError, NotLeaderForPartitionError

log = logging.getLogger(__name__)

# Kafka's `max.request.size` default, and what a produce request needs beside its batches
# (header, client id, transactional id, acks, timeout): the broker's limit less this.
DEFAULT_REQUEST_BYTES = 1024 * 1024
REQUEST_OVERHEAD_BYTES = 4096
# Per partition in a request: topic name (counted apart), partition index, batch length.
PARTITION_OVERHEAD_BYTES = 16
# A request that does not fit the broker must still carry one batch: below this the broker is
# taken to be misconfigured and the producer's own limit stands (said once, as a warning).
MIN_REQUEST_BYTES = 64 * 1024


def request_limit(producer_bytes: int, broker_bytes: int | None) -> int:
    """The bytes a produce request may carry: the producer's limit, or the broker's
    `socket.request.max.bytes` less a request's own fields where that is smaller."""
    if broker_bytes is None:
        return producer_bytes
    fits = broker_bytes - REQUEST_OVERHEAD_BYTES
    if fits < MIN_REQUEST_BYTES:
        log.warning(
            "the broker accepts requests of %d bytes at most (socket.request.max.bytes): too small to bound "
            "produce requests by; requests are bounded by %d bytes",
            broker_bytes,
            producer_bytes,
        )
        return producer_bytes
    return min(producer_bytes, fits)


async def broker_request_max_bytes(admin: AIOKafkaAdminClient) -> int | None:
    """The smallest `socket.request.max.bytes` of the cluster's brokers; None where a broker
    does not say (a broker that does not answer DescribeConfigs, or answers without it)."""
    try:
        described = await admin.describe_cluster()
        brokers = [str(broker["node_id"]) for broker in described.get("brokers", [])]
        if not brokers:
            return None
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, b) for b in brokers])
    except Exception as exc:  # noqa: BLE001 - a broker that cannot say leaves the producer's limit
        log.info(
            "the brokers' socket.request.max.bytes could not be read (%s): produce requests use their own bound", exc
        )
        return None
    found: list[int] = []
    for response in responses:
        for error_code, _message, _type, _name, entries, *_ in response.resources:
            if error_code:
                continue
            for entry in entries:
                if entry[0] == "socket.request.max.bytes" and entry[1]:
                    try:
                        found.append(int(entry[1]))
                    except ValueError:
                        continue
    return min(found) if found else None


# What a batch too large for any request is told as: the partition, its bytes, the bound.
Oversize = Callable[[Any, int, int], None]


class OversizeOnce:
    """Says, once per producer, that a batch alone exceeds the request bound: the broker will
    refuse its request (it closes the connection, and aiokafka sends it again), so the error is
    told here, with its size and the limit, instead of a silent retry loop. Later ones are
    counted, not logged."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.count = 0

    def __call__(self, tp: Any, size: int, limit: int) -> None:
        self.count += 1
        if self.count == 1:
            log.error(
                "%s: a produce request to %s of %d bytes exceeds the %d bytes the broker accepts "
                "(socket.request.max.bytes): the broker will refuse it; lower the producer's "
                "max_batch_size or raise the broker's limit (said once; later ones counted)",
                self.client,
                tp,
                size,
                limit,
            )


def bound_requests(producer: AIOKafkaProducer, limit: int | None = None, name: str = "producer") -> OversizeOnce:
    """Make each produce request of `producer` carry at most `limit` bytes of batches (its
    `max_request_size` when None). Call before its first send. Returns what counts the
    batches too large for any request."""
    accumulator = producer._message_accumulator
    bound = limit or producer._max_request_size
    oversize = OversizeOnce(name)

    def drain_by_nodes(ignore_nodes: Any, muted_partitions: Any = frozenset()) -> tuple[dict, bool]:
        return drain_bounded(accumulator, bound, ignore_nodes, muted_partitions, oversize)

    accumulator.drain_by_nodes = drain_by_nodes
    return oversize


def drain_bounded(
    accumulator: Any, limit: int, ignore_nodes: Any, muted_partitions: Any, oversize: Oversize | None = None
) -> tuple[dict, bool]:
    """aiokafka's `MessageAccumulator.drain_by_nodes` (0.14), line for line, but for one rule:
    a node's request takes a partition's batch only while the request stays within `limit`
    bytes (its first batch always). A batch left is not taken out of the queue (so an
    idempotent producer's sequence numbers are given only to what is sent), and goes in a later
    request: the node has one in flight, whose end wakes the sender again.

    The decision is made in the same pass as aiokafka's linger check: a bound chosen from a
    look at the queues before the drain is outrun by batches whose linger ends in between
    (a burst's batches, made in one millisecond, all end theirs together)."""
    nodes: dict[int, dict[Any, Any]] = defaultdict(dict)
    used: dict[int, int] = defaultdict(int)
    topics: dict[int, set[str]] = defaultdict(set)
    unknown_leaders_exist = False
    remaining_linger_time = None
    batches = accumulator._batches
    cluster = accumulator._cluster
    for tp in list(batches.keys()):
        if tp in muted_partitions:
            continue
        leader = cluster.leader_for_partition(tp)
        if leader is None or leader == -1:
            if batches[tp][0].expired():
                batch = accumulator._pop_batch(tp)
                batch.failure(exception=NotLeaderForPartitionError() if leader is None else LeaderNotAvailableError())
            unknown_leaders_exist = True
            continue
        elif ignore_nodes and leader in ignore_nodes:
            continue
        first = batches[tp][0]
        batch_remaining_linger = first.remaining_linger()
        if batch_remaining_linger:
            remaining_linger_time = (
                min(remaining_linger_time, batch_remaining_linger) if remaining_linger_time else batch_remaining_linger
            )
            continue
        cost = first._builder.size() + PARTITION_OVERHEAD_BYTES
        if tp.topic not in topics[leader]:
            cost += len(tp.topic) + 8  # the topic's name and partition count, once a request
        if used[leader] and used[leader] + cost > limit:
            continue  # the next request to this node takes it
        if cost > limit and oversize is not None:
            oversize(tp, cost, limit)
        used[leader] += cost
        topics[leader].add(tp.topic)
        batch = accumulator._pop_batch(tp)
        if not batch.is_empty():
            nodes[leader][tp] = batch
        else:
            batch.done_noack()

    if not accumulator._waiter_future.done():
        accumulator._waiter_future.set_result(None)
    accumulator._waiter_future = accumulator._loop.create_future()
    if accumulator._wakeup_handle:
        accumulator._wakeup_handle.cancel()
        accumulator._wakeup_handle = None
    if remaining_linger_time:
        accumulator._wakeup_handle = accumulator._loop.call_later(
            remaining_linger_time, accumulator._wakeup, accumulator._waiter_future
        )
    return nodes, unknown_leaders_exist
