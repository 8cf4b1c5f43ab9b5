"""What the route groups have committed: the pipeline audit's evidence of loss, read the same
way by the live worker and the nightly job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.trace.routes import Route

# (group, topic, partition) -> the group's committed offset there.
CommittedByGroup = dict[tuple[str, str, int], int]


def hop_inputs(routes: Sequence[Route], partitions: Mapping[str, int]) -> dict[str, list[TopicPartition]]:
    """Per hop group, the partitions its hops read; `partitions`: topic -> partition count (a
    topic not in it has none). Every group is a key, even one with no partition."""
    inputs: dict[str, set[TopicPartition]] = {}
    for route in routes:
        for hop in route.hops:
            for topic in hop.sources:
                inputs.setdefault(hop.group, set()).update(
                    TopicPartition(topic, p) for p in range(partitions.get(topic, 0))
                )
    return {group: sorted(tps) for group, tps in sorted(inputs.items())}


async def read_committed(
    admin: AIOKafkaAdminClient, routes: Sequence[Route], partitions: Mapping[str, int]
) -> tuple[frozenset[str], CommittedByGroup]:
    """The groups the cluster lists, and the hop groups' committed offsets on the partitions
    their hops read. A group not listed has committed nothing."""
    listed = frozenset(g[0] for g in await admin.list_consumer_groups())
    offsets: CommittedByGroup = {}
    for group, inputs in hop_inputs(routes, partitions).items():
        if group not in listed or not inputs:
            continue
        # The partitions, named: all the judges need, and all some brokers answer (Tansu
        # cannot answer an OffsetFetch for a whole group).
        found = await admin.list_consumer_group_offsets(group, partitions=inputs)
        for tp, meta in found.items():
            if meta.offset >= 0:
                offsets[(group, tp.topic, tp.partition)] = meta.offset
    return listed, offsets
