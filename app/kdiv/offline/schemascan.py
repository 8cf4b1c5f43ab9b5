"""`kdiv schemas check`: the subject check over a whole topic, and its repair.

Reads the topic as it is now (every partition to its end), collects the schema ids its
framed values (or keys) carry, and judges each against the subject the topic's strategy
names. A kdiv changelog is checked like any topic: its subject is `<changelog>-value`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.kafka.consume import read_snapshot
from kdiv.registry.client import RegistryError, SchemaRegistry, expected_subject
from kdiv.registry.subjects import SchemaLookups, judge
from kdiv.state.framing import schema_id_of


@dataclass
class IdUse:
    schema_id: int
    partition: int
    first_offset: int
    records: int = 0


@dataclass
class IdVerdict:
    use: IdUse
    verdict: str | None  # None: registered where the reader looks
    expected_subject: str | None
    registered: tuple[str, ...]

    def line(self, topic: str) -> str:
        where = f"{topic}[{self.use.partition}]@{self.use.first_offset}, {self.use.records} records"
        if self.verdict is None:
            return f"OK               schema id {self.use.schema_id} ({where}) is under {self.expected_subject}"
        subjects = ", ".join(self.registered) or "no subject"
        return (
            f"{self.verdict:<16} schema id {self.use.schema_id} (first at {where}) is under {subjects}; "
            f"expected {self.expected_subject or '(strategy names no subject for this schema)'}"
        )


async def schema_ids_in(
    bootstrap: str, topic: str, *, keys: bool = False, security: KafkaSecurity = PLAINTEXT
) -> dict[int, IdUse]:
    uses: dict[int, IdUse] = {}
    async for record in read_snapshot(bootstrap, topic, security=security):
        schema_id = schema_id_of(record.key if keys else record.value)
        if schema_id is None:
            continue
        use = uses.get(schema_id)
        if use is None:
            use = uses[schema_id] = IdUse(schema_id, record.partition, record.offset)
        use.records += 1
    return uses


async def check_topic(
    registry: SchemaRegistry,
    bootstrap: str,
    topic: str,
    strategy: str,
    *,
    keys: bool = False,
    security: KafkaSecurity = PLAINTEXT,
) -> list[IdVerdict]:
    """Raises RegistryError when the registry cannot answer (nothing is judged then)."""
    lookups = SchemaLookups(registry, clock=time.monotonic, backoff_s=0.0)
    verdicts = []
    for schema_id, use in sorted((await schema_ids_in(bootstrap, topic, keys=keys, security=security)).items()):
        info = await lookups.info(schema_id)
        subject = expected_subject(strategy, topic, is_key=keys, record_name=info.record_name if info else None)
        verdicts.append(IdVerdict(use, judge(info, subject), subject, tuple(sorted(info.subjects)) if info else ()))
    return verdicts


async def repair(registry: SchemaRegistry, verdict: IdVerdict) -> AsyncIterator[str]:
    """Register the id's schema under the expected subject; yields what it does."""
    assert verdict.expected_subject is not None, "only a SUBJECT_MISMATCH, which names its subject, is repaired"
    yield f"registering schema id {verdict.use.schema_id} under {verdict.expected_subject}"
    try:
        answered = await registry.register_id_under(verdict.use.schema_id, verdict.expected_subject)
    except RegistryError as refused:
        yield f"  refused: {refused}"
        return
    yield f"  registered (the registry answered id {answered})"
