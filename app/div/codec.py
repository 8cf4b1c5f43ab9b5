"""Versioned Avro encoding of validator state: one producer's segment state (Venice's
ProducerPartitionState) and one partition's push phase and counters.

Unlike Venice's checkpoint, which drops `newSegment` and reopens a finalised checksum, the
encoding is lossless: a tracker restored from it behaves exactly as the one that was saved,
so a restarted worker neither raises a false alarm nor misses a fault.

A value is one version byte followed by the schemaless Avro body of that version; old
versions are read through Avro schema resolution into the current one.
"""

from __future__ import annotations

import io

import fastavro

from .faults import Verdict
from .segment import Segment
from .validator import PartitionValidation
from .wire import ChecksumType

PRODUCER_STATE_V1 = fastavro.parse_schema(
    {
        "type": "record",
        "name": "ProducerPartitionState",
        "namespace": "kdiv.state",
        "fields": [
            {"name": "segmentNumber", "type": "long"},
            {"name": "sequenceNumber", "type": "long"},
            {"name": "checksumType", "type": "int"},
            # ADHASH running sum as a signed 64-bit long (two's complement of the unsigned sum).
            {"name": "checksum", "type": ["null", "long"], "default": None},
            {"name": "checksumFinalized", "type": "boolean", "default": False},
            {"name": "registered", "type": "boolean", "default": False},
            {"name": "started", "type": "boolean", "default": False},
            {"name": "ended", "type": "boolean", "default": False},
            {"name": "finalSegment", "type": "boolean", "default": False},
            {"name": "newSegment", "type": "boolean", "default": False},
            {"name": "lastOffset", "type": "long", "default": -1},
            {"name": "lastProducerTimestamp", "type": "long", "default": -1},
        ],
    }
)

PARTITION_STATE_V1 = fastavro.parse_schema(
    {
        "type": "record",
        "name": "PartitionState",
        "namespace": "kdiv.state",
        "fields": [
            {"name": "inPush", "type": "boolean"},
            {"name": "pushFailed", "type": "boolean", "default": False},
            {"name": "lastOffset", "type": "long", "default": -1},
            {"name": "records", "type": "long", "default": 0},
            # Verdict name -> count, for verdicts other than OK.
            {"name": "verdictCounts", "type": {"type": "map", "values": "long"}, "default": {}},
            {"name": "checkpointAnchorMs", "type": "long", "default": -1},
        ],
    }
)

CURRENT_VERSION = 1
_SCHEMAS = {1: PRODUCER_STATE_V1}
_CURRENT = _SCHEMAS[CURRENT_VERSION]
_PARTITION_SCHEMAS = {1: PARTITION_STATE_V1}
_PARTITION_CURRENT = _PARTITION_SCHEMAS[CURRENT_VERSION]
_SIGN = 1 << 63
_WRAP = 1 << 64


class StateDecodeError(ValueError):
    pass


def _write(schema, fields: dict) -> bytes:
    out = io.BytesIO()
    out.write(bytes((CURRENT_VERSION,)))
    fastavro.schemaless_writer(out, schema, fields)
    return out.getvalue()


def _read(raw: bytes, schemas: dict, current, what: str) -> dict:
    if not raw:
        raise StateDecodeError(f"empty {what}")
    version = raw[0]
    writer_schema = schemas.get(version)
    if writer_schema is None:
        raise StateDecodeError(f"{what} version {version} is unknown (known: {sorted(schemas)})")
    try:
        return fastavro.schemaless_reader(io.BytesIO(raw[1:]), writer_schema, current)
    except Exception as bad:  # fastavro raises several types for truncated or garbled bodies
        raise StateDecodeError(f"{what} v{version} does not decode: {bad}") from bad


def encode_segment(segment: Segment) -> bytes:
    checksum = segment.checksum
    if checksum is not None and checksum >= _SIGN:
        checksum -= _WRAP
    return _write(
        _CURRENT,
        {
            "segmentNumber": segment.segment_number,
            "sequenceNumber": segment.sequence_number,
            "checksumType": int(segment.checksum_type),
            "checksum": checksum,
            "checksumFinalized": segment.checksum_finalized,
            "registered": segment.registered,
            "started": segment.started,
            "ended": segment.ended,
            "finalSegment": segment.final_segment,
            "newSegment": segment.new_segment,
            "lastOffset": segment.last_offset,
            "lastProducerTimestamp": segment.last_producer_ts,
        },
    )


def decode_segment(raw: bytes) -> Segment:
    fields = _read(raw, _SCHEMAS, _CURRENT, "producer state")
    try:
        ctype = ChecksumType(fields["checksumType"])
    except ValueError as bad:
        raise StateDecodeError(f"producer state has unknown checksum type {fields['checksumType']}") from bad
    segment = Segment(fields["segmentNumber"], fields["sequenceNumber"], ctype)
    checksum = fields["checksum"]
    segment.checksum = None if checksum is None else checksum % _WRAP
    segment.checksum_finalized = fields["checksumFinalized"]
    segment.registered = fields["registered"]
    segment.started = fields["started"]
    segment.ended = fields["ended"]
    segment.final_segment = fields["finalSegment"]
    segment.new_segment = fields["newSegment"]
    segment.last_offset = fields["lastOffset"]
    segment.last_producer_ts = fields["lastProducerTimestamp"]
    return segment


def encode_partition(state: PartitionValidation) -> bytes:
    """The partition's phase and counters; its producers are saved one key each."""
    return _write(
        _PARTITION_CURRENT,
        {
            "inPush": state.in_push,
            "pushFailed": state.push_failed,
            "lastOffset": state.last_offset,
            "records": state.records,
            "verdictCounts": {v.value: n for v, n in state.verdict_counts.items()},
            "checkpointAnchorMs": state.checkpoint_anchor_ms,
        },
    )


def decode_partition(raw: bytes) -> PartitionValidation:
    """A PartitionValidation with an empty tracker: restore its producers with decode_segment."""
    fields = _read(raw, _PARTITION_SCHEMAS, _PARTITION_CURRENT, "partition state")
    try:
        counts = {Verdict(name): n for name, n in fields["verdictCounts"].items()}
    except ValueError as bad:
        raise StateDecodeError(f"partition state counts an unknown verdict: {bad}") from bad
    return PartitionValidation(
        in_push=fields["inPush"],
        push_failed=fields["pushFailed"],
        last_offset=fields["lastOffset"],
        records=fields["records"],
        verdict_counts=counts,
        checkpoint_anchor_ms=fields["checkpointAnchorMs"],
    )
