"""Avro encoding of validator state: one producer's segment state (Venice's
ProducerPartitionState) and one partition's push phase and counters.

Unlike Venice's checkpoint, which drops `newSegment` and reopens a finalised checksum, the
encoding is lossless: a tracker restored from it behaves exactly as the one that was saved,
so a restarted worker neither raises a false alarm nor misses a fault.

A value is the schemaless Avro body of `STATE_SCHEMA`; framing it with a registered
schema id (Confluent's wire format) is `kdiv.state.values`'s job.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro

from kdiv.div.exact import Gap, GapLog, ring_bytes, ring_of
from kdiv.div.faults import Verdict
from kdiv.div.ledger import PACKED_SIZE, KeyValidation, pack_key_validation, unpack_key_validation
from kdiv.div.segment import Segment
from kdiv.div.validator import PartitionValidation
from kdiv.div.wire import ChecksumType
from kdiv.untrusted import preview

_PRODUCER_STATE = {
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
        {"name": "firstSeenTimestamp", "type": "long", "default": -1},
        # The partition's offset holes counted up to the producer's last record (-1: not known):
        # the evidence the compaction rule weighs a gap after it against (`kdiv.div.compaction`).
        {"name": "partitionHoles", "type": "long", "default": -1},
        # Exact semantics (`kdiv.div.exact`): the ring of recent seqs and CRCs, as little-endian
        # uint64 slots ((seq + 1) mod 2^32 << 32 | CRC32; 0 empty), and the producer's gaps.
        {"name": "recentCrcs", "type": "bytes", "default": ""},
        {
            "name": "gapLog",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "GapLog",
                    "fields": [
                        {"name": "segment", "type": "long"},
                        {"name": "high", "type": "long"},
                        {
                            "name": "gaps",
                            "type": {
                                "type": "array",
                                "items": {
                                    "type": "record",
                                    "name": "Gap",
                                    "fields": [
                                        {"name": "segment", "type": "long"},
                                        {"name": "first", "type": "long"},
                                        {"name": "last", "type": "long"},
                                        {"name": "foundOffset", "type": "long"},
                                        {"name": "foundSeq", "type": "long"},
                                        {"name": "judged", "type": "long"},
                                        {"name": "lastJudgedOffset", "type": "long"},
                                        {"name": "arrivedUnplaced", "type": "long"},
                                        {"name": "fatal", "type": "boolean", "default": False},
                                        {
                                            "name": "arrived",
                                            "type": {
                                                "type": "array",
                                                "items": {
                                                    "type": "record",
                                                    "name": "ArrivedRun",
                                                    "fields": [
                                                        {"name": "firstSeq", "type": "long"},
                                                        {"name": "lastSeq", "type": "long"},
                                                        {"name": "firstOffset", "type": "long"},
                                                        {"name": "lastOffset", "type": "long"},
                                                    ],
                                                },
                                            },
                                        },
                                        # What the offset holes said of it as compaction's
                                        # (`kdiv.div.exact.Gap.holes`).
                                        {"name": "holes", "type": "long", "default": -1},
                                    ],
                                },
                            },
                        },
                    ],
                },
            ],
            "default": None,
        },
    ],
}

_PARTITION_STATE = {
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
        {"name": "topicId", "type": ["null", "string"], "default": None},
        # Offset holes counted from `holesFrom` on (-1: from the first record validated), and
        # the gaps compaction or loss may have made that could not be told apart.
        {"name": "holes", "type": "long", "default": 0},
        {"name": "holesFrom", "type": "long", "default": -1},
        {"name": "untoldGaps", "type": "long", "default": 0},
    ],
}

_KEY_VALIDATION = {
    "type": "record",
    "name": "KeyValidation",
    "namespace": "kdiv.state",
    "fields": [
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": "long"},
        {"name": "crc", "type": "long"},
        {"name": "tombstone", "type": "boolean"},
        {"name": "producer", "type": ["null", "bytes"], "default": None},
        {"name": "segment", "type": ["null", "long"], "default": None},
        {"name": "seq", "type": ["null", "long"], "default": None},
    ],
}

# The key ledger's entries as written: the packed form (`kdiv.div.ledger.pack_key_validation`)
# in one fixed field. The ledger is written at the topic's rate; the KeyValidation record
# above stays readable for entries written before.
_KEY_VALIDATION_PACKED = {
    "type": "record",
    "name": "KeyValidationPacked",
    "namespace": "kdiv.state",
    "doc": "offset i64, timestamp i64, crc u32, flags u8 (1 tombstone, 2 producer, segment, seq "
    "present), producer 16 bytes, segment i64, seq i64; little-endian",
    "fields": [{"name": "entry", "type": {"type": "fixed", "name": "KeyValidationBytes", "size": PACKED_SIZE}}],
}

# Producer states as written: the packed form (`kdiv.div.segment.Segment.pack`) in one field.
# A million producer states are written and restored at a takeover: the packed form is
# written and read back by slicing, where the record above took an Avro encoding and decoding
# each (about 10 microseconds apiece). The record above stays readable for states written before.
_PRODUCER_STATE_PACKED = {
    "type": "record",
    "name": "ProducerStatePacked",
    "namespace": "kdiv.state",
    "doc": "segment i64, seq i64, checksum u64, last offset i64, last producer timestamp i64, first seen "
    "timestamp i64, partition holes i64, checksum type u8, flags u8 (1 finalized, 2 registered, 4 started, "
    "8 ended, 16 final segment, 32 new segment, 64 has checksum); then, under the exact semantics, the "
    "ring of recent seqs and CRCs and the gap log (kdiv.div.segment); little-endian",
    "fields": [{"name": "entry", "type": "bytes"}],
}

# Table values of every kind share one registered schema, the union of the records
# (TopicNameStrategy allows a top-level union): partition and producer state share a
# changelog, and the key ledger's changelog carries the same schema so one id serves all.
# Evolve it by adding fields with defaults or union branches; values written with an older
# registered version are read through Avro schema resolution into this one.
_BRANCHES = [_PARTITION_STATE, _PRODUCER_STATE, _KEY_VALIDATION, _KEY_VALIDATION_PACKED, _PRODUCER_STATE_PACKED]
STATE_SCHEMA_JSON = json.dumps(_BRANCHES, separators=(",", ":"))
STATE_SCHEMA = fastavro.parse_schema(_BRANCHES)
# State framed without a registry carries ids kdiv numbers itself, one per version of the
# schema: 0 was the first (before the exact semantics' fields); later versions take ids from
# 2^31 up, which Confluent's registry never hands out (its ids are positive signed 32-bit
# ints). Every version's text stays here, frozen, so state written under it is read back.
# Changing STATE_SCHEMA_JSON means adding its text here under the next id.
LOCAL_ID_BASE = 1 << 31
_STATE_SCHEMA_V1_JSON = '[{"type":"record","name":"PartitionState","namespace":"kdiv.state","fields":[{"name":"inPush","type":"boolean"},{"name":"pushFailed","type":"boolean","default":false},{"name":"lastOffset","type":"long","default":-1},{"name":"records","type":"long","default":0},{"name":"verdictCounts","type":{"type":"map","values":"long"},"default":{}},{"name":"checkpointAnchorMs","type":"long","default":-1},{"name":"topicId","type":["null","string"],"default":null}]},{"type":"record","name":"ProducerPartitionState","namespace":"kdiv.state","fields":[{"name":"segmentNumber","type":"long"},{"name":"sequenceNumber","type":"long"},{"name":"checksumType","type":"int"},{"name":"checksum","type":["null","long"],"default":null},{"name":"checksumFinalized","type":"boolean","default":false},{"name":"registered","type":"boolean","default":false},{"name":"started","type":"boolean","default":false},{"name":"ended","type":"boolean","default":false},{"name":"finalSegment","type":"boolean","default":false},{"name":"newSegment","type":"boolean","default":false},{"name":"lastOffset","type":"long","default":-1},{"name":"lastProducerTimestamp","type":"long","default":-1}]},{"type":"record","name":"KeyValidation","namespace":"kdiv.state","fields":[{"name":"offset","type":"long"},{"name":"timestamp","type":"long"},{"name":"crc","type":"long"},{"name":"tombstone","type":"boolean"},{"name":"producer","type":["null","bytes"],"default":null},{"name":"segment","type":["null","long"],"default":null},{"name":"seq","type":["null","long"],"default":null}]},{"type":"record","name":"KeyValidationPacked","namespace":"kdiv.state","doc":"offset i64, timestamp i64, crc u32, flags u8 (1 tombstone, 2 producer, segment, seq present), producer 16 bytes, segment i64, seq i64; little-endian","fields":[{"name":"entry","type":{"type":"fixed","name":"KeyValidationBytes","size":53}}]}]'
# The exact semantics' fields (the ring of recent CRCs, the gap log, the first seen timestamp).
_STATE_SCHEMA_V2_JSON = '[{"type":"record","name":"PartitionState","namespace":"kdiv.state","fields":[{"name":"inPush","type":"boolean"},{"name":"pushFailed","type":"boolean","default":false},{"name":"lastOffset","type":"long","default":-1},{"name":"records","type":"long","default":0},{"name":"verdictCounts","type":{"type":"map","values":"long"},"default":{}},{"name":"checkpointAnchorMs","type":"long","default":-1},{"name":"topicId","type":["null","string"],"default":null}]},{"type":"record","name":"ProducerPartitionState","namespace":"kdiv.state","fields":[{"name":"segmentNumber","type":"long"},{"name":"sequenceNumber","type":"long"},{"name":"checksumType","type":"int"},{"name":"checksum","type":["null","long"],"default":null},{"name":"checksumFinalized","type":"boolean","default":false},{"name":"registered","type":"boolean","default":false},{"name":"started","type":"boolean","default":false},{"name":"ended","type":"boolean","default":false},{"name":"finalSegment","type":"boolean","default":false},{"name":"newSegment","type":"boolean","default":false},{"name":"lastOffset","type":"long","default":-1},{"name":"lastProducerTimestamp","type":"long","default":-1},{"name":"firstSeenTimestamp","type":"long","default":-1},{"name":"recentCrcs","type":"bytes","default":""},{"name":"gapLog","type":["null",{"type":"record","name":"GapLog","fields":[{"name":"segment","type":"long"},{"name":"high","type":"long"},{"name":"gaps","type":{"type":"array","items":{"type":"record","name":"Gap","fields":[{"name":"segment","type":"long"},{"name":"first","type":"long"},{"name":"last","type":"long"},{"name":"foundOffset","type":"long"},{"name":"foundSeq","type":"long"},{"name":"judged","type":"long"},{"name":"lastJudgedOffset","type":"long"},{"name":"arrivedUnplaced","type":"long"},{"name":"fatal","type":"boolean","default":false},{"name":"arrived","type":{"type":"array","items":{"type":"record","name":"ArrivedRun","fields":[{"name":"firstSeq","type":"long"},{"name":"lastSeq","type":"long"},{"name":"firstOffset","type":"long"},{"name":"lastOffset","type":"long"}]}}}]}}}]}],"default":null}]},{"type":"record","name":"KeyValidation","namespace":"kdiv.state","fields":[{"name":"offset","type":"long"},{"name":"timestamp","type":"long"},{"name":"crc","type":"long"},{"name":"tombstone","type":"boolean"},{"name":"producer","type":["null","bytes"],"default":null},{"name":"segment","type":["null","long"],"default":null},{"name":"seq","type":["null","long"],"default":null}]},{"type":"record","name":"KeyValidationPacked","namespace":"kdiv.state","doc":"offset i64, timestamp i64, crc u32, flags u8 (1 tombstone, 2 producer, segment, seq present), producer 16 bytes, segment i64, seq i64; little-endian","fields":[{"name":"entry","type":{"type":"fixed","name":"KeyValidationBytes","size":53}}]}]'
# Compaction's evidence (offset holes) and the packed key ledger entries.
_STATE_SCHEMA_V3_JSON = '[{"type":"record","name":"PartitionState","namespace":"kdiv.state","fields":[{"name":"inPush","type":"boolean"},{"name":"pushFailed","type":"boolean","default":false},{"name":"lastOffset","type":"long","default":-1},{"name":"records","type":"long","default":0},{"name":"verdictCounts","type":{"type":"map","values":"long"},"default":{}},{"name":"checkpointAnchorMs","type":"long","default":-1},{"name":"topicId","type":["null","string"],"default":null},{"name":"holes","type":"long","default":0},{"name":"holesFrom","type":"long","default":-1},{"name":"untoldGaps","type":"long","default":0}]},{"type":"record","name":"ProducerPartitionState","namespace":"kdiv.state","fields":[{"name":"segmentNumber","type":"long"},{"name":"sequenceNumber","type":"long"},{"name":"checksumType","type":"int"},{"name":"checksum","type":["null","long"],"default":null},{"name":"checksumFinalized","type":"boolean","default":false},{"name":"registered","type":"boolean","default":false},{"name":"started","type":"boolean","default":false},{"name":"ended","type":"boolean","default":false},{"name":"finalSegment","type":"boolean","default":false},{"name":"newSegment","type":"boolean","default":false},{"name":"lastOffset","type":"long","default":-1},{"name":"lastProducerTimestamp","type":"long","default":-1},{"name":"firstSeenTimestamp","type":"long","default":-1},{"name":"partitionHoles","type":"long","default":-1},{"name":"recentCrcs","type":"bytes","default":""},{"name":"gapLog","type":["null",{"type":"record","name":"GapLog","fields":[{"name":"segment","type":"long"},{"name":"high","type":"long"},{"name":"gaps","type":{"type":"array","items":{"type":"record","name":"Gap","fields":[{"name":"segment","type":"long"},{"name":"first","type":"long"},{"name":"last","type":"long"},{"name":"foundOffset","type":"long"},{"name":"foundSeq","type":"long"},{"name":"judged","type":"long"},{"name":"lastJudgedOffset","type":"long"},{"name":"arrivedUnplaced","type":"long"},{"name":"fatal","type":"boolean","default":false},{"name":"arrived","type":{"type":"array","items":{"type":"record","name":"ArrivedRun","fields":[{"name":"firstSeq","type":"long"},{"name":"lastSeq","type":"long"},{"name":"firstOffset","type":"long"},{"name":"lastOffset","type":"long"}]}}},{"name":"holes","type":"long","default":-1}]}}}]}],"default":null}]},{"type":"record","name":"KeyValidation","namespace":"kdiv.state","fields":[{"name":"offset","type":"long"},{"name":"timestamp","type":"long"},{"name":"crc","type":"long"},{"name":"tombstone","type":"boolean"},{"name":"producer","type":["null","bytes"],"default":null},{"name":"segment","type":["null","long"],"default":null},{"name":"seq","type":["null","long"],"default":null}]},{"type":"record","name":"KeyValidationPacked","namespace":"kdiv.state","doc":"offset i64, timestamp i64, crc u32, flags u8 (1 tombstone, 2 producer, segment, seq present), producer 16 bytes, segment i64, seq i64; little-endian","fields":[{"name":"entry","type":{"type":"fixed","name":"KeyValidationBytes","size":53}}]}]'
LOCAL_STATE_SCHEMAS: dict[int, str] = {
    0: _STATE_SCHEMA_V1_JSON,
    LOCAL_ID_BASE + 2: _STATE_SCHEMA_V2_JSON,
    LOCAL_ID_BASE + 3: _STATE_SCHEMA_V3_JSON,
    LOCAL_ID_BASE + 4: STATE_SCHEMA_JSON,
}
LOCAL_STATE_SCHEMA_ID = LOCAL_ID_BASE + 4  # the current version's
PARTITION_STATE_NAME = "kdiv.state.PartitionState"
PRODUCER_STATE_NAME = "kdiv.state.ProducerPartitionState"
KEY_VALIDATION_NAME = "kdiv.state.KeyValidation"
KEY_VALIDATION_PACKED_NAME = "kdiv.state.KeyValidationPacked"
PRODUCER_STATE_PACKED_NAME = "kdiv.state.ProducerStatePacked"
# The Avro encoding of a packed entry: the branch's union index (3, zig-zag) and the fixed
# field's bytes as they are. Written by hand, one concatenation per entry; a test holds it
# to fastavro's own encoding.
PACKED_KEY_VALIDATION_BRANCH = b"\x06"
# A packed producer state: the branch's union index (4, zig-zag), then Avro bytes (the length,
# zig-zag varint, and the bytes). By hand too, held to fastavro's encoding by a test.
PACKED_PRODUCER_STATE_BRANCH = b"\x08"
_SIGN = 1 << 63
_WRAP = 1 << 64


class StateDecodeError(ValueError):
    pass


def _write(name: str, fields: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, STATE_SCHEMA, (name, fields))
    return out.getvalue()


def decode_state(body: bytes, writer_schema=STATE_SCHEMA) -> Segment | PartitionValidation | KeyValidation:
    """A producer's Segment, a partition's PartitionValidation or a key's KeyValidation."""
    if not body:
        raise StateDecodeError("empty state value")
    try:
        decoded: Any = fastavro.schemaless_reader(
            io.BytesIO(body), writer_schema, STATE_SCHEMA, return_record_name=True
        )
    except Exception as bad:  # fastavro raises several types for truncated or garbled bodies
        raise StateDecodeError(f"state value does not decode: {preview(bad)}") from bad
    # The reader schema is a union of named records: (record name, fields).
    name, fields = decoded
    if name == PRODUCER_STATE_NAME:
        return _segment_of(fields)
    if name == PARTITION_STATE_NAME:
        return _partition_of(fields)
    if name == KEY_VALIDATION_PACKED_NAME:
        return unpack_key_validation(fields["entry"])
    if name == PRODUCER_STATE_PACKED_NAME:
        return _unpacked_segment(fields["entry"])
    if name == KEY_VALIDATION_NAME:
        return KeyValidation(**fields)
    raise StateDecodeError(f"state value is a {name}, not a kind of kdiv state")


def _unpacked_segment(packed: bytes) -> Segment:
    try:
        return Segment.unpack(packed)
    except Exception as bad:
        raise StateDecodeError(f"packed producer state does not unpack: {preview(bad)}") from bad


def encode_packed_segment(packed: bytes) -> bytes:
    """The Avro body of a producer state already packed (`Segment.pack`)."""
    return PACKED_PRODUCER_STATE_BRANCH + _avro_long(len(packed)) + packed


def packed_segment_of(body: bytes) -> bytes | None:
    """The packed producer state in a body of the current schema's packed branch, checked as a
    state `Segment.pack` could have made; None for a body of another branch. Read by slicing:
    a takeover loads a million of them."""
    if body[:1] != PACKED_PRODUCER_STATE_BRANCH:
        return None
    length, at = _read_avro_long(body, 1)
    packed = body[at:]
    if length != len(packed):
        raise StateDecodeError(f"packed producer state of {len(packed)} bytes says it has {length}")
    if not Segment.is_packed(packed):
        _unpacked_segment(packed)  # says why
    return packed


def _avro_long(n: int) -> bytes:
    zigzag = (n << 1) ^ (n >> 63)
    out = bytearray()
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _read_avro_long(body: bytes, at: int) -> tuple[int, int]:
    zigzag = shift = 0
    while True:
        if at >= len(body) or shift > 63:
            raise StateDecodeError("packed producer state: its length is cut short")
        byte = body[at]
        at += 1
        zigzag |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (zigzag >> 1) ^ -(zigzag & 1), at


def decode_segment(body: bytes, writer_schema=STATE_SCHEMA) -> Segment:
    state = decode_state(body, writer_schema)
    if not isinstance(state, Segment):
        raise StateDecodeError(f"expected producer state, found {type(state).__name__}")
    return state


def decode_partition(body: bytes, writer_schema=STATE_SCHEMA) -> PartitionValidation:
    state = decode_state(body, writer_schema)
    if not isinstance(state, PartitionValidation):
        raise StateDecodeError(f"expected partition state, found {type(state).__name__}")
    return state


def encode_key_validation(entry: KeyValidation) -> bytes:
    return PACKED_KEY_VALIDATION_BRANCH + pack_key_validation(entry)


def encode_segment(segment: Segment) -> bytes:
    checksum = segment.checksum
    if checksum is not None and checksum >= _SIGN:
        checksum -= _WRAP
    return _write(
        PRODUCER_STATE_NAME,
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
            "firstSeenTimestamp": segment.first_seen_ts,
            "partitionHoles": segment.partition_holes,
            "recentCrcs": b"" if segment.recent is None else ring_bytes(segment.recent),
            "gapLog": None if segment.gaps is None else _gap_log_fields(segment.gaps),
        },
    )


def _gap_log_fields(log: GapLog) -> dict:
    return {
        "segment": log.segment,
        "high": log.high,
        "gaps": [
            {
                "segment": g.segment,
                "first": g.first,
                "last": g.last,
                "foundOffset": g.found_offset,
                "foundSeq": g.found_seq,
                "judged": g.judged,
                "lastJudgedOffset": g.last_judged_offset,
                "arrivedUnplaced": g.arrived_unplaced,
                "fatal": g.fatal,
                "holes": g.holes,
                "arrived": [
                    {"firstSeq": lo, "lastSeq": hi, "firstOffset": first, "lastOffset": last}
                    for lo, hi, first, last in g.arrived
                ],
            }
            for g in log.gaps
        ],
    }


def _gap_log_of(fields: dict) -> GapLog:
    log = GapLog(fields["segment"], fields["high"])
    for g in fields["gaps"]:
        log.gaps.append(
            Gap(
                g["segment"],
                g["first"],
                g["last"],
                g["foundOffset"],
                g["foundSeq"],
                g["judged"],
                g["lastJudgedOffset"],
                [[r["firstSeq"], r["lastSeq"], r["firstOffset"], r["lastOffset"]] for r in g["arrived"]],
                g["arrivedUnplaced"],
                g["fatal"],
                g["holes"],
            )
        )
    return log


def _segment_of(fields: dict) -> Segment:
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
    segment.first_seen_ts = fields["firstSeenTimestamp"]
    segment.partition_holes = fields["partitionHoles"]
    ring = fields["recentCrcs"]
    if ring:
        if len(ring) % 8:
            raise StateDecodeError(f"producer state's recentCrcs is {len(ring)} bytes, not whole 8-byte slots")
        segment.recent = ring_of(ring)
    gap_log = fields["gapLog"]
    if gap_log is not None:
        segment.gaps = _gap_log_of(gap_log[1])  # (record name, fields): a union's branch, named
    return segment


def encode_partition(state: PartitionValidation) -> bytes:
    """The partition's phase and counters; its producers are saved one key each."""
    return _write(
        PARTITION_STATE_NAME,
        {
            "inPush": state.in_push,
            "pushFailed": state.push_failed,
            "lastOffset": state.last_offset,
            "records": state.records,
            "verdictCounts": {v.value: n for v, n in state.verdict_counts.items()},
            "checkpointAnchorMs": state.checkpoint_anchor_ms,
            "topicId": state.topic_id,
            "holes": state.holes,
            "holesFrom": state.holes_from,
            "untoldGaps": state.untold_gaps,
        },
    )


def _partition_of(fields: dict) -> PartitionValidation:
    """A PartitionValidation with an empty tracker: restore its producers with decode_segment."""
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
        topic_id=fields["topicId"],
        holes=fields["holes"],
        holes_from=fields["holesFrom"],
        untold_gaps=fields["untoldGaps"],
    )
