"""kdiv's table values: the state codec's Avro bodies in Confluent's wire format.

Pure. Values are written with the schema id the worker registered under its changelog
subject, and read with whichever registered schema wrote them (`writer_schemas`, filled by
the worker from the registry before it loads state), resolved into the current schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import fastavro

from kdiv.div.ledger import KeyValidation
from kdiv.div.segment import Segment
from kdiv.div.validator import PartitionValidation
from kdiv.state.codec import (
    LOCAL_STATE_SCHEMA_ID,
    LOCAL_STATE_SCHEMAS,
    PACKED_KEY_VALIDATION_BRANCH,
    PRODUCER_STATE_PACKED_NAME,
    STATE_SCHEMA,
    STATE_SCHEMA_JSON,
    StateDecodeError,
    decode_state,
    encode_key_validation,
    encode_packed_segment,
    encode_partition,
    packed_segment_of,
)
from kdiv.state.framing import FramingError, frame, unframe
from kdiv.untrusted import parse_json, preview

_LOCAL_WRITERS: dict[int, object] = {
    schema_id: fastavro.parse_schema(json.loads(text)) for schema_id, text in LOCAL_STATE_SCHEMAS.items()
}


def changelog_subject(changelog_topic: str) -> str:
    """The subject a TopicNameStrategy serializer of the changelog's values uses."""
    return f"{changelog_topic}-value"


class StateValues:
    def __init__(self, schema_id: int, writer_schemas: Mapping[int, object] | None = None) -> None:
        self.schema_id = schema_id
        # kdiv's own versions first (ids no registry hands out), then the registry's.
        self._writers: dict[int, object] = {
            **_LOCAL_WRITERS,
            schema_id: STATE_SCHEMA,
            **(writer_schemas or {}),
        }
        self._packed_key_validation_prefix: bytes | None = None  # made at the first use
        # Writer schemas whose union has the packed producer state where the current one has it.
        self._packed_producers: dict[int, bool] = {}

    @classmethod
    def unregistered(cls) -> StateValues:
        """Values framed with kdiv's own id of the current schema, which no registry hands
        out: for a worker without a registry, and state that never leaves the process."""
        return cls(LOCAL_STATE_SCHEMA_ID)

    def use(self, schema_id: int) -> None:
        """Write with `schema_id` from now on (the id the registry gave the state schema)."""
        self.schema_id = schema_id
        self._writers[schema_id] = STATE_SCHEMA
        self._packed_key_validation_prefix = None

    def knows(self, schema_id: int) -> bool:
        return schema_id in self._writers

    def add_writer_schema(self, schema_id: int, schema_text: str) -> None:
        """Learn a schema fetched from the registry; StateDecodeError if it is not Avro."""
        try:
            self._writers[schema_id] = fastavro.parse_schema(parse_json(schema_text))
        except Exception as bad:  # noqa: BLE001 - json and fastavro raise several types
            raise StateDecodeError(f"schema id {schema_id} is not a usable Avro schema: {preview(bad)}") from None

    def encode(self, state: Segment | PartitionValidation | KeyValidation) -> bytes:
        if isinstance(state, Segment):
            body = encode_packed_segment(state.pack())
        elif isinstance(state, KeyValidation):
            body = encode_key_validation(state)
        else:
            body = encode_partition(state)
        return frame(self.schema_id, body)

    def encode_packed_key_validation(self, packed: bytes) -> bytes:
        """The value of a key ledger entry already packed (`kdiv.div.ledger.pack_key_validation`)."""
        prefix = self._packed_key_validation_prefix
        if prefix is None:
            prefix = self._packed_key_validation_prefix = frame(self.schema_id, PACKED_KEY_VALIDATION_BRANCH)
        return prefix + packed

    def encode_packed_producer(self, packed: bytes) -> bytes:
        """The value of a producer state already packed (`Segment.pack`)."""
        return frame(self.schema_id, encode_packed_segment(packed))

    def packed_producer(self, raw: bytes) -> bytes:
        """A producer state value as `Segment.pack` gives it: by slicing where it was written
        packed under a known schema, else decoded and packed; StateDecodeError otherwise."""
        schema_id, body, writer = self._unframed(raw)
        packs = self._packed_producers.get(schema_id)
        if packs is None:
            packs = self._packed_producers[schema_id] = _has_packed_producers(writer)
        if packs:
            packed = packed_segment_of(body)
            if packed is not None:
                return packed
        state = decode_state(body, writer)
        if not isinstance(state, Segment):
            raise StateDecodeError(f"holds a {type(state).__name__}, not a producer's state")
        return state.pack()

    def decode(self, raw: bytes) -> Segment | PartitionValidation | KeyValidation:
        _, body, writer = self._unframed(raw)
        return decode_state(body, writer)

    def _unframed(self, raw: bytes) -> tuple[int, bytes, object]:
        """(schema id, body, its writer schema); StateDecodeError for a value not framed, or
        framed with an id the registry did not give."""
        try:
            schema_id, body = unframe(raw)
        except FramingError as bad:
            raise StateDecodeError(f"state value is not framed: {bad}") from None
        writer = self._writers.get(schema_id)
        if writer is None:
            raise StateDecodeError(f"state value has schema id {schema_id}, which the registry did not give")
        return schema_id, body, writer


def _has_packed_producers(writer: object) -> bool:
    """Whether a (parsed) writer schema's union has the packed producer state as the current
    schema has it, fifth (`PACKED_PRODUCER_STATE_BRANCH`), so its bodies may be sliced."""
    if not isinstance(writer, list) or len(writer) < 5 or not isinstance(writer[4], dict):
        return False
    branch = writer[4]
    fields = branch.get("fields")
    return (
        branch.get("name") == PRODUCER_STATE_PACKED_NAME
        and isinstance(fields, list)
        and len(fields) == 1
        and fields[0].get("name") == "entry"
        and fields[0].get("type") == "bytes"
    )


__all__ = ["STATE_SCHEMA_JSON", "StateValues", "changelog_subject"]
