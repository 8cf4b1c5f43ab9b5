"""Ownership: which watched partitions this worker holds now, and their state installed.

Faust's rebalance revokes every partition before it assigns; a partition's state is loaded
from its table once it is assigned (after the table's restore, `load_assigned`) or at its
first batch (`ensure_loaded`), and unloaded when it goes (its next owner reads the table).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from faust.types import TP

from kdiv.kafka.discovery import ClusterView
from kdiv.state.tables import table_name
from kdiv.untrusted import preview
from kdiv.worker.live import LiveValidation

log = logging.getLogger("kdiv.worker")


class Ownership:
    """The worker's assigned watched partitions and their loaded state."""

    def __init__(
        self,
        app: Any,
        cluster: ClusterView,
        live: LiveValidation,
        tables: Mapping[int, Any],
        changefeed_topics: Collection[str],
    ) -> None:
        self.app = app
        self.cluster = cluster
        self.live = live
        # The state table per partition count of the watched topics.
        self.tables = tables
        self.table_of_topic = {t.name: tables[t.partitions] for t in cluster.topics}
        # Changefeed partitions have no DIV state to load.
        self.changefeed_topics = changefeed_topics
        self.load_errors_seen = 0

    def assigned_partitions(self) -> list[tuple[str, int]]:
        """The watched partitions assigned to this worker now, sorted."""
        if self.app.consumer is None:
            return []
        return sorted(
            (tp.topic, tp.partition)
            for tp in self.app.consumer.assignment()
            if self.cluster.topic(tp.topic) is not None
        )

    def keep_only(self, assigned: Iterable[TP]) -> None:
        """Unload loaded partitions that this assignment did not keep."""
        keep = {(tp.topic, tp.partition) for tp in assigned}
        for topic, partition in self.live.loaded - keep:
            self.live.unload(topic, partition)

    def load_assigned(self, only_partition_count: int | None = None) -> None:
        """Load every assigned, not yet loaded source partition in one pass per table
        (only the table of topics with `only_partition_count` partitions, when given)."""
        wanted_by_table: dict[int, set[tuple[str, int]]] = {}
        for name, partition in self.assigned_partitions():
            topic = self.cluster.topic(name)
            if topic is None or (only_partition_count is not None and topic.partitions != only_partition_count):
                continue
            if name in self.changefeed_topics:
                continue
            if not self.live.is_loaded(name, partition):
                wanted_by_table.setdefault(topic.partitions, set()).add((name, partition))
        for n, wanted in wanted_by_table.items():
            self.live.load_many(wanted, self.tables[n].items())
            self.load_errors_seen += len(self.live.load_errors)
            for error in self.live.load_errors:
                log.error(
                    "unreadable state %s in table %s: %s; that producer starts afresh",
                    preview(error.key),
                    table_name(n),
                    error.reason,
                )
            self.live.load_errors.clear()

    def ensure_loaded(self, key: tuple[str, int]) -> None:
        """Install a watched partition's saved state if it is not yet."""
        if not self.live.is_loaded(*key):
            self.load_assigned()
            if not self.live.is_loaded(*key):  # not in the assignment the consumer reports yet
                self.live.load(key[0], key[1], self.table_of_topic[key[0]].items())
