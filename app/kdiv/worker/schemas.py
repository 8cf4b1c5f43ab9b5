"""Schemas: the state's own (registered under each changelog's subject, and checked against
what the changelogs hold) and the watched topics' (each framed record's schema id judged
against the registry, one incident per identity)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kdiv.config.settings import Settings
from kdiv.div.record import FetchedRecord
from kdiv.incident.builders import schema_incident
from kdiv.incident.shape import Incident
from kdiv.kafka.discovery import ClusterView
from kdiv.registry.subjects import UNCHECKED, SchemaLookups
from kdiv.state.framing import schema_id_of
from kdiv.state.tables import changelog_topic_name, state_changelogs
from kdiv.state.values import StateValues
from kdiv.worker.restore import RestoreListener
from kdiv.worker.statecheck import LOCAL_STORE, StateFinding, StateSchemaCheck, register_state_schema
from kdiv.worker.unit import UnitOfWork


class SchemaChecks:
    """The state schema's registration and checks, and the watched topics' schema ids."""

    def __init__(
        self,
        settings: Settings,
        cluster: ClusterView,
        lookups: SchemaLookups,
        values: StateValues,
        restore: RestoreListener,
        stats: Any,
        clock: Callable[[], int],
        state_schema_known: bool,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.lookups = lookups
        self.values = values
        self.restore = restore
        self.stats = stats
        self.clock = clock
        # Incidents of the state's own schema findings, written with the next unit of work.
        self._findings: list[Incident] = []
        # Until the state schema is registered state is neither loaded nor written, and
        # /health says why.
        self.state_schema_ready = asyncio.Event()
        self._registering = asyncio.Lock()
        if state_schema_known:
            self.state_schema_ready.set()
        self.state_check = StateSchemaCheck(lookups, values, auto_repair=settings.schema_auto_repair)
        self._changelogs = [changelog_topic_name(settings.app_id, n) for n in cluster.partition_counts]
        # The watched topics whose schema ids are checked, the identities judged, and the ids
        # framed since the last flush: (topic, partition, field, id) -> (first offset, its
        # timestamp, records).
        self.topics = {t.name for t in cluster.topics if settings.checks_schemas_of(t.name)}
        self._schema_judged: set[tuple[str, int, str, int]] = set()
        self._framed: dict[tuple[str, int, str, int], list[int]] = {}

    async def register_state_schema(self) -> None:
        """Register the state schema under each changelog's subject (waiting out registry
        outages, while the web views answer) and write state with its id from then on."""
        async with self._registering:
            if self.state_schema_ready.is_set():
                return
            changelogs = state_changelogs(self.settings.app_id, self.cluster)
            self.values.use(await register_state_schema(self.lookups.registry, changelogs))
            self.state_schema_ready.set()

    async def learn_restored(self, changelog: str, values: Iterable[bytes]) -> dict:
        """The writer schemas of a restored changelog's state (`values`: its table's), learnt;
        the schema ids it holds with their first offsets, for `StateSchemaCheck.check`."""
        ids = self.restore.first_offsets(changelog)
        for value in values:
            schema_id = schema_id_of(value)
            if schema_id is not None and schema_id not in ids:
                # Held by the local store, not re-read from the changelog this time.
                ids[schema_id] = (-1, LOCAL_STORE)
        await self.state_check.learn_writer_schemas(ids)
        return ids

    async def watch_state_schemas(self, recheck_s: float) -> None:
        """Check ids standbys replicate, and look again at open findings (a repair clears them)."""
        last_recheck = 0.0
        while True:
            await asyncio.sleep(1.0)
            if self.restore.new_ids:
                self.restore.new_ids = False
                for changelog in self._changelogs:
                    self.report_state_findings(
                        await self.state_check.check(changelog, self.restore.first_offsets(changelog))
                    )
            now = self.clock() / 1000
            if self.state_check.open and now - last_recheck >= recheck_s:
                last_recheck = now
                self.report_state_findings(await self.state_check.recheck())

    def report_state_findings(self, findings: list[StateFinding]) -> None:
        """Incidents of the state's schema findings, written with the next unit of work
        (`judge_schemas` adds them to it), so they are counted and logged as every other."""
        now = self.clock()
        incidents = [
            schema_incident(
                f.changelog,
                f.partition,
                f.first_offset,
                "value",
                f.schema_id,
                f.verdict,
                f.expected_subject,
                f.registered_subjects,
                f.detail,
                -1,
                now,
                resolved_at_ms=now if f.resolved else None,
            )
            for f in findings
        ]
        self._findings.extend(incidents)

    async def judge_schemas(self, unit: UnitOfWork) -> None:
        """Incidents for framed records whose schema id is unknown or under another subject,
        and those of the state's schema findings reported since the last flush.

        `framed`: (topic, partition, field, id) -> (first offset, its timestamp, records).
        One incident per identity per worker; a record the registry cannot be asked about
        now is counted unchecked and its id is asked about again with the next batch.
        """
        findings, self._findings = self._findings, []
        for incident in findings:
            unit.add_incident((incident.topic, incident.partition), incident)
        framed, self._framed = self._framed, {}
        now = self.clock()
        for (topic, partition, message_field, schema_id), (offset, timestamp, records) in framed.items():
            identity = (topic, partition, message_field, schema_id)
            if identity in self._schema_judged:
                self.stats.schema_checked_records += records
                continue
            strategy = self.settings.subject_strategy(topic)
            judgement = await self.lookups.judgement(schema_id, topic, strategy, is_key=message_field == "key")
            verdict, info, expected = judgement.verdict, judgement.info, judgement.expected_subject
            if verdict == UNCHECKED:
                self.stats.schema_unchecked_records += records
                continue
            self.stats.schema_checked_records += records
            self._schema_judged.add(identity)
            if verdict is None:
                continue
            registered = tuple(sorted(info.subjects)) if info else ()
            detail = (
                f"{message_field} schema id {schema_id} is unknown to the registry"
                if info is None
                else f"{message_field} schema id {schema_id} is registered under {list(registered) or 'no subject'}, "
                f"not under {expected or 'a subject the ' + strategy + ' strategy can name'}"
            )
            unit.add_incident(
                (topic, partition),
                schema_incident(
                    topic,
                    partition,
                    offset,
                    message_field,
                    schema_id,
                    verdict,
                    expected,
                    registered,
                    detail,
                    timestamp,
                    now,
                ),
            )

    def note_framing(self, topic: str, partition: int, records: Sequence[FetchedRecord]) -> None:
        """The schema ids framed records of a watched topic whose schemas are checked carry,
        judged at the next flush (`judge_schemas`)."""
        if topic not in self.topics:
            return
        for record in records:
            self._note_framed(topic, partition, record, self._framed)

    def forget(self, key: tuple[str, int]) -> None:
        """Drop the ids a partition's records framed since the last flush (its log is gone)."""
        self._framed = {k: v for k, v in self._framed.items() if (k[0], k[1]) != key}

    def _note_framed(self, topic: str, partition: int, record: FetchedRecord, framed: dict) -> None:
        parts = (
            (("value", record.value), ("key", record.key))
            if self.settings.schema_check_keys
            else (("value", record.value),)
        )
        for message_field, raw in parts:
            schema_id = schema_id_of(raw)
            if schema_id is None:
                continue
            seen = framed.get((topic, partition, message_field, schema_id))
            if seen is None:
                framed[(topic, partition, message_field, schema_id)] = [
                    record.offset,
                    record.timestamp,
                    1,
                ]
            else:
                seen[2] += 1
