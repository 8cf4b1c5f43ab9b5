"""Is a schema id registered under the subject its reader uses? Verdicts, and the cached,
outage-tolerant lookups behind them.

The KAFKA-10179 class of failure: records carry a schema id that exists, but not under
the subject the deserializer of the topic (or of the store restored from it) looks in.

A lookup that the registry cannot answer (down, slow, garbage) is "unchecked": counted,
never a verdict and never a wait longer than one request timeout. After a failure the
registry is left alone for a backoff period, so a dead registry costs nothing per record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from kdiv.registry.client import (
    RegistryError,
    RegistryUnavailable,
    SchemaNotFound,
    SchemaRegistry,
    expected_subject,
)
from kdiv.untrusted import UntrustedJSONError, parse_json

SCHEMA_UNKNOWN = "SCHEMA_UNKNOWN"
SUBJECT_MISMATCH = "SUBJECT_MISMATCH"
UNCHECKED = "UNCHECKED"


@dataclass(frozen=True)
class SchemaIdInfo:
    """What the registry says of an id: its subjects, and the record name strategies use."""

    subjects: frozenset[str]
    record_name: str | None


def record_name_of(schema_text: str) -> str | None:
    """The full name of a record schema (what Record/TopicRecordNameStrategy name subjects by)."""
    try:
        schema = parse_json(schema_text)
    except UntrustedJSONError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("name"), str):
        return None
    name, namespace = schema["name"], schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def judge(info: SchemaIdInfo | None, subject: str | None) -> str | None:
    """SCHEMA_UNKNOWN, SUBJECT_MISMATCH, or None when the id is where its reader looks."""
    if info is None:
        return SCHEMA_UNKNOWN
    if subject is None or subject not in info.subjects:
        return SUBJECT_MISMATCH
    return None


@dataclass(frozen=True)
class Judgement:
    verdict: str | None  # SCHEMA_UNKNOWN, SUBJECT_MISMATCH, UNCHECKED, or None: where expected
    info: SchemaIdInfo | None
    expected_subject: str | None


@dataclass
class LookupStats:
    requests: int = 0
    failures: int = 0
    unchecked: int = 0
    last_error: str = ""


@dataclass
class SchemaLookups:
    registry: SchemaRegistry
    clock: Callable[[], float]  # seconds, monotonic
    # Subjects of an id change (a repair adds one), so they are fetched again after this.
    subjects_ttl_s: float = 60.0
    backoff_s: float = 5.0
    max_backoff_s: float = 60.0
    timeout_s: float = 5.0
    stats: LookupStats = field(default_factory=LookupStats)
    _schemas: dict[int, str | None] = field(default_factory=dict)  # None: the registry has no such id
    _subjects: dict[int, tuple[float, frozenset[str]]] = field(default_factory=dict)
    _down_until: float = 0.0
    _current_backoff: float = 0.0

    @property
    def available(self) -> bool:
        return self.clock() >= self._down_until

    def forget_subjects(self, schema_id: int) -> None:
        self._subjects.pop(schema_id, None)

    async def schema_text(self, schema_id: int) -> str | None:
        """The schema of an id (None: unknown to the registry). Ids never change: kept."""
        if schema_id not in self._schemas:
            try:
                self._schemas[schema_id] = await self._ask(self.registry.schema_text(schema_id))
            except SchemaNotFound:
                return None  # not kept: the id may be registered later
        return self._schemas[schema_id]

    async def info(self, schema_id: int) -> SchemaIdInfo | None:
        """Raises RegistryUnavailable, at once while the registry is backed off."""
        text = await self.schema_text(schema_id)
        if text is None:
            return None
        now = self.clock()
        cached = self._subjects.get(schema_id)
        if cached is None or now - cached[0] > self.subjects_ttl_s:
            try:
                versions = await self._ask(self.registry.versions_of(schema_id))
            except SchemaNotFound:
                versions = []
            cached = (now, frozenset(v.subject for v in versions))
            self._subjects[schema_id] = cached
        return SchemaIdInfo(cached[1], record_name_of(text))

    async def judgement(self, schema_id: int, topic: str, strategy: str, *, is_key: bool) -> Judgement:
        """The verdict for a framed record of `topic` (UNCHECKED when the registry can't say),
        with what it was judged on."""
        try:
            info = await self.info(schema_id)
        except RegistryUnavailable:
            self.stats.unchecked += 1
            return Judgement(UNCHECKED, None, None)
        subject = expected_subject(strategy, topic, is_key=is_key, record_name=info.record_name if info else None)
        return Judgement(judge(info, subject), info, subject)

    async def verdict(self, schema_id: int, topic: str, strategy: str, *, is_key: bool) -> str | None:
        return (await self.judgement(schema_id, topic, strategy, is_key=is_key)).verdict

    async def _ask(self, request):
        if not self.available:
            request.close()
            raise RegistryUnavailable(f"registry backed off after: {self.stats.last_error}")
        self.stats.requests += 1
        try:
            answer = await asyncio.wait_for(request, self.timeout_s)
        except TimeoutError:
            self._failed(f"{self.registry.url}: no answer within {self.timeout_s} s")
            raise RegistryUnavailable(self.stats.last_error) from None
        except RegistryUnavailable as down:
            self._failed(str(down))
            raise
        except RegistryError:
            self._current_backoff = 0.0
            raise
        self._current_backoff = 0.0
        return answer

    def _failed(self, error: str) -> None:
        self.stats.failures += 1
        self.stats.last_error = error
        self._current_backoff = min(max(self._current_backoff * 2, self.backoff_s), self.max_backoff_s)
        self._down_until = self.clock() + self._current_backoff
