"""The post-restore subject check of kdiv's own state (the KAFKA-10179 failure).

After a table partition is restored from its changelog (and as standbys replicate), every
schema id its values carry must be registered under the subject the table's values are
read with: `<changelog topic>-value`. An id registered elsewhere is a SUBJECT_MISMATCH
(state written under another subject: a renamed application id, a changelog copied or
restored from another topic); an id the registry does not know is SCHEMA_UNKNOWN.

kdiv reads its state by id, so a mismatch does not stop it; it does stop any reader that
resolves schemas by subject, and the next restore by such a tool. The repair registers
the schema under the expected subject (never automatic unless KDIV_SCHEMA_AUTO_REPAIR).
A finding stays open until a later check sees the id under the expected subject.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kdiv.registry.client import RegistryError, RegistryUnavailable, SchemaRegistry
from kdiv.registry.subjects import SCHEMA_UNKNOWN, SchemaLookups, judge
from kdiv.state.codec import LOCAL_STATE_SCHEMA_ID
from kdiv.state.values import STATE_SCHEMA_JSON, StateValues, changelog_subject

log = logging.getLogger("kdiv.statecheck")
LOCAL_STORE = -1  # "offset" of an id found in the local RocksDB store, not in the changelog


@dataclass
class StateFinding:
    """A restored schema id not registered under its changelog's subject (KAFKA-10179)."""

    changelog: str
    partition: int
    schema_id: int
    verdict: str
    expected_subject: str
    registered_subjects: tuple[str, ...]
    first_offset: int
    resolved: bool = False

    @property
    def detail(self) -> str:
        """What is wrong, in a sentence."""
        where = "the local store" if self.first_offset == LOCAL_STORE else f"offset {self.first_offset}"
        if self.verdict == SCHEMA_UNKNOWN:
            return (
                f"state in {self.changelog}[{self.partition}] from {where} has schema id {self.schema_id}, "
                "which the registry does not know"
            )
        return (
            f"state in {self.changelog}[{self.partition}] from {where} has schema id {self.schema_id}, "
            f"registered under {list(self.registered_subjects) or 'no subject'} but not under "
            f"{self.expected_subject}, the subject its deserializer uses"
        )

    def to_json(self) -> dict:
        """The finding as /health shows it."""
        return {
            "changelog": self.changelog,
            "partition": self.partition,
            "schema_id": self.schema_id,
            "class": self.verdict,
            "expected_subject": self.expected_subject,
            "registered_subjects": list(self.registered_subjects),
            "first_offset": self.first_offset,
            "detail": self.detail,
        }


@dataclass
class StateSchemaCheck:
    """Judges the schema ids of restored state against the changelog subjects, and repairs on request."""

    lookups: SchemaLookups
    values: StateValues
    auto_repair: bool = False
    retry_s: float = 1.0
    sleep: Callable = asyncio.sleep
    # (changelog, schema id) -> finding, open until resolved
    open: dict[tuple[str, int], StateFinding] = field(default_factory=dict)
    checked: set[tuple[str, int]] = field(default_factory=set)
    repairs: int = 0

    async def learn_writer_schemas(self, schema_ids) -> None:
        """Fetch the schemas of ids the state is written with, waiting out registry outages:
        without them the state cannot be read, and reading it as absent would raise false
        alarms."""
        for schema_id in sorted(set(schema_ids)):
            while not self.values.knows(schema_id):
                if not self.lookups.registry.configured:
                    log.error(
                        "state written with schema id %d, which only a schema registry can give: "
                        "those values are unreadable without one",
                        schema_id,
                    )
                    break
                try:
                    text = await self.lookups.schema_text(schema_id)
                except RegistryUnavailable as down:
                    log.warning("state written with schema id %d: waiting for the registry (%s)", schema_id, down)
                    await self.sleep(self.retry_s)
                    continue
                if text is None:
                    log.error(
                        "state written with schema id %d, which the registry does not know: "
                        "those values are unreadable",
                        schema_id,
                    )
                    break
                self.values.add_writer_schema(schema_id, text)

    async def check(self, changelog: str, ids: dict[int, tuple[int, int]]) -> list[StateFinding]:
        """Check ids (id -> (partition, first offset)) not checked before; the new findings.
        Ids the registry cannot be asked about now stay unchecked for the next call."""
        expected = changelog_subject(changelog)
        found = []
        for schema_id, (partition, offset) in sorted(ids.items()):
            if (changelog, schema_id) in self.checked:
                continue
            try:
                info = await self.lookups.info(schema_id)
            except RegistryUnavailable:
                continue
            self.checked.add((changelog, schema_id))
            verdict = judge(info, expected)
            if verdict is None:
                continue
            finding = StateFinding(
                changelog, partition, schema_id, verdict, expected, tuple(sorted(info.subjects)) if info else (), offset
            )
            self.open[(changelog, schema_id)] = finding
            found.append(finding)
            if self.auto_repair and info is not None:
                await self.repair(finding)
        return found

    async def repair(self, finding: StateFinding) -> bool:
        """Register the id's schema under the expected subject (what ksqlDB's operators did)."""
        try:
            registered = await self.lookups.registry.register_id_under(finding.schema_id, finding.expected_subject)
        except RegistryError as failed:
            log.error("repair of schema id %d under %s failed: %s", finding.schema_id, finding.expected_subject, failed)
            return False
        self.repairs += 1
        log.warning(
            "repaired: schema id %d registered under %s (the registry answered id %d)",
            finding.schema_id,
            finding.expected_subject,
            registered,
        )
        self.lookups.forget_subjects(finding.schema_id)
        return True

    async def recheck(self) -> list[StateFinding]:
        """Look again at open findings; the ones now resolved (removed from `open`)."""
        resolved: list[StateFinding] = []
        for key, finding in list(self.open.items()):
            self.lookups.forget_subjects(finding.schema_id)
            try:
                info = await self.lookups.info(finding.schema_id)
            except RegistryUnavailable:
                return resolved
            if judge(info, finding.expected_subject) is None:
                finding.resolved = True
                finding.registered_subjects = tuple(sorted(info.subjects)) if info is not None else ()
                del self.open[key]
                log.warning(
                    "resolved: schema id %d is now registered under %s", finding.schema_id, finding.expected_subject
                )
                resolved.append(finding)
        return resolved


async def register_state_schema(
    registry: SchemaRegistry, changelogs: list[str], *, retry_s: float = 2.0, sleep: Callable = asyncio.sleep
) -> int:
    """Register the state schema under each changelog's subject, waiting out outages; the id
    (`LOCAL_STATE_SCHEMA_ID` without a registry).

    A registry hands out one id per schema, so every subject gets the same one; a registry
    that does otherwise cannot hold kdiv's state (RuntimeError names the subjects).
    """
    if not registry.configured:
        return LOCAL_STATE_SCHEMA_ID
    ids: dict[str, int] = {}
    for changelog in changelogs:
        subject = changelog_subject(changelog)
        while subject not in ids:
            try:
                ids[subject] = await registry.register(subject, STATE_SCHEMA_JSON)
            except RegistryUnavailable as down:
                log.warning("cannot register the state schema yet, retrying in %.0f s: %s", retry_s, down)
                await sleep(retry_s)
    if len(set(ids.values())) > 1:
        raise RuntimeError(f"the registry gave the state schema different ids per subject: {ids}")
    return next(iter(ids.values()))
