"""A checkpoint told which producers changed (`checkpoint(..., changed)`) answers as the walk
of every producer does (`changed=None`, the reference), and walks no producer for most
checkpoints of a partition whose producers mostly stand still."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.div import validator as validator_module
from kdiv.div.segment import Segment
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import Checkpoint, DataIntegrityValidator
from tests.harness.streams import NOW, Log

MAX_AGE_MS = 1_000
PRODUCERS = 6

# ("data", producer, producer clock step in ms: back, forward, or far ahead), ("checkpoint",),
# ("evict",): the producer limit applied, ("time", step): the validation's clock moves.
steps = st.one_of(
    st.tuples(
        st.just("data"),
        st.integers(0, PRODUCERS - 1),
        st.sampled_from([-700, -5, 0, 1, 40, 300, 900, 1_500, 10**9]),
    ),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("evict")),
    st.tuples(st.just("time"), st.sampled_from([0, 50, 800, 5_000, 10**9])),
)


def packed(state: Segment | bytes) -> bytes:
    return state if isinstance(state, bytes) else state.pack()


def written(checkpoint: Checkpoint, changed: set[bytes]) -> tuple:
    """What the writes take of a checkpoint: the changed producers' states, the expired."""
    return (
        {guid: packed(state) for guid in changed if (state := checkpoint.upserts.get(guid)) is not None},
        checkpoint.expired,
    )


@settings(max_examples=600, deadline=None)
@given(st.lists(steps, min_size=1, max_size=80), st.booleans())
def test_a_checkpoint_told_what_changed_answers_as_the_walk_of_every_producer(ops, exact):
    semantics = {} if exact else {"semantics": validator_module.Semantics.VENICE}
    reference = DataIntegrityValidator(max_age_ms=MAX_AGE_MS, max_producers=4, **semantics)
    told = DataIntegrityValidator(max_age_ms=MAX_AGE_MS, max_producers=4, **semantics)
    stampers = [DivStamper(bytes([n]) * 16) for n in range(PRODUCERS)]
    clocks = [NOW] * PRODUCERS
    log, now, changed = Log("orders"), NOW, set()
    for op in ops:
        if op[0] == "data":
            _, n, step = op
            clocks[n] = max(0, clocks[n] + step)
            for record in log.add_outgoing(stampers[n].data("orders", 0, b"k", b"v", clocks[n])):
                a, b = reference.validate(record, now), told.validate(record, now)
                assert (a.verdict, a.detail) == (b.verdict, b.detail)
                changed.add(stampers[n].guid)
        elif op[0] == "evict":
            a_evicted, b_evicted = reference.evict_over_limit("orders", 0), told.evict_over_limit("orders", 0)
            assert a_evicted == b_evicted
            if b_evicted is not None:
                changed.update(b_evicted.guids)
        elif op[0] == "time":
            now += op[1]
        else:
            reference.partition("orders", 0)
            told.partition("orders", 0)
            want = reference.checkpoint("orders", 0)
            got = told.checkpoint("orders", 0, set(changed))
            assert written(got, changed) == written(want, changed)
            a, b = reference.partition("orders", 0), told.partition("orders", 0)
            assert a.checkpoint_anchor_ms == b.checkpoint_anchor_ms
            assert {g: packed(s) for g, s in a.tracker.segments.items()} == {
                g: packed(s) for g, s in b.tracker.segments.items()
            }
            changed = set()


def producers_walked(monkeypatch, producers: int, rounds: int) -> int:
    """Producer states a partition's checkpoints read in walks, over `rounds` checkpoints
    after the first, each after records of 10 known producers."""
    walked = [0]
    for name in ("latest_producer_ts", "last_producer_times"):
        real = getattr(validator_module, name)

        def counting(states, *args, _real=real, **kwargs):
            walked[0] += len(states)
            return _real(states, *args, **kwargs)

        monkeypatch.setattr(validator_module, name, counting)
    validator = DataIntegrityValidator(max_age_ms=7 * 24 * 3600 * 1000)
    stampers = [DivStamper(n.to_bytes(16, "big")) for n in range(producers)]
    log = Log("orders")
    for stamper in stampers:
        for record in log.add_outgoing(stamper.data("orders", 0, b"k", b"v", NOW)):
            validator.validate(record, NOW)
    validator.checkpoint("orders", 0, {s.guid for s in stampers})
    walked[0] = 0
    for r in range(rounds):
        changed = set()
        for stamper in stampers[r * 10 % producers :][:10]:
            for record in log.add_outgoing(stamper.data("orders", 0, b"k", b"v", NOW + r)):
                validator.validate(record, NOW + r)
            changed.add(stamper.guid)
        validator.checkpoint("orders", 0, changed)
    return walked[0]


def test_checkpoints_walk_no_producer_whatever_the_partition_holds(monkeypatch):
    # The reference walks every producer twice a checkpoint: 2 x 1,000 x 20, 2 x 10,000 x 20.
    assert producers_walked(monkeypatch, 1_000, 20) == producers_walked(monkeypatch, 10_000, 20) == 0
