"""A changefeed topic's records, from Kafka bytes to row-checksum verdicts.

TiCDC's Avro protocol frames key and value the Confluent way (writer schemas from the
registry); its Simple protocol sends JSON whose column types come from BOOTSTRAP and DDL
messages of the same partition. The worker, `kdiv check --ticdc` and the nightly job all go
through `ChangefeedVerifier`, so the three give the same verdicts for the same bytes.

No I/O: writer schemas are handed in (`learn_schema`) by whoever can ask the registry; a
record whose schema id was not handed in yet is not verified (`missing_schemas` says which).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import fastavro

from kdiv.state.framing import FramingError, unframe
from kdiv.ticdc.avro import AvroChecksumVerifier
from kdiv.ticdc.checksum import NO_KEY, ChecksumResult, ChecksumVerdict
from kdiv.ticdc.simple import SimpleChecksumVerifier
from kdiv.ticdc.timestamps import TimestampMode, parse_timestamp_mode
from kdiv.untrusted import parse_json, preview

AVRO: Final = "avro"
SIMPLE: Final = "simple"
PROTOCOLS: Final = (AVRO, SIMPLE)


@dataclass(frozen=True, slots=True)
class RowVerdict:
    """The verdict on one row image of the record at topic/partition/offset."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    result: ChecksumResult


def fault_detail(result: ChecksumResult) -> str:
    """What every report (incident, `kdiv check` line, nightly finding) says of a faulty row."""
    verdict = result.verdict
    if verdict is ChecksumVerdict.CHECKSUM_MISMATCH:
        what = f"row checksum {result.expected} does not match {result.computed} computed from the columns"
    elif verdict is ChecksumVerdict.CORRUPTED_FLAG:
        what = "TiCDC flagged the row corrupted (its checksum disagreed with TiDB's)"
    else:
        what = "the message cannot be verified"
    detail = f"{result.table or 'unknown table'}, {result.image.value} image: {what}"
    return f"{detail}: {result.detail}" if result.detail else detail


def key_columns(result: ChecksumResult) -> dict[str, object]:
    """The row's key columns as JSON values: bytes in hex, anything else not JSON as text."""
    return {str(column): _json_value(value) for column, value in result.key.items()}


def _json_value(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


class WriterSchemas:
    """Writer schemas by registry id, parsed once (None: the registry has no such id)."""

    def __init__(self) -> None:
        self._parsed: dict[int, Any] = {}
        self._errors: dict[int, str] = {}

    def __contains__(self, schema_id: int) -> bool:
        return schema_id in self._parsed or schema_id in self._errors

    def learn(self, schema_id: int, text: str | None) -> None:
        if text is None:
            self._errors[schema_id] = f"schema id {schema_id} is unknown to the registry"
            return
        try:
            self._parsed[schema_id] = fastavro.parse_schema(parse_json(text))
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as bad:
            self._errors[schema_id] = f"schema id {schema_id} is not a usable Avro schema: {preview(bad)}"

    def get(self, schema_id: int) -> tuple[Any, str | None]:
        """(parsed schema, None) or (None, why it cannot be used)."""
        parsed = self._parsed.get(schema_id)
        if parsed is not None:
            return parsed, None
        return None, self._errors.get(schema_id, f"schema id {schema_id} not looked up")


def framed_ids(*raws: bytes | None) -> list[int]:
    """The Confluent schema ids of the framed values among `raws`."""
    ids = []
    for raw in raws:
        if raw is not None and len(raw) >= 5 and raw[0] == 0:
            ids.append(int.from_bytes(raw[1:5], "big", signed=True))
    return ids


class ChangefeedVerifier:
    """Verifies the records of changefeed topics, each topic with its protocol.

    Feed each partition's records in offset order. Simple-protocol DMLs wait for their
    table's schema within `verify_many`'s call and `take_held` gives up on the rest.
    """

    def __init__(
        self,
        protocol_of,
        *,
        time_zone: str = "UTC",
        timestamp_mode: TimestampMode | str = TimestampMode.UTC,
        schemas: WriterSchemas | None = None,
    ) -> None:
        self.protocol_of = protocol_of
        self.time_zone = time_zone
        self.timestamp_mode = parse_timestamp_mode(timestamp_mode)
        self.schemas = schemas if schemas is not None else WriterSchemas()
        self._avro = AvroChecksumVerifier(time_zone=time_zone, timestamp_mode=self.timestamp_mode)
        self._simple: dict[tuple[str, int], SimpleChecksumVerifier] = {}

    # -- writer schemas (Avro) ------------------------------------------------------------

    def missing_schemas(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> set[int]:
        """Schema ids of these (key, value) pairs not yet handed in."""
        schemas = self.schemas
        return {i for key, value in records for i in framed_ids(key, value) if i not in schemas}

    def learn_schema(self, schema_id: int, text: str | None) -> None:
        self.schemas.learn(schema_id, text)

    # -- records ---------------------------------------------------------------------------

    def verify_many(
        self, topic: str, partition: int, records: Iterable[tuple[int, int, bytes | None, bytes | None]]
    ) -> list[RowVerdict]:
        """Verdicts for (offset, timestamp ms, key, value) records of one partition, in order."""
        if self.protocol_of(topic) == SIMPLE:
            return self._verify_simple(topic, partition, records)
        verdicts = []
        for offset, timestamp, key, value in records:
            verdicts.append(RowVerdict(topic, partition, offset, timestamp, self.verify_avro(key, value)))
        return verdicts

    def verify_avro(self, key: bytes | None, value: bytes | None) -> ChecksumResult:
        """One Avro-protocol record; every problem with its bytes is a MALFORMED verdict."""
        key_columns, key_schema = self._decode_key(key)
        if value is None:
            # A DELETE: the key record is named after the table, like the value record.
            return self._avro.verify(None, key_schema, key=key_columns)
        try:
            schema_id, body = unframe(value)
        except FramingError as bad:
            return _malformed(f"value is not Confluent-framed Avro: {bad}", key_columns)
        schema, problem = self.schemas.get(schema_id)
        if problem is not None:
            return _malformed(problem, key_columns)
        try:
            decoded = fastavro.schemaless_reader(io.BytesIO(body), schema, None)
        except (ValueError, TypeError, EOFError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as bad:
            return _malformed(f"value does not decode with schema id {schema_id}: {preview(bad)}", key_columns)
        if not isinstance(decoded, Mapping):
            return _malformed(f"value decodes to {type(decoded).__name__} with schema id {schema_id}", key_columns)
        return self._avro.verify(decoded, schema, key=key_columns)

    def _decode_key(self, key: bytes | None) -> tuple[Mapping[str, object] | None, Any]:
        """The key record and its writer schema; (None, None) when the key cannot be read
        (the verdict is on the value: a key only names the row)."""
        if key is None:
            return None, None
        try:
            schema_id, body = unframe(key)
        except FramingError:
            return None, None
        schema, problem = self.schemas.get(schema_id)
        if problem is not None:
            return None, None
        try:
            decoded = fastavro.schemaless_reader(io.BytesIO(body), schema, None)
        except (ValueError, TypeError, EOFError, IndexError, KeyError, UnicodeDecodeError, OverflowError):
            return None, None
        return (decoded, schema) if isinstance(decoded, Mapping) else (None, None)

    def _verify_simple(
        self, topic: str, partition: int, records: Iterable[tuple[int, int, bytes | None, bytes | None]]
    ) -> list[RowVerdict]:
        verifier = self._simple.get((topic, partition))
        if verifier is None:
            verifier = self._simple[(topic, partition)] = SimpleChecksumVerifier(
                time_zone=self.time_zone, timestamp_mode=self.timestamp_mode
            )
        verdicts = []
        for offset, timestamp, _key, value in records:
            if value is None:
                continue  # Simple sends no tombstones; a compacted-away row has nothing to verify
            for tag, result in verifier.feed_tagged(value, (offset, timestamp)):
                at, ts = cast(tuple[int, int], tag)  # the (offset, timestamp) fed above
                verdicts.append(RowVerdict(topic, partition, at, ts, result))
        return verdicts

    def held(self) -> int:
        """Simple-protocol DMLs waiting for their table's schema."""
        return sum(v.pending for v in self._simple.values())

    def take_held(self, topic: str | None = None, partition: int | None = None) -> list[RowVerdict]:
        """Give up on held DMLs (SKIPPED, schema unknown): of one partition, or all."""
        verdicts = []
        for (t, p), verifier in self._simple.items():
            if (topic is None or t == topic) and (partition is None or p == partition):
                for tag, result in verifier.flush_tagged():
                    at, ts = cast(tuple[int, int], tag)
                    verdicts.append(RowVerdict(t, p, at, ts, result))
        return verdicts

    def forget(self, topic: str, partition: int) -> None:
        """A revoked partition: its learned table schemas go with it."""
        self._simple.pop((topic, partition), None)


def _malformed(detail: str, key: Mapping[str, object] | None) -> ChecksumResult:
    return ChecksumResult(ChecksumVerdict.MALFORMED, None, None, None, NO_KEY if key is None else key, None, detail)
