"""Ownership: which watched partitions this worker holds now, and their state installed.

Faust's rebalance revokes every partition before it assigns. Every partition, whatever its
topic's kind (`kdiv.worker.kinds`), goes one way: `load` when it is assigned (after its
table's restore, `load_assigned`) or at its first batch, `forget` when it goes (revoked,
or left out of an assignment) or is read again from a log that is gone; what else the
worker keeps of a partition is dropped with it (`on_forget`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from faust.types import TP

from kdiv.kafka.discovery import ClusterView
from kdiv.worker.kinds import Key, TopicKinds


class Ownership:
    """The worker's assigned watched partitions, each loaded and forgotten by its kind."""

    def __init__(self, app: Any, cluster: ClusterView, kinds: TopicKinds) -> None:
        self.app = app
        self.cluster = cluster
        self.kinds = kinds
        self._on_forget: list[Callable[[Key], None]] = []

    def on_forget(self, listener: Callable[[Key], None]) -> None:
        """Call `listener` with every partition forgotten (what else is kept of it goes)."""
        self._on_forget.append(listener)

    def assigned_partitions(self) -> list[Key]:
        """The watched partitions assigned to this worker now, sorted."""
        return [key for key in self._assigned() if self.cluster.topic(key[0]) is not None]

    def _assigned(self) -> list[Key]:
        """Every partition of a topic with a kind assigned now (the observations topic's too)."""
        if self.app.consumer is None:
            return []
        return sorted(
            (tp.topic, tp.partition) for tp in self.app.consumer.assignment() if self.kinds.of(tp.topic) is not None
        )

    def is_loaded(self, key: Key) -> bool:
        kind = self.kinds.of(key[0])
        return kind is not None and kind.is_loaded(key)

    def load(self, keys: Iterable[Key]) -> None:
        """Install the partitions' saved state where not yet installed, each by its kind."""
        by_kind: dict[int, tuple[Any, list[Key]]] = {}
        for key in keys:
            kind = self.kinds.of(key[0])
            if kind is not None:
                by_kind.setdefault(id(kind), (kind, []))[1].append(key)
        for kind, wanted in by_kind.values():
            kind.load(wanted)

    def load_assigned(self, topics: Collection[str] | None = None) -> None:
        """Load every assigned partition (of `topics`, when given) not yet loaded."""
        self.load(key for key in self._assigned() if topics is None or key[0] in topics)

    def forget(self, key: Key) -> None:
        """Drop what is held of the partition: its kind's state, and what else is kept of it."""
        kind = self.kinds.of(key[0])
        if kind is not None:
            kind.forget(key)
        for listener in self._on_forget:
            listener(key)

    def keep_only(self, assigned: Iterable[TP]) -> None:
        """Forget loaded partitions that this assignment did not keep."""
        keep = {(tp.topic, tp.partition) for tp in assigned}
        for kind in self.kinds.kinds():
            for key in sorted(kind.loaded() - keep):
                self.forget(key)
