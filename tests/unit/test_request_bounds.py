"""Produce requests within a byte bound (`kdiv.kafka.requests.drain_bounded`), over aiokafka's
own accumulator and batches: only the cluster's leader lookup is stood in for."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from aiokafka.producer.message_accumulator import MessageAccumulator
from aiokafka.structs import TopicPartition

from kdiv.kafka.requests import OversizeOnce, drain_bounded


class OneLeader:
    """Every partition led by node 1 (aiokafka's `ClusterMetadata.leader_for_partition`)."""

    def leader_for_partition(self, tp: TopicPartition) -> int:
        return 1


async def filled(partitions: int, records: int, value: bytes) -> MessageAccumulator:
    accumulator = MessageAccumulator(OneLeader(), 1 << 20, 0, 30, loop=asyncio.get_running_loop())
    for p in range(partitions):
        for n in range(records):
            await accumulator.add_message(TopicPartition("t", p), None, value, timeout=5, timestamp_ms=n)
    return accumulator


def request_bytes(request: dict) -> int:
    return sum(batch._builder.size() for batch in request.values())


async def test_a_burst_on_many_partitions_goes_in_requests_within_the_bound_and_in_order():
    accumulator = await filled(partitions=50, records=10, value=b"v" * 1000)
    size = accumulator._batches[TopicPartition("t", 0)][0]._builder.size()  # every batch's
    limit = 8 * size + 200
    sent: list[int] = []
    requests = 0
    while accumulator._batches and any(accumulator._batches.values()):
        nodes, _ = drain_bounded(accumulator, limit, None, frozenset())
        assert set(nodes) == {1}
        assert request_bytes(nodes[1]) <= limit
        sent += [tp.partition for tp in nodes[1]]
        requests += 1
        for batch in nodes[1].values():
            batch.done_noack()
    assert sent == list(range(50)), "every batch sent once, in aiokafka's order"
    assert requests == 7, "eight batches a request: 50 need seven"


async def test_without_the_bound_aiokafka_puts_every_batch_in_one_request():
    # The premise: aiokafka's own drain takes all 50 batches for the node at once.
    accumulator = await filled(partitions=50, records=10, value=b"v" * 1000)
    nodes, _ = accumulator.drain_by_nodes(None)
    assert len(nodes[1]) == 50


async def test_a_batch_larger_than_any_request_is_sent_alone_and_said_once(caplog: pytest.LogCaptureFixture):
    accumulator = await filled(partitions=3, records=40, value=b"v" * 1000)
    oversize = OversizeOnce("the test's producer")
    with caplog.at_level(logging.DEBUG, logger="kdiv.kafka.requests"):
        for _ in range(3):
            nodes, _ = drain_bounded(accumulator, 10_000, None, frozenset(), oversize)
            assert len(nodes[1]) == 1, "alone in its request"
            for batch in nodes[1].values():
                batch.done_noack()
    assert oversize.count == 3
    said = [r for r in caplog.records if "exceeds" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    message = said[0].getMessage()
    assert "10000 bytes the broker accepts" in message and "the test's producer" in message
    told = re.search(r"of (\d+) bytes exceeds", message)
    assert told is not None and int(told.group(1)) > 40_000, "the request's own size"
