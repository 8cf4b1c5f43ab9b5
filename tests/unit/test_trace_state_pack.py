"""`TraceState.pack` takes shortcuts for the common shapes; the bytes are the layout's, as
written by the plain form below (states saved before must read the same, and vice versa)."""

from __future__ import annotations

import struct

from hypothesis import given

from kdiv.trace.judge import TraceOutcome, TraceState
from tests.unit.test_trace_judge import trace_states

_CODES = {None: 0, TraceOutcome.DELIVERED: 1, TraceOutcome.LOST: 2, TraceOutcome.UNRESOLVED: 3}


def plain_pack(state: TraceState) -> bytes:
    topics = sorted({where[0] for records in state.observations.values() for where in records})
    topic_index = {topic: index for index, topic in enumerate(topics)}
    parts = [
        struct.pack(">BBBqq", 1, _CODES[state.resolved], _CODES[state.earlier], state.first_seen_ms, state.origin_ms)
    ]
    if state.resolved is not None:
        parts.append(struct.pack(">q", state.resolved_ms if state.resolved_ms is not None else 0))
    parts.append(struct.pack(">H", len(topics)))
    for topic in topics:
        encoded = topic.encode()
        parts.append(struct.pack(">H", len(encoded)) + encoded)
    parts.append(struct.pack(">I", sum(len(records) for records in state.observations.values())))
    for stage in sorted(state.observations):
        records = state.observations[stage]
        for where in sorted(records):
            timestamp, seen = records[where]
            topic, partition, offset = where
            parts.append(struct.pack(">HHiqqq", stage, topic_index[topic], partition, offset, timestamp, seen))
    parts.append(struct.pack(">H", len(state.committed_since_ms)))
    for stage in sorted(state.committed_since_ms):
        parts.append(struct.pack(">Hq", stage, state.committed_since_ms[stage]))
    parts.append(struct.pack(">H", len(state.duplicates_reported)))
    for stage in sorted(state.duplicates_reported):
        parts.append(struct.pack(">H", stage))
    return b"".join(parts)


@given(trace_states())
def test_pack_writes_the_plain_layout(state):
    assert state.pack() == plain_pack(state)


def test_pack_of_the_common_shapes_is_the_plain_layout():
    one = TraceState(5, 6, {0: {("orders", 3, 12345): (1000, 2000)}})
    two = TraceState(
        5, 6, {2: {("eu", 1, 5): (3, 4)}, 0: {("orders", 3, 1): (1, 2), ("orders", 0, 9): (1, 2)}}, {2: 7, 0: 1}
    )
    for state in (one, two, TraceState(1, 2, {1: {("b", 0, 0): (0, 0)}, 0: {("a", 0, 0): (0, 0)}}, {}, {2, 1})):
        assert state.pack() == plain_pack(state)
        assert TraceState.unpack(state.pack()) == state
