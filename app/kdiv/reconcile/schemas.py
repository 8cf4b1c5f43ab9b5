"""Schema-subject check of restored state (the KAFKA-10179 incident), over whole changelogs.

A restore replays every record a changelog still holds, so every framed value counts, not
only the latest per key. Ids are collected in Spark (count and first offset per changelog
partition and id), then judged on the driver against the subject the changelog's values
are read under (`<changelog>-value`): SUBJECT_MISMATCH when the id is registered elsewhere
only, SCHEMA_UNKNOWN when the registry has no such id.

Ids map to subjects through the registry's REST API, or by replaying its `_schemas` topic
(`ReplayedRegistry`), for a registry that is down or not reachable from the job.
A RocksDB directory copied from a worker can be checked too: what a worker would restore
from local disk instead of the changelog.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kdiv.reconcile.findings import SCHEMA_UNKNOWN, SUBJECT_MISMATCH, UNREADABLE
from kdiv.reconcile.topics import unsigned_at
from kdiv.registry.client import RegistryError, SchemaRegistry
from kdiv.registry.schemaslog import SchemaLogState
from kdiv.registry.subjects import SchemaIdInfo, SchemaLookups, judge, record_name_of
from kdiv.state.framing import HEADER_SIZE, MAGIC, SCHEMA_ID_POSITION, schema_id_of
from kdiv.state.storekeys import split_key
from kdiv.state.values import changelog_subject

# A worker's table databases under its table directory: <table>.db, each key after its
# partition's prefix (kdiv.worker.faustcompat.stores); <table>-<partition>.db, one per
# partition, as Faust's own store and earlier workers wrote them.
_STORE_NAME = re.compile(r"^(?P<table>(?:state|keys)-p\d+)(?:-(?P<partition>\d+))?\.db$")
_FAUST_META_PREFIX = b"__faust"


@dataclass(frozen=True)
class IdUse:
    changelog: str
    partition: int
    schema_id: int | None  # None: the value is not framed
    records: int
    first_offset: int  # -1: found in a local store, which has no offsets
    first_timestamp_ms: int


def schema_id_uses(changelog_records: DataFrame) -> list[IdUse]:
    """Per changelog partition and schema id: records, first offset (tombstones skipped)."""
    values = changelog_records.where(F.col("value").isNotNull())
    framed = (F.length("value") >= HEADER_SIZE) & (F.substring("value", 1, 1) == F.unhex(F.lit(f"{MAGIC:02X}")))
    ids = values.select(
        "topic",
        "partition",
        "offset",
        F.unix_millis("timestamp").alias("timestamp_ms"),
        F.when(framed, unsigned_at(F.col("value"), SCHEMA_ID_POSITION)).alias("schema_id"),
    )
    grouped = ids.groupBy("topic", "partition", "schema_id").agg(
        F.count(F.lit(1)).alias("records"), F.min(F.struct("offset", "timestamp_ms")).alias("first")
    )
    return sorted(
        (
            IdUse(
                r["topic"],
                r["partition"],
                None if r["schema_id"] is None else int(r["schema_id"]),
                r["records"],
                r["first"]["offset"],
                r["first"]["timestamp_ms"],
            )
            for r in grouped.collect()
        ),
        key=lambda u: (u.changelog, u.partition, -1 if u.schema_id is None else u.schema_id),
    )


def local_store_uses(directory: Path, app_id: str) -> list[IdUse]:
    """Schema ids in the RocksDB stores under `directory` (a worker's data dir, copied)."""
    from rocksdict import AccessType, Options, Rdict

    counts: dict[tuple[str, int, int | None], int] = {}
    stores = sorted(p for p in directory.rglob("*.db") if p.is_dir() and _STORE_NAME.match(p.name))
    if not stores:
        raise FileNotFoundError(f"{directory}: no kdiv table store (state-pN.db or keys-pN.db) under it")
    for store in stores:
        match = _STORE_NAME.match(store.name)
        assert match is not None, f"{store.name} was selected by the same pattern"
        changelog = f"{app_id}-{match['table']}-changelog"
        one_partition = None if match["partition"] is None else int(match["partition"])
        db = Rdict(str(store), options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            for stored, value in db.items():  # raw mode: bytes keys and values
                key = cast(bytes, stored)
                if one_partition is None:
                    split = split_key(key)
                    if split is None:
                        continue  # not a table key
                    partition, key = split
                else:
                    partition = one_partition
                if key.startswith(_FAUST_META_PREFIX) or value is None:
                    continue
                ident = (changelog, partition, schema_id_of(value))
                counts[ident] = counts.get(ident, 0) + 1
        finally:
            db.close()
    return [
        IdUse(c, p, i, n, -1, -1)
        for (c, p, i), n in sorted(counts.items(), key=lambda x: (x[0][0], x[0][1], x[0][2] or -1))
    ]


class ReplayedRegistry:
    """Id -> schema and subjects from the registry's own log (Confluent's `_schemas` format)."""

    def __init__(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        self.state = SchemaLogState()
        for key, value in records:
            self.state.apply(key, value)

    def schema_text(self, schema_id: int) -> str | None:
        return self.state.schemas.get(schema_id)

    def info(self, schema_id: int) -> SchemaIdInfo | None:
        text = self.schema_text(schema_id)
        if text is None:
            return None
        subjects = frozenset(subject for subject, _version in self.state.versions_of_id(schema_id))
        return SchemaIdInfo(subjects, record_name_of(text))


class RestRegistry:
    """The same questions over the registry's REST API (errors: RegistryError, named)."""

    def __init__(self, registry: SchemaRegistry, run) -> None:
        self.registry = registry
        self._run = run  # runs a coroutine to completion on the job's own loop
        self._lookups = SchemaLookups(registry, clock=time.monotonic, backoff_s=0.0)

    def schema_text(self, schema_id: int) -> str | None:
        return self._run(self._lookups.schema_text(schema_id))

    def info(self, schema_id: int) -> SchemaIdInfo | None:
        return self._run(self._lookups.info(schema_id))


@dataclass(frozen=True)
class SchemaFinding:
    use: IdUse
    verdict: str
    expected_subject: str
    registered_subjects: tuple[str, ...]
    detail: str

    def row(self) -> dict:
        use = self.use
        return {
            "class": self.verdict,
            "topic": use.changelog,
            "partition": use.partition,
            "offset": use.first_offset,
            "key": None,
            "producer": None,
            "segment": None,
            "seq": None,
            "timestamp_ms": use.first_timestamp_ms,
            "count": use.records,
            "schema_id": use.schema_id,
            "expected_subject": self.expected_subject,
            "registered_subjects": list(self.registered_subjects),
            "detail": self.detail,
        }


def judge_uses(uses: Iterable[IdUse], directory) -> list[SchemaFinding]:
    """Findings for ids not registered under their changelog's subject, and unframed values."""
    findings = []
    infos: dict[int, SchemaIdInfo | None] = {}
    for use in uses:
        where = "a local store" if use.first_offset < 0 else f"offset {use.first_offset}"
        subject = changelog_subject(use.changelog)
        if use.schema_id is None:
            findings.append(
                SchemaFinding(
                    use, UNREADABLE, subject, (), f"{use.records} values are not Confluent-framed (first at {where})"
                )
            )
            continue
        if use.schema_id not in infos:
            infos[use.schema_id] = directory.info(use.schema_id)
        info = infos[use.schema_id]
        verdict = judge(info, subject)
        if verdict is None:
            continue
        registered = tuple(sorted(info.subjects)) if info else ()
        detail = (
            f"schema id {use.schema_id} is unknown to the registry ({use.records} records, first at {where})"
            if verdict == SCHEMA_UNKNOWN
            else f"schema id {use.schema_id} is registered under {', '.join(registered) or 'no subject'}, "
            f"not under {subject} ({use.records} records, first at {where})"
        )
        findings.append(SchemaFinding(use, verdict, subject, registered, detail))
    return findings


def repair_lines(findings: Iterable[SchemaFinding]) -> list[tuple[int, str]]:
    """(schema id, subject) pairs a repair registers: each SUBJECT_MISMATCH once."""
    return sorted(
        {
            (f.use.schema_id, f.expected_subject)
            for f in findings
            # A mismatch is found for a framed value (an id) against a subject the strategy names.
            if f.verdict == SUBJECT_MISMATCH and f.use.schema_id is not None and f.expected_subject is not None
        }
    )


async def repair(registry: SchemaRegistry, pairs: list[tuple[int, str]], say) -> bool:
    """Register each id's schema under its subject, saying what it does; False if any refused."""
    ok = True
    for schema_id, subject in pairs:
        say(f"registering schema id {schema_id} under {subject}")
        try:
            answered = await registry.register_id_under(schema_id, subject)
        except RegistryError as refused:
            say(f"  refused: {refused}")
            ok = False
            continue
        say(f"  registered (the registry answered id {answered})")
    return ok
