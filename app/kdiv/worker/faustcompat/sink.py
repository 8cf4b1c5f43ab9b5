"""The unit of work's sink in a Faust app (`kdiv.worker.unit.StateSink`): Faust's producer for
the incidents, the key ledger and the observations, the RocksDB tables for state and traces.

Both tables are written the same way (`write_partition`): one RocksDB write batch, and the
changelog records sent outside Faust's producer buffer in whole batches, their acks awaited
by the unit of work, so a failed write fails the flush before anything commits."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from kdiv.incident.shape import Incident
from kdiv.worker.audit import observations_by_partition
from kdiv.worker.faustcompat.internals import hand_over_table_writes, send_in_batches, topic_partitions, track_topic
from kdiv.worker.faustcompat.stores import keep_memtables_within
from kdiv.worker.faustcompat.tables import write_partition
from kdiv.worker.unit import Change


class FaustSink:
    """Writes a unit of work with the Faust app's producer and tables."""

    def __init__(
        self,
        app: Any,
        incidents_topic: str,
        ledger_topic_of: Mapping[str, str],
        table_of_topic: Mapping[str, Any],
        observations_topic: str,
        trace_table: Any = None,
    ) -> None:
        self.app = app
        self.incidents_topic = incidents_topic
        # Per watched topic with a key ledger: the ledger's changelog topic (written, never read).
        self.ledger_topic_of = ledger_topic_of
        self.table_of_topic = table_of_topic
        self.observations_topic = observations_topic
        self.trace_table = trace_table

    async def send_ledger(self, topic: str, partition: int, entries: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        return list(await send_in_batches(self.app, self.ledger_topic_of[topic], partition, entries))

    async def send_observations(self, records: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        """In whole batches per observations partition (the partition a record's key hashes to)."""
        topic = self.observations_topic
        acks: list[Awaitable] = []
        by_partition = observations_by_partition(records, await topic_partitions(self.app, topic))
        for partition, batch in sorted(by_partition.items()):
            acks += await send_in_batches(self.app, topic, partition, batch)
        return acks

    async def send_incidents(self, incidents: Sequence[Incident]) -> list[Awaitable]:
        await track_topic(self.app, self.incidents_topic)
        producer = self.app.producer
        return [await producer.send(self.incidents_topic, i.key, i.value, None, None, None) for i in incidents]

    async def write_state(
        self, topic: str, partition: int, changes: Sequence[Change], *, again: bool = False
    ) -> list[Awaitable]:
        """One RocksDB write batch and the changelog records in whole batches, as for the
        traces (`write_partition`: Faust's per-key path under exactly_once); the partition is
        the source partition's, as Faust's co-partitioned tables have it."""
        table = self.table_of_topic[topic]
        return list(await write_partition(self.app, table, topic, partition, changes, again=again))

    async def write_traces(self, partition: int, changes: Sequence[Change], *, again: bool = False) -> list[Awaitable]:
        return list(
            await write_partition(self.app, self.trace_table, self.observations_topic, partition, changes, again=again)
        )

    async def release(self) -> None:
        await hand_over_table_writes(self.app)
        tables = [*self.table_of_topic.values(), *([self.trace_table] if self.trace_table is not None else [])]
        keep_memtables_within(table.data for table in tables)
