"""A Schema Registry's state as its `_schemas` log holds it (the development registry's store, and the
reconcile job's replay of a real registry's log).

Pure: the `_schemas` log's records come in (`apply`), and each write the REST API asks
for comes out as the records to append (`plan_*`); the server appends them, then applies
them. Records use Confluent's own format, so a real registry reads the same topic:

  key   {"keytype":"SCHEMA","subject":S,"version":V,"magic":1}
  value {"subject":S,"version":V,"id":N,"schema":"...","deleted":false}   (null: hard delete)
  key   {"keytype":"CONFIG","subject":S|null,"magic":0}
  value {"compatibilityLevel":"BACKWARD"}                                   (null: back to global)
  key   {"keytype":"DELETE_SUBJECT","subject":S,"magic":0}
  value {"subject":S,"version":V}                     (soft-deletes every version up to V)

Ids are global, and an identical schema registered under another subject gets the id it
already has. Only Avro is accepted: kdiv's state and the checks it makes are Avro.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from kdiv.untrusted import UntrustedJSONError, parse_json

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_LEVEL = "BACKWARD"


class RegistryRequestError(Exception):
    """An error the REST API answers with, in Confluent's codes."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


def subject_not_found(subject: str) -> RegistryRequestError:
    return RegistryRequestError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version) -> RegistryRequestError:
    return RegistryRequestError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(what: str = "Schema not found") -> RegistryRequestError:
    return RegistryRequestError(404, 40403, what)


@dataclass(frozen=True)
class SubjectVersion:
    schema_id: int
    deleted: bool


@dataclass
class SchemaLogState:
    schemas: dict[int, str] = field(default_factory=dict)
    # subject -> version -> (id, soft-deleted)
    subjects: dict[str, dict[int, SubjectVersion]] = field(default_factory=dict)
    # None is the global level
    levels: dict[str | None, str] = field(default_factory=dict)
    ids_by_canonical: dict[str, int] = field(default_factory=dict)
    ignored_records: int = 0

    # -- the log ---------------------------------------------------------------------------

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Replay one `_schemas` record. Records this registry does not use are counted."""
        try:
            parsed_key: Any = parse_json(key) if key else None
            # JSON from the log: its shape is checked where it is used.
            parsed_value: Any = parse_json(value) if value else None
        except UntrustedJSONError:
            self.ignored_records += 1
            return
        keytype = parsed_key.get("keytype") if isinstance(parsed_key, dict) else None
        if keytype == "SCHEMA":
            self._apply_schema(parsed_key, parsed_value)
        elif keytype == "CONFIG":
            subject = parsed_key.get("subject")
            if parsed_value is None:
                self.levels.pop(subject, None)
            else:
                self.levels[subject] = parsed_value.get("compatibilityLevel", DEFAULT_LEVEL)
        elif keytype == "DELETE_SUBJECT" and isinstance(parsed_value, dict):
            subject = parsed_value.get("subject", parsed_key.get("subject"))
            upto = parsed_value.get("version", 0)
            for version, entry in self.subjects.get(subject, {}).items():
                if version <= upto:
                    self.subjects[subject][version] = SubjectVersion(entry.schema_id, True)
        elif keytype != "NOOP":
            self.ignored_records += 1

    def _apply_schema(self, key: dict, value: dict | None) -> None:
        subject, version = key.get("subject"), key.get("version")
        if not isinstance(subject, str) or not isinstance(version, int):
            self.ignored_records += 1
            return
        if value is None:
            self.subjects.get(subject, {}).pop(version, None)
            return
        schema_id, schema = value.get("id"), value.get("schema")
        if not isinstance(schema_id, int) or not isinstance(schema, str):
            self.ignored_records += 1
            return
        self.schemas.setdefault(schema_id, schema)
        self.ids_by_canonical.setdefault(canonical(schema), schema_id)
        self.subjects.setdefault(subject, {})[version] = SubjectVersion(schema_id, bool(value.get("deleted")))

    # -- reads -----------------------------------------------------------------------------

    def live_versions(self, subject: str, *, deleted: bool = False) -> dict[int, SubjectVersion]:
        versions = {v: e for v, e in self.subjects.get(subject, {}).items() if deleted or not e.deleted}
        if not versions:
            raise subject_not_found(subject)
        return dict(sorted(versions.items()))

    def subject_names(self, *, deleted: bool = False) -> list[str]:
        return sorted(
            s
            for s, versions in self.subjects.items()
            if versions and (deleted or any(not e.deleted for e in versions.values()))
        )

    def version(self, subject: str, version: str | int) -> tuple[int, SubjectVersion]:
        versions = self.live_versions(subject)
        if version in ("latest", -1):
            number = max(versions)
        else:
            try:
                number = int(version)
            except ValueError:
                raise RegistryRequestError(
                    422, 42202, f"The specified version '{version}' is not a valid version id."
                ) from None
        if number not in versions:
            raise version_not_found(subject, version)
        return number, versions[number]

    def schema(self, schema_id: int) -> str:
        if schema_id not in self.schemas:
            raise schema_not_found(f"Schema {schema_id} not found")
        return self.schemas[schema_id]

    def versions_of_id(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        self.schema(schema_id)
        return sorted(
            (subject, version)
            for subject, versions in self.subjects.items()
            for version, entry in versions.items()
            if entry.schema_id == schema_id and (deleted or not entry.deleted)
        )

    def lookup(self, subject: str, schema: str) -> tuple[int, int]:
        """(version, id) of `schema` under `subject`."""
        wanted = canonical(schema)
        for version, entry in reversed(self.live_versions(subject).items()):
            if canonical(self.schemas[entry.schema_id]) == wanted:
                return version, entry.schema_id
        raise schema_not_found()

    def level(self, subject: str | None) -> str:
        return self.levels.get(subject) or self.levels.get(None) or DEFAULT_LEVEL

    def compatible(self, subject: str, schema: str, version: str | int = "latest") -> list[str]:
        """Why `schema` is incompatible with `subject` at its level ([] when compatible)."""
        new = parse_avro(schema)
        level = self.level(subject)
        if level == "NONE" or not self.subjects.get(subject):
            return []
        versions = self.live_versions(subject)
        if level.endswith("_TRANSITIVE"):
            against = [versions[v].schema_id for v in versions]
        elif version in ("latest", -1):
            against = [versions[max(versions)].schema_id]
        else:
            against = [self.version(subject, version)[1].schema_id]
        problems: list[str] = []
        checker = ReaderWriterCompatibilityChecker()
        for schema_id in against:
            old = parse_avro(self.schemas[schema_id])
            pairs = []
            if level.startswith(("BACKWARD", "FULL")):
                pairs.append(("new schema reads", new, old))
            if level.startswith(("FORWARD", "FULL")):
                pairs.append(("old schema reads", old, new))
            for what, reader, writer in pairs:
                result = checker.get_compatibility(reader, writer)
                if result.compatibility is not SchemaCompatibilityType.compatible:
                    problems.append(f"{what} id {schema_id}: {'; '.join(sorted(map(str, result.messages)))}")
        return problems

    # -- writes: the records to append -----------------------------------------------------

    def plan_register(self, subject: str, schema: str) -> tuple[int, list[tuple[dict, dict | None]]]:
        """(id, records): [] when the schema is already registered under the subject."""
        parse_avro(schema)
        try:
            return self.lookup(subject, schema)[1], []
        except RegistryRequestError as missing:
            if missing.status != 404:
                raise
        problems = self.compatible(subject, schema)
        if problems:
            raise RegistryRequestError(
                409,
                409,
                f"Schema being registered is incompatible with an earlier schema for subject '{subject}': {problems}",
            )
        schema_id = self.ids_by_canonical.get(canonical(schema), max(self.schemas, default=0) + 1)
        version = max(self.subjects.get(subject, {}), default=0) + 1
        key = {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}
        value = {"subject": subject, "version": version, "id": schema_id, "schema": schema, "deleted": False}
        return schema_id, [(key, value)]

    def plan_level(self, subject: str | None, level: str | None) -> list[tuple[dict, dict | None]]:
        if level is not None and level not in LEVELS:
            raise RegistryRequestError(422, 42203, f"Invalid compatibility level {level!r}; valid: {', '.join(LEVELS)}")
        key = {"keytype": "CONFIG", "subject": subject, "magic": 0}
        return [(key, None if level is None else {"compatibilityLevel": level})]

    def plan_delete_subject(self, subject: str, *, permanent: bool) -> tuple[list[int], list[tuple[dict, dict | None]]]:
        if permanent:
            versions = self.subjects.get(subject, {})
            if not versions:
                raise subject_not_found(subject)
            if any(not e.deleted for e in versions.values()):
                raise RegistryRequestError(
                    404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
                )
            records: list[tuple[dict, dict | None]] = [
                ({"keytype": "SCHEMA", "subject": subject, "version": v, "magic": 1}, None) for v in sorted(versions)
            ]
            return sorted(versions), records
        live = self.live_versions(subject)
        key = {"keytype": "DELETE_SUBJECT", "subject": subject, "magic": 0}
        return sorted(live), [(key, {"subject": subject, "version": max(live)})]


def parse_avro(schema: str) -> avro.schema.Schema:
    try:
        return avro.schema.parse(schema)
    except (avro.errors.AvroException, ValueError, TypeError) as bad:
        raise RegistryRequestError(422, 42201, f"Invalid schema: {bad}") from None


def canonical(schema: str) -> str:
    """Schema text with formatting and object key order removed; field order is kept."""
    try:
        return json.dumps(parse_json(schema), sort_keys=True, separators=(",", ":"))
    except UntrustedJSONError:
        return schema.strip()


def encode_record(key: dict, value: dict | None) -> tuple[bytes, bytes | None]:
    """A `_schemas` record's bytes, as Confluent writes them (compact JSON)."""
    compact = (",", ":")
    return json.dumps(key, separators=compact).encode(), None if value is None else json.dumps(
        value, separators=compact
    ).encode()
