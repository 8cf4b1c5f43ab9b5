"""Versioned Avro encoding of one producer's segment state (Venice's ProducerPartitionState).

Unlike Venice's checkpoint, which drops `newSegment` and reopens a finalised checksum, the
encoding is lossless: a tracker restored from it behaves exactly as the one that was saved,
so a restarted worker neither raises a false alarm nor misses a fault.

A value is one version byte followed by the schemaless Avro body of that version; old
versions are read through Avro schema resolution into the current one.
"""

from __future__ import annotations

import io

import fastavro

from .segment import Segment
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

CURRENT_VERSION = 1
_SCHEMAS = {1: PRODUCER_STATE_V1}
_CURRENT = _SCHEMAS[CURRENT_VERSION]
_SIGN = 1 << 63
_WRAP = 1 << 64


class StateDecodeError(ValueError):
    pass


def encode_segment(segment: Segment) -> bytes:
    checksum = segment.checksum
    if checksum is not None and checksum >= _SIGN:
        checksum -= _WRAP
    out = io.BytesIO()
    out.write(bytes((CURRENT_VERSION,)))
    fastavro.schemaless_writer(
        out,
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
    return out.getvalue()


def decode_segment(raw: bytes) -> Segment:
    if not raw:
        raise StateDecodeError("empty producer state")
    version = raw[0]
    writer_schema = _SCHEMAS.get(version)
    if writer_schema is None:
        raise StateDecodeError(f"producer state version {version} is unknown (known: {sorted(_SCHEMAS)})")
    try:
        fields = fastavro.schemaless_reader(io.BytesIO(raw[1:]), writer_schema, _CURRENT)
    except Exception as bad:  # fastavro raises several types for truncated or garbled bodies
        raise StateDecodeError(f"producer state v{version} does not decode: {bad}") from bad
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
