"""TiCDC Simple protocol: verify the row checksums of a DML message, JSON or Avro-encoded.

A DML message carries `checksum.current` for `data` (INSERT, UPDATE) and `checksum.previous`
for `old` (UPDATE, DELETE). Column types are not in the DML: they come from the last BOOTSTRAP
or DDL message whose `tableSchema` matches the DML's database, table and `schemaVersion`
(`tableSchema.columns` is in column-ID order, the checksum's order). Columns absent from
`data`/`old` (virtual generated columns) are not hashed.

`verify_simple` checks one message against a schema the caller holds;
`SimpleChecksumVerifier` follows a topic: it keeps the schemas of BOOTSTRAP and DDL messages and
holds DMLs back until their schema arrives. Both accept the message as JSON bytes or text, as
a JSON-decoded dict, or as the dict fastavro decodes from the Avro encoding (`payload` wrapper
or not).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kdiv.ticdc.checksum import (
    BAD_VALUE_ERRORS,
    NO_KEY,
    ChecksumResult,
    ChecksumVerdict,
    Encoder,
    RowImage,
    SkipReason,
    describe_value,
    encode_base64,
    encode_bytes,
    encode_double,
    encode_double_text,
    encode_float32,
    encode_float32_text,
    encode_integer,
    encode_integer_text,
    encode_nothing,
    encode_text,
    encode_vector_text,
    match_with_alternatives,
    parse_expected,
    row_checksum,
)
from kdiv.ticdc.timestamps import (
    TimestampMode,
    UtcRenderings,
    is_host_zone_name,
    is_utc,
    load_zone,
    parse_timestamp_mode,
)
from kdiv.untrusted import PREVIEW_CHARS, UntrustedJSONError, parse_json, preview

DML_TYPES: Final = frozenset({"INSERT", "UPDATE", "DELETE"})
_DEFAULT_MAX_PENDING = 10_000
_DEFAULT_MAX_SCHEMAS = 10_000
# TIMESTAMP locations seen (one memo of renderings each).
_MAX_ZONES = 256

_INTEGER_TYPES = frozenset(
    {"tinyint", "smallint", "mediumint", "int", "bigint", "year", "enum", "set", "bit", "bool", "boolean"}
)
_TEXT_TYPES = frozenset(
    {
        "char",
        "varchar",
        "var_string",
        "tinytext",
        "text",
        "mediumtext",
        "longtext",
        "decimal",
        "date",
        "datetime",
        "time",
        "json",
    }
)

# Table identity in schema and DML messages: (database, table, schema version).
TableKey = tuple[str, str, int]


# Column encoders: a value as Simple sends it in JSON (text) or Avro (native) ---------------------


def _encode_integer(value: Any) -> bytes:
    # JSON: decimal text. Avro: a long (two's complement for uint64), or UnsignedBigint {"value"}.
    if value.__class__ is str:
        return encode_integer_text(value)
    if isinstance(value, Mapping):
        return encode_integer(value["value"])
    return encode_integer(value)


def _encode_float(value: Any) -> bytes:
    return encode_float32_text(value) if value.__class__ is str else encode_float32(value)


def _encode_double(value: Any) -> bytes:
    return encode_double_text(value) if value.__class__ is str else encode_double(value)


def _encode_binary(value: Any) -> bytes:
    # JSON: base64 text. Avro: bytes.
    return encode_base64(value) if value.__class__ is str else encode_bytes(value)


def _encode_string(value: Any) -> bytes:
    return encode_text(value) if value.__class__ is str else encode_bytes(value)


def _encoder(mysql_type: str) -> Encoder | None:
    if mysql_type in _INTEGER_TYPES:
        return _encode_integer
    if mysql_type == "float":
        return _encode_float
    if mysql_type == "double":
        return _encode_double
    # TiCDC's IsBinaryMySQLType: the binary strings are sent base64-encoded in JSON.
    if "binary" in mysql_type or "blob" in mysql_type:
        return _encode_binary
    if mysql_type in _TEXT_TYPES:
        return _encode_string
    if mysql_type == "vector":
        return encode_vector_text
    if mysql_type == "geometry":
        return encode_nothing
    return None


# Table schemas -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimpleColumn:
    """One column of a table schema, as the checksum sees it."""

    name: str
    mysql_type: str
    encode: Encoder
    is_timestamp: bool


class SimpleTablePlan:
    """The checksum plan of one `tableSchema`: columns in order, key columns, or why it has none."""

    __slots__ = ("columns", "database", "error", "key_names", "table", "version")

    def __init__(
        self,
        database: str | None,
        table: str | None,
        version: int | None,
        columns: Sequence[SimpleColumn] = (),
        key_names: Sequence[str] = (),
        error: str | None = None,
    ) -> None:
        self.database = database
        self.table = table
        self.version = version
        self.columns = tuple(columns)
        self.key_names = tuple(key_names)
        # Set when the schema cannot be followed; DMLs of this schema are MALFORMED with it.
        self.error = error

    @property
    def table_key(self) -> TableKey | None:
        """(database, table, version), or None when the schema does not say."""
        if self.database is None or self.table is None or self.version is None:
            return None
        return (self.database, self.table, self.version)

    @property
    def qualified_name(self) -> str | None:
        return None if self.database is None or self.table is None else f"{self.database}.{self.table}"


def _key_names(indexes: object) -> list[str]:
    # The primary key, else the first unique index whose columns are all NOT NULL.
    if not isinstance(indexes, list):
        return []
    candidates = [index for index in indexes if isinstance(index, Mapping)]
    chosen = next((index for index in candidates if index.get("primary") is True), None)
    if chosen is None:
        chosen = next(
            (index for index in candidates if index.get("unique") is True and index.get("nullable") is False), None
        )
    if chosen is None or not isinstance(chosen.get("columns"), list):
        return []
    return [name for name in chosen["columns"] if isinstance(name, str)]


# Messages ----------------------------------------------------------------------------------------


def parse_message(message: bytes | bytearray | memoryview | str | Mapping[str, Any]) -> Mapping[str, Any]:
    """The message as a mapping: JSON decoded, Avro `payload` unwrapped. ValueError when it is neither."""
    if isinstance(message, bytes | bytearray | memoryview | str):
        try:
            decoded = parse_json(message)
        except UntrustedJSONError as bad:
            raise ValueError(f"not a JSON message: {bad}") from None
    else:
        decoded = message
    if not isinstance(decoded, Mapping):
        raise ValueError(f"message is a {type(decoded).__name__}, not an object")
    # Avro encoding: Message{payload: union of Watermark, Bootstrap, DDL, DML}; fastavro gives
    # the branch's record, or (name, record) with return_record_name.
    if "type" not in decoded and "payload" in decoded:
        payload = decoded["payload"]
        if isinstance(payload, tuple) and len(payload) == 2:
            payload = payload[1]
        if not isinstance(payload, Mapping):
            raise ValueError("the Avro message's payload is not a record")
        decoded = payload
    return decoded


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _database(message: Mapping[str, Any]) -> str | None:
    # `database`; the first Avro encoding of the protocol named it `schema`.
    return _str_or_none(message.get("database", message.get("schema")))


def dml_table_key(message: Mapping[str, Any]) -> TableKey | None:
    """(database, table, schemaVersion) of a DML message, or None when it does not say."""
    database = _database(message)
    table = _str_or_none(message.get("table"))
    version = _int_or_none(message.get("schemaVersion"))
    if database is None or table is None or version is None:
        return None
    return (database, table, version)


@dataclass(frozen=True, slots=True)
class _Image:
    image: RowImage
    row_field: str


_IMAGES: Final[Mapping[str, tuple[_Image, ...]]] = {
    "INSERT": (_Image(RowImage.CURRENT, "data"),),
    "UPDATE": (_Image(RowImage.CURRENT, "data"), _Image(RowImage.PREVIOUS, "old")),
    "DELETE": (_Image(RowImage.PREVIOUS, "old"),),
}


# Verification ------------------------------------------------------------------------------------


class SimpleChecksumVerifier:
    """Verifies the Simple-protocol messages of one topic, keeping table schemas in memory.

    `feed` each message in partition order: BOOTSTRAP and DDL messages record their
    `tableSchema`; a DML is verified at once when its schema is known, else held (at most
    `max_pending`, the oldest then given up as SKIPPED, schema unknown) and verified when the
    schema arrives. `time_zone` stands in for TIMESTAMP locations TiCDC names only as its host's
    zone ("Local", "System", ""); `timestamp_mode` as for Avro.
    """

    def __init__(
        self,
        *,
        time_zone: str = "UTC",
        timestamp_mode: TimestampMode | str = TimestampMode.UTC,
        max_pending: int = _DEFAULT_MAX_PENDING,
        max_schemas: int = _DEFAULT_MAX_SCHEMAS,
    ) -> None:
        self.time_zone = time_zone
        self.timestamp_mode = parse_timestamp_mode(timestamp_mode)
        self._host_zone = load_zone(time_zone)
        self._renderings: dict[str, UtcRenderings | None] = {}
        self._max_pending = max_pending
        self._max_schemas = max_schemas
        self._schemas: dict[TableKey, SimpleTablePlan] = {}
        self._pending: deque[tuple[TableKey, Mapping[str, Any], object]] = deque()
        self._plans_by_identity: dict[int, tuple[object, SimpleTablePlan]] = {}

    # Schemas ---------------------------------------------------------------------------------

    def plan(self, table_schema: Mapping[str, Any]) -> SimpleTablePlan:
        """The checksum plan of a `tableSchema` object (cached per object)."""
        entry = self._plans_by_identity.get(id(table_schema))
        if entry is not None and entry[0] is table_schema:
            return entry[1]
        plan = self._build_plan(table_schema)
        if len(self._plans_by_identity) >= self._max_schemas:
            self._plans_by_identity.clear()
        self._plans_by_identity[id(table_schema)] = (table_schema, plan)
        return plan

    def _build_plan(self, table_schema: object) -> SimpleTablePlan:
        if not isinstance(table_schema, Mapping):
            return SimpleTablePlan(None, None, None, error="tableSchema is not an object")
        database = _database(table_schema)
        table = _str_or_none(table_schema.get("table"))
        version = _int_or_none(table_schema.get("version"))
        columns_field = table_schema.get("columns")
        if not isinstance(columns_field, list):
            return SimpleTablePlan(database, table, version, error="tableSchema has no list of columns")
        columns: list[SimpleColumn] = []
        for position, column in enumerate(columns_field):
            name = column.get("name") if isinstance(column, Mapping) else None
            data_type = column.get("dataType") if isinstance(column, Mapping) else None
            mysql_type = data_type.get("mysqlType") if isinstance(data_type, Mapping) else None
            if not isinstance(name, str) or not isinstance(mysql_type, str):
                return SimpleTablePlan(
                    database, table, version, error=f"tableSchema column {position} has no name or dataType.mysqlType"
                )
            kind = mysql_type.lower()
            if kind == "timestamp":
                columns.append(SimpleColumn(name, mysql_type, self._encode_timestamp, True))
                continue
            encode = _encoder(kind)
            if encode is None:
                return SimpleTablePlan(
                    database,
                    table,
                    version,
                    error=f"column {preview(name)}: unsupported mysqlType {preview(mysql_type)}",
                )
            columns.append(SimpleColumn(name, mysql_type, encode, False))
        return SimpleTablePlan(database, table, version, columns, _key_names(table_schema.get("indexes")))

    def add_schema(self, table_schema: Mapping[str, Any]) -> SimpleTablePlan:
        """Record a `tableSchema` (from a BOOTSTRAP or DDL message) for the DMLs that name it."""
        plan = self.plan(table_schema)
        key = plan.table_key
        if key is not None:
            self._schemas.pop(key, None)
            if len(self._schemas) >= self._max_schemas:
                del self._schemas[next(iter(self._schemas))]
            self._schemas[key] = plan
        return plan

    def schema_for(self, key: TableKey) -> SimpleTablePlan | None:
        """The recorded plan of (database, table, version), if any."""
        return self._schemas.get(key)

    # Topic following -------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """DML messages held until their schema arrives."""
        return len(self._pending)

    def feed(self, message: bytes | bytearray | memoryview | str | Mapping[str, Any]) -> list[ChecksumResult]:
        """Results of `message` and of the held DMLs it releases (a schema), in arrival order."""
        return [result for _, result in self.feed_tagged(message, None)]

    def feed_tagged(
        self, message: bytes | bytearray | memoryview | str | Mapping[str, Any], tag: object
    ) -> list[tuple[object, ChecksumResult]]:
        """`feed`, each result paired with the tag its message was fed with (e.g. its offset):
        a schema message releases DMLs fed earlier, under their own tags."""
        try:
            parsed = parse_message(message)
        except ValueError as bad:
            return [(tag, ChecksumResult(ChecksumVerdict.MALFORMED, None, None, None, NO_KEY, None, str(bad)))]
        kind = parsed.get("type")
        if isinstance(kind, str) and kind in DML_TYPES:
            key = dml_table_key(parsed)
            schema = self._schemas.get(key) if key is not None else None
            if schema is not None or key is None or not _needs_schema(parsed):
                return [(tag, result) for result in self.verify(parsed, schema)]
            self._pending.append((key, parsed, tag))
            given_up: list[tuple[object, ChecksumResult]] = []
            while len(self._pending) > self._max_pending:
                _, oldest, oldest_tag = self._pending.popleft()
                given_up.extend((oldest_tag, result) for result in self.verify(oldest, None))
            return given_up
        released: list[tuple[object, ChecksumResult]] = []
        for field_name in ("preTableSchema", "tableSchema"):
            table_schema = parsed.get(field_name)
            if table_schema is None:
                continue
            if not isinstance(table_schema, Mapping):
                detail = f"{field_name} is not an object"
                released.append(
                    (tag, ChecksumResult(ChecksumVerdict.MALFORMED, None, None, None, NO_KEY, None, detail))
                )
                continue
            plan = self.add_schema(table_schema)
            if plan.table_key is None:
                detail = f"{field_name} has no database, table or version"
                released.append(
                    (
                        tag,
                        ChecksumResult(
                            ChecksumVerdict.MALFORMED, None, None, plan.qualified_name, NO_KEY, None, detail
                        ),
                    )
                )
                continue
            released.extend(self._release(plan))
        return released

    def _release(self, plan: SimpleTablePlan) -> list[tuple[object, ChecksumResult]]:
        key = plan.table_key
        if not any(pending_key == key for pending_key, _, _ in self._pending):
            return []
        results: list[tuple[object, ChecksumResult]] = []
        kept: deque[tuple[TableKey, Mapping[str, Any], object]] = deque()
        for pending_key, held, tag in self._pending:
            if pending_key == key:
                results.extend((tag, result) for result in self.verify(held, plan))
            else:
                kept.append((pending_key, held, tag))
        self._pending = kept
        return results

    def flush(self) -> list[ChecksumResult]:
        """Give up on every held DML: SKIPPED, schema unknown."""
        return [result for _, result in self.flush_tagged()]

    def flush_tagged(self) -> list[tuple[object, ChecksumResult]]:
        """`flush`, each result paired with its message's tag."""
        results: list[tuple[object, ChecksumResult]] = []
        while self._pending:
            _, held, tag = self._pending.popleft()
            results.extend((tag, result) for result in self.verify(held, None))
        return results

    # One message -----------------------------------------------------------------------------

    def verify(
        self,
        message: bytes | bytearray | memoryview | str | Mapping[str, Any],
        table_schema: Mapping[str, Any] | SimpleTablePlan | None,
    ) -> tuple[ChecksumResult, ...]:
        """One result per row image the DML carries a checksum slot for (INSERT: current; UPDATE:
        current, previous; DELETE: previous); () for a message that is not a DML. Never raises on
        a bad message: that is a MALFORMED result.
        """
        try:
            parsed = parse_message(message)
        except ValueError as bad:
            return (ChecksumResult(ChecksumVerdict.MALFORMED, None, None, None, NO_KEY, None, str(bad)),)
        kind = parsed.get("type")
        if not isinstance(kind, str) or kind not in DML_TYPES:
            return ()
        if table_schema is None or isinstance(table_schema, SimpleTablePlan):
            plan = table_schema
        else:
            plan = self.plan(table_schema)
        table = _qualified(parsed)
        commit_ts = _int_or_none(parsed.get("commitTs"))
        images = _IMAGES[kind]
        checksum = parsed.get("checksum")
        problem = None
        if checksum is not None and not isinstance(checksum, Mapping):
            problem = "checksum is not an object"
        elif checksum is not None and not isinstance(checksum.get("corrupted", False), bool):
            problem = f"checksum.corrupted is {describe_value(checksum.get('corrupted'))}, not a boolean"
        if problem is not None:
            return tuple(
                ChecksumResult(ChecksumVerdict.MALFORMED, None, None, table, NO_KEY, commit_ts, problem, image.image)
                for image in images
            )
        return tuple(self._verify_image(parsed, image, checksum, plan, table, commit_ts) for image in images)

    def _verify_image(
        self,
        message: Mapping[str, Any],
        image: _Image,
        checksum: Mapping[str, Any] | None,
        plan: SimpleTablePlan | None,
        table: str | None,
        commit_ts: int | None,
    ) -> ChecksumResult:
        slot = image.image.value
        row = message.get(image.row_field)
        key = _key_of(plan, row)
        expected: int | None = None

        def result(
            verdict: ChecksumVerdict, detail: str, computed: int | None = None, reason: SkipReason | None = None
        ) -> ChecksumResult:
            return ChecksumResult(verdict, expected, computed, table, key, commit_ts, detail, image.image, reason)

        # Precedence: corrupted flag, then checksum 0 or absent, then what cannot be compared.
        if checksum is None:
            return result(ChecksumVerdict.SKIPPED, SkipReason.CHECKSUM_ABSENT.value, None, SkipReason.CHECKSUM_ABSENT)
        unreadable = None
        try:
            expected = parse_expected(checksum.get(slot))
        except ValueError as bad:
            unreadable = f"checksum.{slot}: {bad}"
        unusable = _unusable_schema(message, plan, row, image)
        if checksum.get("corrupted") is True:
            computed = None
            if unusable is None and plan is not None and isinstance(row, Mapping):
                try:
                    computed = row_checksum(self._parts(plan, row))
                except BAD_VALUE_ERRORS:
                    computed = None
            return result(
                ChecksumVerdict.CORRUPTED_FLAG,
                "TiCDC found the row inconsistent with TiDB's checksum before sending it",
                computed,
            )
        if unreadable is not None:
            return result(ChecksumVerdict.MALFORMED, unreadable)
        if expected is None:
            return result(ChecksumVerdict.SKIPPED, SkipReason.CHECKSUM_ABSENT.value, None, SkipReason.CHECKSUM_ABSENT)
        if expected == 0:
            return result(ChecksumVerdict.SKIPPED, SkipReason.CHECKSUM_ZERO.value, None, SkipReason.CHECKSUM_ZERO)
        if message.get("handleKeyOnly") is True:
            detail = "only the handle key columns are sent; the row is upstream"
            return result(ChecksumVerdict.SKIPPED, detail, None, SkipReason.HANDLE_KEY_ONLY)
        claim_check = message.get("claimCheckLocation")
        if claim_check:
            detail = f"the row is in external storage ({describe_value(claim_check)})"
            return result(ChecksumVerdict.SKIPPED, detail, None, SkipReason.CLAIM_CHECK)
        if plan is None:
            detail = f"no table schema for {table} schemaVersion {message.get('schemaVersion')}"
            return result(ChecksumVerdict.SKIPPED, detail, None, SkipReason.SCHEMA_UNKNOWN)
        if unusable is not None or not isinstance(row, Mapping):
            return result(ChecksumVerdict.MALFORMED, unusable or f"no {image.row_field!r} object")
        try:
            parts = self._parts(plan, row)
        except BAD_VALUE_ERRORS:
            return result(ChecksumVerdict.MALFORMED, _diagnose(plan, row, image.row_field))
        computed = row_checksum(parts)
        if computed == expected:
            return result(ChecksumVerdict.OK, "", computed)
        matched = self._match_other_readings(plan, row, parts, expected)
        if matched is not None:
            return result(ChecksumVerdict.OK, matched, expected)
        detail = (
            f"checksum mismatch over {len(parts)} columns of {image.row_field!r}: "
            f"carried {expected}, recomputed {computed}"
        )
        return result(ChecksumVerdict.CHECKSUM_MISMATCH, detail, computed)

    def _parts(self, plan: SimpleTablePlan, row: Mapping[str, Any]) -> list[bytes]:
        # Absent (virtual generated) and NULL columns both append nothing.
        get = row.get
        return [column.encode(value) for column in plan.columns if (value := get(column.name)) is not None]

    def _match_other_readings(
        self, plan: SimpleTablePlan, row: Mapping[str, Any], parts: list[bytes], expected: int
    ) -> str | None:
        alternatives: list[tuple[int, bytes]] = []
        names: dict[int, str] = {}
        position = 0
        for column in plan.columns:
            value = row.get(column.name)
            if value is None:
                continue
            if column.is_timestamp:
                other = self._other_timestamp_reading(value)
                if other is not None:
                    alternatives.append((position, other))
                    names[position] = column.name
            position += 1
        if not alternatives:
            return None
        used = match_with_alternatives(parts, alternatives, expected)
        if used is None:
            return None
        return f"TIMESTAMP {', '.join(names[p] for p in used)} in a repeated hour: matched under the other reading"

    # TIMESTAMP -------------------------------------------------------------------------------

    def _timestamp_parts(self, value: Any) -> tuple[str, UtcRenderings | None]:
        # JSON and Avro: {"location", "value"}; a bare text is read in the verifier's zone.
        if isinstance(value, Mapping):
            location, text = value["location"], value["value"]
        else:
            location, text = "", value
        if text.__class__ is not str or location.__class__ is not str:
            raise TypeError(f"expected a TIMESTAMP {{location, value}} of texts, got {describe_value(value)}")
        if self.timestamp_mode is TimestampMode.AS_SENT:
            return text, None
        try:
            renderings = self._renderings[location]
        except KeyError:
            zone = self._host_zone if is_host_zone_name(location) else load_zone(location)
            renderings = None if is_utc(zone) else UtcRenderings(zone)
            if len(self._renderings) >= _MAX_ZONES:
                self._renderings.clear()
            self._renderings[location] = renderings
        return text, renderings

    def _encode_timestamp(self, value: Any) -> bytes:
        text, renderings = self._timestamp_parts(value)
        return encode_text(text) if renderings is None else renderings[text]

    def _other_timestamp_reading(self, value: Any) -> bytes | None:
        text, renderings = self._timestamp_parts(value)
        return None if renderings is None else renderings.other_reading(text)


def _needs_schema(message: Mapping[str, Any]) -> bool:
    # A DML is held for its schema only when some image will be compared.
    checksum = message.get("checksum")
    if not isinstance(checksum, Mapping) or checksum.get("corrupted") is not False:
        return False
    if message.get("handleKeyOnly") is True or message.get("claimCheckLocation"):
        return False
    images = _IMAGES.get(str(message.get("type")), ())
    return any(checksum.get(image.image.value) not in (None, 0) for image in images)


def _unusable_schema(
    message: Mapping[str, Any], plan: SimpleTablePlan | None, row: object, image: _Image
) -> str | None:
    # Why the row cannot be hashed with `plan` (None: it can, or there is no plan).
    if plan is None:
        return None
    if plan.error is not None:
        return plan.error
    key = dml_table_key(message)
    schema_key = plan.table_key
    if key is not None and schema_key is not None and key != schema_key:
        return (
            f"the DML is for {key[0]}.{key[1]} schemaVersion {key[2]}, "
            f"the table schema for {schema_key[0]}.{schema_key[1]} version {schema_key[2]}"
        )
    if row is not None and not isinstance(row, Mapping):
        return f"{image.row_field!r} is not an object"
    return None


def _qualified(message: Mapping[str, Any]) -> str | None:
    database = _database(message)
    table = _str_or_none(message.get("table"))
    return None if database is None or table is None else f"{database}.{table}"


def _key_of(plan: SimpleTablePlan | None, row: object) -> Mapping[str, object]:
    if plan is None or not plan.key_names or not isinstance(row, Mapping):
        return NO_KEY
    return {name: row[name] for name in plan.key_names if name in row}


def _diagnose(plan: SimpleTablePlan, row: Mapping[str, Any], row_field: str) -> str:
    for column in plan.columns:
        value = row.get(column.name)
        if value is None:
            continue
        try:
            column.encode(value)
        except BAD_VALUE_ERRORS as bad:
            name = column.name if len(column.name) <= PREVIEW_CHARS else preview(column.name)
            return f"{row_field}.{name} ({column.mysql_type}): cannot hash {describe_value(value)}: {preview(bad)}"
    return f"{row_field!r} cannot be hashed"


_verifiers: dict[tuple[str, TimestampMode], SimpleChecksumVerifier] = {}


def verify_simple(
    message: bytes | bytearray | memoryview | str | Mapping[str, Any],
    table_schema: Mapping[str, Any] | SimpleTablePlan | None = None,
    *,
    time_zone: str = "UTC",
    timestamp_mode: TimestampMode | str = TimestampMode.UTC,
) -> tuple[ChecksumResult, ...]:
    """The results of one Simple DML message checked against `table_schema` (the `tableSchema`
    of its BOOTSTRAP or DDL message; None when unknown: images to compare are then SKIPPED).

    One result per row image: INSERT (current), UPDATE (current, previous), DELETE (previous);
    () for a message that is not a DML. ValueError for an unknown `time_zone` or mode.
    """
    mode = parse_timestamp_mode(timestamp_mode)
    verifier = _verifiers.get((time_zone, mode))
    if verifier is None:
        verifier = _verifiers[(time_zone, mode)] = SimpleChecksumVerifier(time_zone=time_zone, timestamp_mode=mode)
    return verifier.verify(message, table_schema)
