"""Idle producer states packed into shared buckets: a mapping that loses nothing."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from kdiv.div.producer_states import ProducerStates
from kdiv.div.segment import Segment
from kdiv.div.wire import ChecksumType

_SEQ = st.integers(-(1 << 63), (1 << 63) - 1)

# The fixed part of a packed state: 7 integers of 8 bytes (the partition holes among them), 2 bytes.
FIXED = 58


@given(
    seq=_SEQ,
    ring=st.lists(st.one_of(st.just(0), st.integers(0, (1 << 64) - 1)), min_size=1, max_size=40),
    near=st.booleans(),
)
def test_a_packed_ring_unpacks_equal_whether_its_seqs_are_near_or_not(seq, ring, near):
    segment = Segment(3, seq, ChecksumType.ADHASH)
    if near:  # the seqs just below the producer's, as an in-order producer leaves them
        ring = [
            0 if slot == 0 else ((((seq - i) + 1) & 0xFFFFFFFF) << 32) | (slot & 0xFFFFFFFF)
            for i, slot in enumerate(ring)
        ]
    segment.recent = ring
    packed = segment.pack()
    assert Segment.unpack(packed) == segment
    if near:
        assert len(packed) <= FIXED + 2 + (len(ring) + 7) // 8 + 5 * len(ring)


def test_an_in_order_producer_s_full_ring_packs_in_5_bytes_a_slot():
    segment = Segment(0, 1_000, ChecksumType.ADHASH)
    segment.recent = [(((s + 1) & 0xFFFFFFFF) << 32) | (s * 7919 & 0xFFFFFFFF) for s in range(993, 1_001)]
    assert len(segment.pack()) == FIXED + 2 + 1 + 5 * 8


def test_the_mapping_holds_active_and_packed_states_as_a_dict_would():
    rng = random.Random(5)
    states = ProducerStates()
    want: dict[bytes, Segment | bytes] = {}
    for step in range(5_000):
        guid = rng.randbytes(16) if rng.random() < 0.5 or not want else rng.choice(list(want))
        action = rng.random()
        if action < 0.45:
            state: Segment | bytes = rng.randbytes(rng.randrange(1, 90))
        elif action < 0.8:
            state = Segment(step, step, ChecksumType.NONE)
        else:
            if guid in want:
                del states[guid], want[guid]
            continue
        states[guid] = want[guid] = state
        if step % 500 == 0:
            assert len(states) == len(want) and dict(states.items()) == want
    assert states == want and set(states) == set(want) and len(states) == len(want)
    assert all(states[g] == s and states.get(g) == s and g in states for g, s in want.items())
    assert rng.randbytes(16) not in states and states.get(b"missing", 7) == 7
    snapshot = states.copy()
    for guid in list(want)[:100]:
        del states[guid]
    assert snapshot == want and len(states) == len(want) - 100


def test_a_long_state_and_a_state_taken_back():
    states = ProducerStates()
    states.put_packed([(b"g" * 16, b"x" * 70_000), (b"h" * 16, b"y")])
    assert states[b"g" * 16] == b"x" * 70_000 and states[b"h" * 16] == b"y"
    assert states.take_packed(b"g" * 16) == b"x" * 70_000 and states.take_packed(b"g" * 16) is None
    assert dict(states.items()) == {b"h" * 16: b"y"}
