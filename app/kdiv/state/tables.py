"""Where the worker's state lives: table and changelog topic names, and the keys inside them.

The worker writes these and the reconcile job reads them; both take the names from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kdiv.state.codec import StateDecodeError
from kdiv.untrusted import preview


class _Topic(Protocol):
    @property
    def partitions(self) -> int: ...
    @property
    def compaction_lag_ms(self) -> int | None: ...


class WatchedTopics(Protocol):
    """What naming needs of the cluster view (kdiv.kafka.discovery.ClusterView)."""

    @property
    def topics(self) -> Iterable[_Topic]: ...
    @property
    def partition_counts(self) -> Iterable[int]: ...


def table_name(partitions: int) -> str:
    return f"state-p{partitions}"


def ledger_table_name(partitions: int) -> str:
    """The key ledger (kdiv.div.ledger) of the compacted watched topics with that partition count."""
    return f"keys-p{partitions}"


def changelog_topic_name(app_id: str, partitions: int) -> str:
    """Faust's name for a state table's changelog topic."""
    return f"{app_id}-{table_name(partitions)}-changelog"


def ledger_changelog_topic_name(app_id: str, partitions: int) -> str:
    """The key ledger's compacted topic, partitioned as the topics it covers. The worker
    writes it with its producer (it never reads the ledger back, so no table, store or
    restore); the name keeps the changelog form the reconciliation reads."""
    return f"{app_id}-{ledger_table_name(partitions)}-changelog"


def ledger_partition_counts(cluster: WatchedTopics) -> list[int]:
    return sorted({t.partitions for t in cluster.topics if t.compaction_lag_ms is not None})


def state_changelogs(app_id: str, cluster: WatchedTopics) -> list[str]:
    """Every changelog topic of the worker's state, state tables first, then key ledgers."""
    return [changelog_topic_name(app_id, n) for n in sorted(cluster.partition_counts)] + [
        ledger_changelog_topic_name(app_id, n) for n in ledger_partition_counts(cluster)
    ]


PARTITION_PREFIX = "p"
PRODUCER_PREFIX = "s"
_SEP = "|"


def partition_key(topic: str, partition: int) -> bytes:
    # Kafka topic names cannot contain "|", so the key splits back unambiguously.
    return f"{PARTITION_PREFIX}{_SEP}{topic}{_SEP}{partition}".encode()


def producer_key(topic: str, partition: int, guid: bytes) -> bytes:
    return f"{PRODUCER_PREFIX}{_SEP}{topic}{_SEP}{partition}{_SEP}{guid.hex()}".encode()


@dataclass(frozen=True, slots=True)
class StateKey:
    topic: str
    partition: int
    guid: bytes | None  # None for the partition's own state


def parse_key(key: bytes) -> StateKey:
    try:
        kind, topic, partition, *rest = key.decode().split(_SEP)
        if kind == PARTITION_PREFIX and not rest:
            return StateKey(topic, int(partition), None)
        if kind == PRODUCER_PREFIX and len(rest) == 1:
            return StateKey(topic, int(partition), bytes.fromhex(rest[0]))
    except (UnicodeDecodeError, ValueError):
        pass
    raise StateDecodeError(f"state key {preview(key)} is neither p|topic|partition nor s|topic|partition|guid")
