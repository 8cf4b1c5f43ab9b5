"""State framed without a registry: kdiv's own numbered versions of the state schema, each
read back after the schema moved on."""

from __future__ import annotations

import hashlib
import io
import json
import random

import fastavro

from kdiv.div.exact import GapLog
from kdiv.div.segment import Segment
from kdiv.div.validator import PartitionValidation
from kdiv.div.wire import ChecksumType
from kdiv.state.codec import (
    LOCAL_ID_BASE,
    LOCAL_STATE_SCHEMA_ID,
    LOCAL_STATE_SCHEMAS,
    STATE_SCHEMA_JSON,
    encode_segment,
)
from kdiv.state.framing import frame, unframe
from kdiv.state.values import StateValues

# The current schema's fingerprint: when it changes, the new text needs an id of its own in
# LOCAL_STATE_SCHEMAS (state already written under the old id must still decode).
CURRENT_FINGERPRINT = "f706828a4687427bd355edaeaf5a060e1499634b897d40d48e7457f9c2bd5242"


def test_the_current_schema_has_its_own_local_id():
    assert LOCAL_STATE_SCHEMAS[LOCAL_STATE_SCHEMA_ID] == STATE_SCHEMA_JSON
    assert hashlib.sha256(STATE_SCHEMA_JSON.encode()).hexdigest() == CURRENT_FINGERPRINT, (
        "the state schema changed: add its text to LOCAL_STATE_SCHEMAS under the next id"
    )
    # No registry hands these ids out: Confluent's are positive signed 32-bit ints.
    assert all(i == 0 or LOCAL_ID_BASE <= i < 1 << 32 for i in LOCAL_STATE_SCHEMAS)
    assert len(set(LOCAL_STATE_SCHEMAS.values())) == len(LOCAL_STATE_SCHEMAS)


def test_state_written_under_the_first_version_is_read_by_the_current_one():
    v1 = fastavro.parse_schema(json.loads(LOCAL_STATE_SCHEMAS[0]))
    out = io.BytesIO()
    fields = {
        "segmentNumber": 3,
        "sequenceNumber": 41,
        "checksumType": int(ChecksumType.ADHASH),
        "checksum": 12345,
        "checksumFinalized": False,
        "registered": True,
        "started": True,
        "ended": False,
        "finalSegment": False,
        "newSegment": False,
        "lastOffset": 900,
        "lastProducerTimestamp": 1_700_000_000_000,
    }
    fastavro.schemaless_writer(out, v1, ("kdiv.state.ProducerPartitionState", fields))
    values = StateValues.unregistered()
    segment = values.decode(frame(0, out.getvalue()))
    assert isinstance(segment, Segment)
    assert (segment.segment_number, segment.sequence_number, segment.checksum, segment.last_offset) == (
        3,
        41,
        12345,
        900,
    )
    assert segment.recent is None and segment.gaps is None  # fields the first version did not have


def test_state_written_before_offset_holes_were_counted_reads_as_holes_not_known():
    v2 = fastavro.parse_schema(json.loads(LOCAL_STATE_SCHEMAS[LOCAL_ID_BASE + 2]))
    producer = io.BytesIO()
    fields = {
        "segmentNumber": 0,
        "sequenceNumber": 5,
        "checksumType": int(ChecksumType.ADHASH),
        "checksum": 7,
        "lastOffset": 900,
        "lastProducerTimestamp": 1_700_000_000_000,
        "started": True,
        "registered": True,
        "recentCrcs": b"",
    }
    fastavro.schemaless_writer(producer, v2, ("kdiv.state.ProducerPartitionState", fields))
    partition = io.BytesIO()
    fastavro.schemaless_writer(partition, v2, ("kdiv.state.PartitionState", {"inPush": False, "lastOffset": 900}))
    values = StateValues.unregistered()
    segment = values.decode(frame(LOCAL_ID_BASE + 2, producer.getvalue()))
    assert isinstance(segment, Segment) and segment.partition_holes == -1  # the compaction rule cannot use it
    part = values.decode(frame(LOCAL_ID_BASE + 2, partition.getvalue()))
    assert isinstance(part, PartitionValidation)
    assert (part.last_offset, part.holes, part.holes_from, part.untold_gaps) == (900, 0, -1, 0)


def test_state_written_now_is_framed_with_the_current_local_id_and_reads_back():
    values = StateValues.unregistered()
    segment = Segment(2, 7, ChecksumType.ADHASH, [0] * 8)
    segment.started = segment.registered = True
    segment.partition_holes = 12
    raw = values.encode(segment)
    assert unframe(raw)[0] == LOCAL_STATE_SCHEMA_ID
    assert values.decode(raw) == segment
    # A worker with a registry reads it too (the local versions are always known).
    assert StateValues(17).decode(raw) == segment


def _producer_states() -> list[Segment]:
    plain = Segment(0, 7, ChecksumType.ADHASH)
    ringed = Segment(2, 300, ChecksumType.NONE, recent=[0] * 8)
    ringed.last_offset, ringed.last_producer_ts = 4_000, 1_700_000_000_000
    return [plain, ringed]


def test_a_producer_state_is_written_packed_as_fastavro_writes_that_branch():
    values = StateValues.unregistered()
    current = fastavro.parse_schema(json.loads(STATE_SCHEMA_JSON))
    for segment in _producer_states():
        raw = values.encode(segment)
        out = io.BytesIO()
        fastavro.schemaless_writer(out, current, ("kdiv.state.ProducerStatePacked", {"entry": segment.pack()}))
        assert raw == frame(LOCAL_STATE_SCHEMA_ID, out.getvalue())
        assert values.encode_packed_producer(segment.pack()) == raw
        assert values.decode(raw) == segment
        assert values.packed_producer(raw) == segment.pack()


def test_a_producer_state_written_as_a_record_loads_packed_too():
    """States written before the packed branch (the record, under the previous version) load
    as the packed form the tracker keeps."""
    v3 = LOCAL_ID_BASE + 3
    schema = fastavro.parse_schema(json.loads(LOCAL_STATE_SCHEMAS[v3]))
    values = StateValues.unregistered()
    for segment in _producer_states():
        body = encode_segment(segment)  # the record branch, the same in both versions
        fastavro.schemaless_reader(io.BytesIO(body), schema)  # written as v3 would
        assert values.packed_producer(frame(v3, body)) == segment.pack()


def test_a_garbled_packed_producer_state_is_refused_naming_why():
    values = StateValues.unregistered()
    raw = values.encode(Segment(0, 7, ChecksumType.ADHASH))
    schema_id, body = unframe(raw)
    bad_type = bytearray(body)
    bad_type[-2] = 9  # no such checksum type
    cut = body[:-3]
    for garbled in (bytes(bad_type), cut, body + b"\x00"):
        try:
            values.packed_producer(frame(schema_id, garbled))
        except ValueError as refused:
            assert "packed producer state" in str(refused)
        else:
            raise AssertionError(f"garbled state {garbled!r} was loaded")


def test_is_packed_says_yes_exactly_where_unpack_gives_back_a_state():
    """The in-place check of a packed state against the real unpacking, on packed states of
    every form (fixed, near ring, whole ring, gap log), cut short, lengthened and bit-flipped."""
    rng = random.Random(7)
    forms = _producer_states()
    near = Segment(0, 40, ChecksumType.ADHASH, recent=[0] * 8)
    for seq in range(35, 41):
        near.recent[seq % 8] = (((seq + 1) & 0xFFFFFFFF) << 32) | rng.getrandbits(32)
    gapped = near.copy()
    gapped.gaps = GapLog(0, 40)
    forms += [near, gapped]
    for segment in forms:
        packed = segment.pack()
        candidates = [packed, packed[:-1], packed + b"\x00", packed[: len(packed) // 2]]
        for _ in range(200):
            flipped = bytearray(packed)
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            candidates.append(bytes(flipped))
        for candidate in candidates:
            try:
                Segment.unpack(candidate)
                unpacks = True
            except Exception:
                unpacks = False
            # Where unpacking also ignores trailing bytes, is_packed is the stricter of the two.
            assert Segment.is_packed(candidate) <= unpacks, candidate
        assert Segment.is_packed(packed)
