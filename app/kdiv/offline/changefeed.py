"""`kdiv check --ticdc`: the TiCDC row checksums of a recorded changefeed (`kdiv dump` lines).

Every row goes through `kdiv.changefeed.verify.ChangefeedVerifier`, the verifier of the worker
and of the nightly job, so a dump gets the verdicts its records get live. Each fault
(CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED) is one output line; every verdict is counted.

Avro writer schemas are asked of the registry by id, each once, when a record first needs it.
A registry that cannot answer ends the check (no row is judged without its schema, as in the
worker). An id the registry does not know makes its rows MALFORMED, as in the worker, and is
also named as a failure of the check: a dump checked against the wrong registry must not pass
for a corrupt changefeed.

Simple-protocol DMLs whose table schema (a BOOTSTRAP or DDL message of their partition) has
not come by the end of the input are given up the way the worker gives them up before it
commits: SKIPPED, schema unknown, counted in the summary.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TextIO

from kdiv.changefeed.verify import AVRO, PROTOCOLS, ChangefeedVerifier, RowVerdict
from kdiv.clock import wall_clock_ms
from kdiv.config.settings import RegistrySettings
from kdiv.offline.jsonl import InputError, checksum_fault_to_line, parse_record_bytes
from kdiv.registry.client import RegistryError, SchemaNotFound, SchemaRegistry
from kdiv.ticdc.checksum import FAULT_VERDICTS, ChecksumVerdict, SkipReason
from kdiv.ticdc.timestamps import TimestampMode

# Records of one partition handed to the verifier at once.
RUN_MAX = 1000

# A writer schema's text by id; None: the registry has no such id. Raises RegistryError when
# it cannot answer.
SchemaLookup = Callable[[int], str | None]


class SchemaUnavailable(Exception):
    """The registry could not give a writer schema a record needs; the message says where."""


@dataclass
class ChecksumCounts:
    """What a check found: records read, rows by verdict, why rows were skipped, and the
    problems that make the check itself fail."""

    records: int = 0
    rows: Counter[ChecksumVerdict] = field(default_factory=Counter)
    skipped: Counter[SkipReason] = field(default_factory=Counter)
    bad_lines: int = 0
    # schema id -> the first record that needed it ("file:line: topic/partition@offset").
    unknown_schemas: dict[int, str] = field(default_factory=dict)

    @property
    def faults(self) -> int:
        return sum(self.rows[verdict] for verdict in FAULT_VERDICTS)

    @property
    def exit_status(self) -> int:
        """0 no fault, 1 faults, 2 the check is not to be trusted (bad lines, unknown schemas)."""
        return 2 if self.bad_lines or self.unknown_schemas else 1 if self.faults else 0

    def summary(self) -> str:
        verdicts = []
        for verdict in ChecksumVerdict:
            if self.rows[verdict]:
                text = f"{verdict.value} {self.rows[verdict]}"
                if verdict is ChecksumVerdict.SKIPPED:
                    reasons = ", ".join(f"{reason.value} {n}" for reason, n in self.skipped.most_common())
                    text += f" ({reasons})"
                verdicts.append(text)
        text = (
            f"{self.records} records, {sum(self.rows.values())} rows ({'; '.join(verdicts) or 'none'}); "
            f"{self.faults} faults; {self.bad_lines} bad input lines"
        )
        if self.unknown_schemas:
            ids = ", ".join(str(schema_id) for schema_id in sorted(self.unknown_schemas))
            text += f"; schema ids unknown to the registry: {ids}"
        return text


def check_changefeed(
    lines: Iterable[bytes],
    source: str,
    protocol: str,
    out: TextIO,
    *,
    schemas: SchemaLookup | None = None,
    time_zone: str = "UTC",
    timestamp_mode: TimestampMode | str = TimestampMode.UTC,
    report: Callable[[str], None] = lambda message: None,
    clock: Callable[[], int] = wall_clock_ms,
) -> ChecksumCounts:
    """Verify the record lines of `source` (`kdiv dump` JSON Lines, each partition's records in
    offset order) as changefeed messages of `protocol`; write a line per fault to `out`.

    `schemas` looks up Avro writer schemas (required for Avro). `report` receives each bad
    line and each schema id unknown to the registry, named by file:line and record; `clock`
    gives each fault line's detected_at_ms. Raises
    SchemaUnavailable when the registry cannot answer; the faults found before are written.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    if protocol == AVRO and schemas is None:
        raise ValueError("the Avro protocol needs a schema lookup (the registry)")
    verifier = ChangefeedVerifier(lambda topic: protocol, time_zone=time_zone, timestamp_mode=timestamp_mode)
    counts = ChecksumCounts()
    run: list[tuple[int, int, bytes | None, bytes | None]] = []
    run_of: tuple[str, int] = ("", -1)

    def account(verdicts: list[RowVerdict]) -> None:
        for row in verdicts:
            result = row.result
            counts.rows[result.verdict] += 1
            if result.skip_reason is not None:
                counts.skipped[result.skip_reason] += 1
            if result.is_fault:
                out.write(checksum_fault_to_line(row, clock()) + "\n")

    def verify_run() -> None:
        if run:
            account(verifier.verify_many(*run_of, run))
            run.clear()

    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = parse_record_bytes(raw, source, lineno)
        except InputError as bad:
            report(str(bad))
            counts.bad_lines += 1
            continue
        counts.records += 1
        if (record.topic, record.partition) != run_of or len(run) >= RUN_MAX:
            verify_run()
            run_of = (record.topic, record.partition)
        if schemas is not None and protocol == AVRO:
            missing = verifier.missing_schemas(((record.key, record.value),))
            if missing:
                verify_run()  # the records before this one do not wait on the registry
                where = f"{source}:{lineno}: {record.where}"
                for schema_id in sorted(missing):
                    text = _look_up(schemas, schema_id, where)
                    if text is None:
                        counts.unknown_schemas[schema_id] = where
                        report(f"{where}: schema id {schema_id} is unknown to the registry")
                    verifier.learn_schema(schema_id, text)
        run.append((record.offset, record.timestamp, record.key, record.value))
    verify_run()
    account(verifier.take_held())
    out.flush()
    return counts


def _look_up(schemas: SchemaLookup, schema_id: int, where: str) -> str | None:
    try:
        return schemas(schema_id)
    except RegistryError as failed:
        raise SchemaUnavailable(f"{where}: writer schema id {schema_id}: {failed}") from None


class RegistrySchemas:
    """Writer schema texts from the Schema Registry, for a synchronous caller. Close it (or use
    it as a context manager): it owns an event loop and the registry client."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.url = settings.url
        self._runner = asyncio.Runner()
        self._registry = SchemaRegistry(settings)

    def __call__(self, schema_id: int) -> str | None:
        try:
            return self._runner.run(self._registry.schema_text(schema_id))
        except SchemaNotFound:
            return None

    def close(self) -> None:
        try:
            self._runner.run(self._registry.close())
        finally:
            self._runner.close()

    def __enter__(self) -> RegistrySchemas:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
