"""The worker's TiCDC changefeed topics: each record's row checksums verified on the batch path.

Changefeed topics carry no DIV headers; their rows are verified by checksum
(`kdiv.changefeed.verify`), each fault an incident written before the batch's offsets are
committed (the same order as DIV incidents, so a crash re-verifies and rewrites the same keys).
Counts are this worker's since it started, per topic, table and verdict.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence

from kdiv.changefeed.verify import ChangefeedVerifier, RowVerdict
from kdiv.config.settings import ChangefeedSettings
from kdiv.incident.bounds import MAX_CHARS, cut
from kdiv.incident.builders import checksum_incident
from kdiv.incident.shape import Incident
from kdiv.registry.client import RegistryUnavailable
from kdiv.registry.subjects import SchemaLookups
from kdiv.ticdc.checksum import ChecksumVerdict

log = logging.getLogger("kdiv.worker.changefeeds")

_REGISTRY_RETRY_S = 1.0
UNKNOWN_TABLE = "(unknown)"
# Table names come from the messages: a worker counts rows for at most this many (topic,
# partition, table), the rows of any other table under OTHER_TABLES, and names a table by
# at most an incident's table bound; so neither its memory nor /changefeeds/ grows with names.
MAX_TABLES = 4000
OTHER_TABLES = "(other tables)"


class ChangefeedChecks:
    """Row checksum verification of the watched changefeed topics."""

    def __init__(self, settings: ChangefeedSettings, lookups: SchemaLookups) -> None:
        self.settings = settings
        self.lookups = lookups
        self.verifier = ChangefeedVerifier(
            settings.protocol_of, time_zone=settings.time_zone, timestamp_mode=settings.timestamp_mode
        )
        # (topic, partition, table, verdict) -> rows; (topic, partition) -> last offset verified.
        self.counts: Counter[tuple[str, int, str, str]] = Counter()
        self.last_offsets: dict[tuple[str, int], int] = {}
        # (topic, partition) -> records verified (since the worker started).
        self.records: Counter[tuple[str, int]] = Counter()
        # The (topic, partition, table) counted by name, at most MAX_TABLES of them.
        self.tables: set[tuple[str, int, str]] = set()
        self.registry_waits = 0

    async def learn_schemas(self, records: Sequence) -> None:
        """Fetch the writer schemas of `records` not known yet; while the registry cannot
        answer, wait: a row is never judged on a schema kdiv could not read."""
        missing = self.verifier.missing_schemas((r.key, r.value) for r in records)
        for schema_id in sorted(missing):
            while True:
                try:
                    text = await self.lookups.schema_text(schema_id)
                except RegistryUnavailable as down:
                    self.registry_waits += 1
                    if self.registry_waits == 1 or self.registry_waits % 60 == 0:
                        log.warning("changefeed writer schema %d: waiting for the registry: %s", schema_id, down)
                    await asyncio.sleep(_REGISTRY_RETRY_S)
                    continue
                self.verifier.learn_schema(schema_id, text)
                break

    def verify(self, topic: str, partition: int, records: Sequence, detected_at_ms: int) -> list[Incident]:
        """Verify one partition's fetched records (offset order); the incidents of its faults."""
        verdicts = self.verifier.verify_many(
            topic, partition, ((r.offset, r.timestamp, r.key, r.value) for r in records)
        )
        if records:
            self.last_offsets[(topic, partition)] = records[-1].offset
            self.records[(topic, partition)] += len(records)
        return self._account(verdicts, detected_at_ms)

    def give_up_held(self, detected_at_ms: int) -> list[Incident]:
        """Simple-protocol DMLs still waiting for their table's schema are SKIPPED before the
        offsets that include them are committed (never held across a commit)."""
        return self._account(self.verifier.take_held(), detected_at_ms)

    def forget(self, topic: str, partition: int) -> None:
        self.verifier.forget(topic, partition)

    def _account(self, verdicts: list[RowVerdict], detected_at_ms: int) -> list[Incident]:
        incidents = []
        counts = self.counts
        for row in verdicts:
            result = row.result
            table = self._counted_table(row.topic, row.partition, result.table)
            counts[(row.topic, row.partition, table, result.verdict.value)] += 1
            if result.is_fault:
                incidents.append(checksum_incident(row, detected_at_ms))
        return incidents

    def _counted_table(self, topic: str, partition: int, table: str | None) -> str:
        """The name a row's table is counted under."""
        name = UNKNOWN_TABLE if table is None else cut(table, MAX_CHARS["table"])
        key = (topic, partition, name)
        if key in self.tables:
            return name
        if len(self.tables) < MAX_TABLES:
            self.tables.add(key)
            return name
        return OTHER_TABLES

    def partition_counts(self, topic: str, partition: int) -> dict[str, int]:
        """A partition's rows verified by this worker since it started, by verdict (all tables)."""
        counts: dict[str, int] = {}
        for (t, p, _table, verdict), count in self.counts.items():
            if t == topic and p == partition:
                counts[verdict] = counts.get(verdict, 0) + count
        return counts

    def table_counts(self, topic: str | None = None, table: str | None = None) -> list[dict]:
        """Per topic, partition and table: rows verified by this worker since it started, by verdict."""
        tables: dict[tuple[str, int, str], dict[str, int]] = {}
        for (t, partition, name, verdict), count in self.counts.items():
            if (topic is None or t == topic) and (table is None or name == table):
                tables.setdefault((t, partition, name), {v.value: 0 for v in ChecksumVerdict})[verdict] = count
        return [
            {"topic": t, "partition": partition, "table": name, "rows": sum(by.values()), "verdicts": by}
            for (t, partition, name), by in sorted(tables.items())
        ]
