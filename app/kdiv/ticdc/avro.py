"""TiCDC Avro protocol: verify the row checksum of a value record already decoded by fastavro.

The value schema lists the table's columns in column-ID order (TiCDC sorts them when the
checksum is on), then TiCDC's extension fields from `_tidb_op` on; each column field carries
`connect.parameters.tidb_type`, which says how its Avro value becomes checksum bytes. Only the
new row of an INSERT or UPDATE travels (with `_tidb_row_level_checksum`); a DELETE is a tombstone.

Per writer schema, a plan is built once: the column names (read with one `itemgetter` call)
and one encoder per column; verifying a row is then that read, the encoders, and one CRC.
"""

from __future__ import annotations

import json
import operator
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

from kdiv.ticdc.checksum import (
    BAD_VALUE_ERRORS,
    NO_KEY,
    UINT32_MAX,
    ChecksumResult,
    ChecksumVerdict,
    Encoder,
    EnumIndex,
    RowImage,
    SetMask,
    SkipReason,
    describe_value,
    encode_bit_bytes,
    encode_bytes,
    encode_double,
    encode_int64,
    encode_nothing,
    encode_text,
    encode_unsigned_long,
    encode_unsigned_text,
    encode_vector_text,
    match_with_alternatives,
    optional,
    parse_allowed,
    parse_expected,
)
from kdiv.ticdc.timestamps import TimestampMode, UtcRenderings, is_utc, load_zone, parse_timestamp_mode
from kdiv.untrusted import UntrustedJSONError, parse_json, preview

OP_FIELD: Final = "_tidb_op"
COMMIT_TS_FIELD: Final = "_tidb_commit_ts"
CHECKSUM_FIELD: Final = "_tidb_row_level_checksum"
CORRUPTED_FIELD: Final = "_tidb_corrupted"

_DEFAULT_MAX_PLANS = 1024

_OK = ChecksumVerdict.OK
_MISMATCH = ChecksumVerdict.CHECKSUM_MISMATCH
_MALFORMED = ChecksumVerdict.MALFORMED
_SKIPPED = ChecksumVerdict.SKIPPED
_CURRENT = RowImage.CURRENT
_ChecksumResult = ChecksumResult
_call = operator.call
_crc32 = zlib.crc32


@dataclass(frozen=True, slots=True)
class AvroColumn:
    """One column of a value schema, as the checksum sees it."""

    name: str
    tidb_type: str
    # The value's bytes; NULL is handled by the plan.
    encode: Encoder
    nullable: bool
    # TIMESTAMP columns converted to UTC: the memo that also knows repeated-hour readings.
    renderings: UtcRenderings | None = None


class AvroRowPlan:
    """The checksum plan of one writer schema: its columns in order, or why it has none."""

    __slots__ = ("columns", "encoders", "error", "read_values", "table", "timestamp_columns")

    def __init__(self, table: str | None, columns: Sequence[AvroColumn], error: str | None = None) -> None:
        self.table = table
        self.columns = tuple(columns)
        # Nullable columns get an encoder that appends nothing for NULL, so that a row is
        # map(call, encoders, values) with no per-column test on the hot path.
        self.encoders = tuple(optional(column.encode) if column.nullable else column.encode for column in self.columns)
        # Set when the schema is not a TiCDC value schema this verifier can follow.
        self.error = error
        self.read_values = _values_reader([column.name for column in self.columns])
        self.timestamp_columns = tuple(
            position for position, column in enumerate(self.columns) if column.renderings is not None
        )

    def checksum(self, value: Mapping[str, Any]) -> int:
        """The CRC of the row `value`; one of BAD_VALUE_ERRORS when a column cannot be hashed."""
        return _crc32(b"".join(map(_call, self.encoders, self.read_values(value))))


def _values_reader(names: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    # itemgetter reads every column in one C call, but returns a bare value for one name.
    if len(names) > 1:
        return itemgetter(*names)
    if len(names) == 1:
        name = names[0]
        return lambda value: (value[name],)
    return lambda value: ()


class AvroChecksumVerifier:
    """Verifies TiCDC Avro value records, with per-schema plans kept in memory.

    `time_zone` is the TiCDC server's zone (`cdc server --tz`), in which Avro TIMESTAMP values
    are rendered; `timestamp_mode` says whether the checksum covers their UTC rendering (TiCDC
    v7.1.4+, v7.5.2+, v8+) or the text as sent (earlier). Writer schemas are treated as
    immutable: a plan is cached per schema object (and shared between equal schemas).
    """

    def __init__(
        self,
        *,
        time_zone: str = "UTC",
        timestamp_mode: TimestampMode | str = TimestampMode.UTC,
        max_plans: int = _DEFAULT_MAX_PLANS,
    ) -> None:
        self.time_zone = time_zone
        self.timestamp_mode = parse_timestamp_mode(timestamp_mode)
        zone = load_zone(time_zone)
        self._renderings = (
            UtcRenderings(zone) if self.timestamp_mode is TimestampMode.UTC and not is_utc(zone) else None
        )
        self._max_plans = max_plans
        self._plans_by_identity: dict[int, tuple[object, AvroRowPlan]] = {}
        self._plans_by_fingerprint: dict[str, AvroRowPlan] = {}

    # Plans -----------------------------------------------------------------------------------

    def plan(self, writer_schema: Mapping[str, Any] | str) -> AvroRowPlan:
        """The checksum plan of `writer_schema` (a dict, fastavro-parsed or not, or its JSON text)."""
        entry = self._plans_by_identity.get(id(writer_schema))
        if entry is not None and entry[0] is writer_schema:
            return entry[1]
        fingerprint = _fingerprint(writer_schema)
        plan = self._plans_by_fingerprint.get(fingerprint) if fingerprint is not None else None
        if plan is None:
            plan = self._build_plan(writer_schema)
            if fingerprint is not None:
                if len(self._plans_by_fingerprint) >= self._max_plans:
                    self._plans_by_fingerprint.clear()
                self._plans_by_fingerprint[fingerprint] = plan
        if len(self._plans_by_identity) >= self._max_plans:
            self._plans_by_identity.clear()
        # The schema is kept with its plan so that its id cannot be reused while cached.
        self._plans_by_identity[id(writer_schema)] = (writer_schema, plan)
        return plan

    def _build_plan(self, writer_schema: object) -> AvroRowPlan:
        schema = writer_schema
        if isinstance(schema, str | bytes):
            try:
                schema = parse_json(schema)
            except UntrustedJSONError as bad:
                return AvroRowPlan(None, (), f"writer schema is not JSON: {bad}")
        if not isinstance(schema, Mapping) or schema.get("type") != "record":
            return AvroRowPlan(None, (), "writer schema is not an Avro record")
        table = _table_name(schema)
        fields = schema.get("fields")
        if not isinstance(fields, list) or not all(isinstance(f, Mapping) for f in fields):
            return AvroRowPlan(table, (), "writer schema has no list of fields")
        names = [f.get("name") for f in fields]
        if CHECKSUM_FIELD in names and OP_FIELD not in names:
            return AvroRowPlan(table, (), f"{CHECKSUM_FIELD} without the {OP_FIELD} field that ends the columns")
        columns: list[AvroColumn] = []
        # The columns are the fields before the extension fields, which start at _tidb_op.
        for avro_field in fields:
            name = avro_field.get("name")
            if name == OP_FIELD:
                break
            if not isinstance(name, str):
                return AvroRowPlan(table, (), "a field has no name")
            try:
                columns.append(self._column(name, avro_field.get("type")))
            except ValueError as bad:
                return AvroRowPlan(table, (), f"column {preview(name)}: {bad}")
        return AvroRowPlan(table, columns)

    def _column(self, name: str, field_type: object) -> AvroColumn:
        avro_type, parameters, logical_type, nullable = _column_type(field_type)
        tidb_type = parameters.get("tidb_type")
        if not isinstance(tidb_type, str):
            raise ValueError("no connect.parameters.tidb_type")
        kind = tidb_type.upper()
        if logical_type is not None:
            if kind == "DECIMAL":
                raise ValueError(
                    "DECIMAL sent as an Avro decimal (avro-decimal-handling-mode=precise) cannot be verified: "
                    "TiCDC hashes its text"
                )
            raise ValueError(f"unexpected logicalType {preview(logical_type)} for {preview(tidb_type)}")
        if kind == "TIMESTAMP" and avro_type == "string":
            if self._renderings is None:
                return AvroColumn(name, tidb_type, encode_text, nullable)
            return AvroColumn(name, tidb_type, self._renderings.__getitem__, nullable, self._renderings)
        encode = _encoder(kind, avro_type, parameters)
        if encode is None:
            raise ValueError(
                f"tidb_type {preview(tidb_type)} with Avro type {preview(avro_type)} is not a TiCDC column"
            )
        return AvroColumn(name, tidb_type, encode, nullable)

    def checksum(self, value: Mapping[str, Any], writer_schema: Mapping[str, Any] | str) -> int:
        """The checksum TiCDC computes for `value` (its reading of TIMESTAMPs); ValueError naming
        the column when the row cannot be hashed. For producers of test data and for tools.
        """
        plan = self.plan(writer_schema)
        if plan.error is not None:
            raise ValueError(plan.error)
        try:
            return plan.checksum(value)
        except BAD_VALUE_ERRORS:
            raise ValueError(_diagnose(plan, value)) from None

    # Verification ----------------------------------------------------------------------------

    def verify(
        self,
        value: Mapping[str, Any] | None,
        writer_schema: Mapping[str, Any] | str | None,
        *,
        key: Mapping[str, object] | None = None,
    ) -> ChecksumResult:
        """The verdict on one Avro value record (None: a tombstone).

        `key` is the decoded key record (the handle-key columns), reported with the verdict.
        Never raises on a bad value or schema: those are MALFORMED verdicts.
        """
        key_columns = NO_KEY if key is None else key
        if writer_schema is None:
            plan = None
        else:
            entry = self._plans_by_identity.get(id(writer_schema))
            plan = entry[1] if entry is not None and entry[0] is writer_schema else self.plan(writer_schema)
        table = None if plan is None else plan.table
        if value is None:
            return _ChecksumResult(
                _SKIPPED, None, None, table, key_columns, None, "tombstone (DELETE)", _CURRENT, SkipReason.TOMBSTONE
            )
        if value.__class__ is not dict and not isinstance(value, Mapping):
            return _malformed(f"value is a {type(value).__name__}, not a decoded Avro record", table, key_columns)
        get = value.get
        commit_ts = get(COMMIT_TS_FIELD)
        if commit_ts.__class__ is not int:
            commit_ts = None
        corrupted = get(CORRUPTED_FIELD, False)
        raw_expected = get(CHECKSUM_FIELD)
        if corrupted is not False:
            if corrupted is True:
                return self._corrupted(value, plan, raw_expected, key_columns, commit_ts)
            return _malformed(
                f"{CORRUPTED_FIELD} is {describe_value(corrupted)}, not a boolean", table, key_columns, commit_ts
            )
        # The common case inline: the decimal digits of a uint32.
        if (
            raw_expected.__class__ is str
            and len(raw_expected) <= 10
            and raw_expected.isdigit()
            and raw_expected.isascii()
        ):
            expected = int(raw_expected)
            if expected > UINT32_MAX:
                return _malformed(
                    f"{CHECKSUM_FIELD} {preview(raw_expected)} is outside the uint32 range",
                    table,
                    key_columns,
                    commit_ts,
                )
        else:
            try:
                parsed = parse_expected(raw_expected)
            except ValueError as bad:
                return _malformed(f"{CHECKSUM_FIELD}: {bad}", table, key_columns, commit_ts)
            if parsed is None:
                return _skipped(SkipReason.CHECKSUM_ABSENT, table, key_columns, commit_ts)
            expected = parsed
        if expected == 0:
            return _skipped(SkipReason.CHECKSUM_ZERO, table, key_columns, commit_ts, expected)
        if plan is None:
            return _malformed("no writer schema for a value record", table, key_columns, commit_ts, expected)
        if plan.error is not None:
            return _malformed(plan.error, table, key_columns, commit_ts, expected)
        try:
            # plan.checksum, inline: this is the hot path.
            computed = _crc32(b"".join(map(_call, plan.encoders, plan.read_values(value))))
        except BAD_VALUE_ERRORS:
            return _malformed(_diagnose(plan, value), table, key_columns, commit_ts, expected)
        if computed == expected:
            detail = ""
            if plan.timestamp_columns and self._renderings is not None and self._renderings.ambiguous:
                detail = _ambiguity_note(plan, value)
            return _ChecksumResult(_OK, expected, computed, table, key_columns, commit_ts, detail)
        return self._mismatch(plan, value, expected, computed, key_columns, commit_ts)

    def _corrupted(
        self,
        value: Mapping[str, Any],
        plan: AvroRowPlan | None,
        raw_expected: object,
        key: Mapping[str, object],
        commit_ts: int | None,
    ) -> ChecksumResult:
        # The verdict stands whatever the recomputation gives; both figures are reported if known.
        try:
            expected = parse_expected(raw_expected)
        except ValueError:
            expected = None
        computed = None
        if plan is not None and plan.error is None:
            try:
                computed = plan.checksum(value)
            except BAD_VALUE_ERRORS:
                computed = None
        return ChecksumResult(
            ChecksumVerdict.CORRUPTED_FLAG,
            expected,
            computed,
            None if plan is None else plan.table,
            key,
            commit_ts,
            "TiCDC found the row inconsistent with TiDB's checksum before sending it",
        )

    def _mismatch(
        self,
        plan: AvroRowPlan,
        value: Mapping[str, Any],
        expected: int,
        computed: int,
        key: Mapping[str, object],
        commit_ts: int | None,
    ) -> ChecksumResult:
        if plan.timestamp_columns and self._renderings is not None:
            matched = _match_other_readings(plan, value, expected)
            if matched is not None:
                return ChecksumResult(_OK, expected, expected, plan.table, key, commit_ts, matched)
        detail = f"checksum mismatch over {len(plan.columns)} columns: carried {expected}, recomputed {computed}"
        return ChecksumResult(_MISMATCH, expected, computed, plan.table, key, commit_ts, detail)


def _malformed(
    detail: str,
    table: str | None,
    key: Mapping[str, object],
    commit_ts: int | None = None,
    expected: int | None = None,
) -> ChecksumResult:
    return ChecksumResult(_MALFORMED, expected, None, table, key, commit_ts, detail)


def _skipped(
    reason: SkipReason,
    table: str | None,
    key: Mapping[str, object],
    commit_ts: int | None,
    expected: int | None = None,
) -> ChecksumResult:
    return ChecksumResult(_SKIPPED, expected, None, table, key, commit_ts, reason.value, _CURRENT, reason)


def _diagnose(plan: AvroRowPlan, value: Mapping[str, Any]) -> str:
    # The slow path after an encoder raised: find the first column that cannot be encoded.
    for column in plan.columns:
        if column.name not in value:
            return f"column {preview(column.name)} ({column.tidb_type}) is missing from the value record"
        item = value[column.name]
        if item is None:
            if column.nullable:
                continue
            return f"column {preview(column.name)} ({column.tidb_type}) is NULL but its schema type is not nullable"
        try:
            column.encode(item)
        except BAD_VALUE_ERRORS as bad:
            return f"column {preview(column.name)} ({column.tidb_type}): cannot hash {describe_value(item)}: {preview(bad)}"
    return "the value record cannot be hashed"


def _ambiguous_columns(plan: AvroRowPlan, value: Mapping[str, Any]) -> list[tuple[int, bytes]]:
    values = plan.read_values(value)
    others: list[tuple[int, bytes]] = []
    for position in plan.timestamp_columns:
        renderings = plan.columns[position].renderings
        text = values[position]
        if renderings is None or text is None:
            continue
        other = renderings.other_reading(text)
        if other is not None:
            others.append((position, other))
    return others


def _ambiguity_note(plan: AvroRowPlan, value: Mapping[str, Any]) -> str:
    values = plan.read_values(value)
    names = []
    for position in plan.timestamp_columns:
        renderings = plan.columns[position].renderings
        text = values[position]
        if renderings is not None and text is not None and text in renderings.ambiguous:
            names.append(plan.columns[position].name)
    if not names:
        return ""
    return f"TIMESTAMP {', '.join(names)} in a repeated hour: matched under TiCDC's reading"


def _match_other_readings(plan: AvroRowPlan, value: Mapping[str, Any], expected: int) -> str | None:
    others = _ambiguous_columns(plan, value)
    if not others:
        return None
    parts = list(map(_call, plan.encoders, plan.read_values(value)))
    used = match_with_alternatives(parts, others, expected)
    if used is None:
        return None
    names = ", ".join(plan.columns[position].name for position in used)
    return f"TIMESTAMP {names} in a repeated hour: matched under the other reading"


def _column_type(field_type: object) -> tuple[str, Mapping[str, Any], str | None, bool]:
    # A NOT NULL column is {"type": ..., "connect.parameters": ...}; a nullable one a union of
    # that object with "null", in either order.
    branches = field_type if isinstance(field_type, list) else [field_type]
    objects = [branch for branch in branches if isinstance(branch, Mapping)]
    others = [branch for branch in branches if not isinstance(branch, Mapping) and branch != "null"]
    if len(objects) != 1 or others:
        raise ValueError(f"type {describe_value(field_type)} is not a TiCDC column type")
    column_type = objects[0]
    avro_type = column_type.get("type")
    parameters = column_type.get("connect.parameters")
    if not isinstance(avro_type, str):
        raise ValueError(f"type {describe_value(field_type)} is not a TiCDC column type")
    if not isinstance(parameters, Mapping):
        raise ValueError("no connect.parameters")
    logical_type = column_type.get("logicalType")
    nullable = "null" in branches
    return avro_type, parameters, logical_type if isinstance(logical_type, str) else None, nullable


_INTEGER: Final[Mapping[str, Encoder]] = {"int": encode_int64, "long": encode_int64}
_STRING: Final[Mapping[str, Encoder]] = {"string": encode_text, "bytes": encode_bytes}

# tidb_type -> Avro type -> encoder, for every type but ENUM, SET and TIMESTAMP (which depend on
# the schema's members and the verifier's zone).
_ENCODERS: Final[Mapping[str, Mapping[str, Encoder]]] = {
    "INT": _INTEGER,
    "INT UNSIGNED": _INTEGER,
    "BIGINT": _INTEGER,
    "YEAR": _INTEGER,
    # avro-bigint-unsigned-handling-mode: "string" (required for checksums) or "long".
    "BIGINT UNSIGNED": {"string": encode_unsigned_text, "long": encode_unsigned_long},
    # fastavro decodes an Avro float to its exact double: nothing to round.
    "FLOAT": {"float": encode_double},
    "DOUBLE": {"double": encode_double},
    "DECIMAL": _STRING,
    "TEXT": _STRING,
    "BLOB": _STRING,
    "DATE": _STRING,
    "DATETIME": _STRING,
    "TIME": _STRING,
    "JSON": _STRING,
    "BIT": {"bytes": encode_bit_bytes, "long": encode_unsigned_long},
    "TIDBVECTORFLOAT32": {"string": encode_vector_text},
    "GEOMETRY": {"bytes": encode_nothing, "string": encode_nothing},
}


def _encoder(kind: str, avro_type: str, parameters: Mapping[str, Any]) -> Encoder | None:
    if kind in ("ENUM", "SET"):
        allowed = parameters.get("allowed")
        if avro_type != "string" or not isinstance(allowed, str):
            return None
        members = parse_allowed(allowed)
        return (EnumIndex(members) if kind == "ENUM" else SetMask(members)).__getitem__
    return _ENCODERS.get(kind, {}).get(avro_type)


def _table_name(schema: Mapping[str, Any]) -> str | None:
    # TiCDC names the record after the table, in namespace "<changefeed namespace>.<database>";
    # fastavro's parse_schema folds the namespace into the name.
    name = schema.get("name")
    if not isinstance(name, str):
        return None
    namespace = schema.get("namespace")
    if "." in name:
        namespace, name = name.rsplit(".", 1)
    if not isinstance(namespace, str) or not namespace:
        return name
    database = namespace.split(".", 1)[1] if "." in namespace else namespace
    return f"{database}.{name}"


def _fingerprint(writer_schema: object) -> str | None:
    if isinstance(writer_schema, str):
        return writer_schema
    if not isinstance(writer_schema, Mapping):
        return None
    try:
        return json.dumps(
            [writer_schema.get("name"), writer_schema.get("namespace"), writer_schema.get("fields")],
            sort_keys=True,
            default=repr,
        )
    except (TypeError, ValueError, RecursionError):
        return None


_verifiers: dict[tuple[str, TimestampMode], AvroChecksumVerifier] = {}


def verify_avro(
    value: Mapping[str, Any] | None,
    writer_schema: Mapping[str, Any] | str | None,
    *,
    time_zone: str = "UTC",
    timestamp_mode: TimestampMode | str = TimestampMode.UTC,
    key: Mapping[str, object] | None = None,
) -> ChecksumResult:
    """The verdict on one TiCDC Avro value record decoded with `writer_schema` (None: tombstone).

    `time_zone` is the TiCDC server's zone; ValueError for an unknown zone or mode (settings,
    not message data). Plans are cached per (zone, mode) in a module-level verifier; a worker
    may as well hold its own `AvroChecksumVerifier`.
    """
    mode = parse_timestamp_mode(timestamp_mode)
    verifier = _verifiers.get((time_zone, mode))
    if verifier is None:
        verifier = _verifiers[(time_zone, mode)] = AvroChecksumVerifier(time_zone=time_zone, timestamp_mode=mode)
    return verifier.verify(value, writer_schema, key=key)
