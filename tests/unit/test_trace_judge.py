import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kdiv.trace.judge import (
    AtRestResult,
    Observation,
    ObservationError,
    TraceJudge,
    TraceOutcome,
    TraceState,
    TraceVerdict,
    judge_at_rest,
    state_key,
)
from kdiv.trace.routes import parse_routes

ROUTES = parse_routes("flow=orders>enricher>enriched>router>eu|us")
(FLOW,) = ROUTES
GRACE, MAX_WAIT = 1_000, 60_000
A, B, C, D = (bytes([n]) * 16 for n in range(1, 5))
ORIGIN = 10_000


def obs(trace_id, topic, partition, offset, timestamp_ms, origin_ms=ORIGIN, route="flow"):
    return Observation(trace_id, route, FLOW.stage_of(topic), topic, partition, offset, timestamp_ms, origin_ms)


def new_judge(**kwargs) -> TraceJudge:
    return TraceJudge(
        ROUTES, grace_ms=kwargs.pop("grace_ms", GRACE), max_wait_ms=kwargs.pop("max_wait_ms", MAX_WAIT), **kwargs
    )


def test_delivered_with_per_hop_and_end_to_end_latencies():
    judge = new_judge()
    assert judge.observe(obs(A, "orders", 0, 5, 10_010), 0)
    assert judge.observe(obs(A, "enriched", 1, 7, 10_030), 0)
    assert judge.judge(1) == []
    assert judge.observe(obs(A, "eu", 0, 3, 10_100), 2)
    (verdict,) = judge.judge(3)
    assert verdict == TraceVerdict(
        TraceOutcome.DELIVERED,
        "flow",
        A,
        1,
        "router",
        ("enriched", 1, 7),
        latencies_ms=(20, 70),
        end_to_end_ms=100,
        detail=verdict.detail,
        origin_ms=ORIGIN,
    )
    assert "eu[0]@3" in verdict.detail and A.hex() in verdict.detail
    assert judge.open_traces() == 0
    assert judge.judge(10**9) == []


def test_lag_without_commit_is_never_lost_then_unresolved_once():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.committed("enricher", "orders", 0, 5)  # committed == offset: not past it
    for now in range(0, MAX_WAIT, 997):
        assert judge.judge(now) == []
    (verdict,) = judge.judge(MAX_WAIT)
    assert verdict.outcome is TraceOutcome.UNRESOLVED
    assert (verdict.hop, verdict.group, verdict.source, verdict.committed_offset) == (
        0,
        "enricher",
        ("orders", 0, 5),
        5,
    )
    assert "has not committed past it (committed offset 5, record offset 5)" in verdict.detail
    assert judge.judge(MAX_WAIT + 1) == [] and judge.open_traces() == 0


def test_unresolved_without_any_commit_says_so():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    (verdict,) = judge.judge(MAX_WAIT)
    assert verdict.committed_offset is None
    assert "enricher has no committed offset on orders[0]" in verdict.detail


def test_committed_past_and_grace_elapsed_is_lost_exactly_once():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.committed("enricher", "orders", 1, 100)  # another partition does not count
    assert judge.judge(50) == []
    judge.committed("enricher", "orders", 0, 6)
    assert judge.judge(100) == []  # first seen committed past now
    assert judge.judge(100 + GRACE - 1) == []
    (verdict,) = judge.judge(100 + GRACE)
    assert verdict.outcome is TraceOutcome.LOST
    assert (verdict.hop, verdict.group, verdict.source, verdict.committed_offset) == (
        0,
        "enricher",
        ("orders", 0, 5),
        6,
    )
    for text in (
        "lost at hop 0",
        "group enricher",
        "orders[0] to offset 6",
        "offset 5",
        "enriched",
        "replay orders[0]@5",
    ):
        assert text in verdict.detail
    assert judge.judge(100 + GRACE + 1) == [] and judge.judge(10**9) == []
    assert judge.open_traces() == 0


def test_a_lower_committed_offset_later_is_ignored():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.committed("enricher", "orders", 0, 9)
    judge.committed("enricher", "orders", 0, 2)
    judge.judge(0)
    assert [v.outcome for v in judge.judge(GRACE)] == [TraceOutcome.LOST]


def test_output_within_grace_after_commit_is_delivered_not_lost():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.committed("enricher", "orders", 0, 6)
    assert judge.judge(100) == []
    judge.observe(obs(A, "enriched", 0, 1, 10_050), 100 + GRACE - 1)
    judge.committed("router", "enriched", 0, 2)
    judge.observe(obs(A, "us", 2, 8, 10_060), 100 + GRACE - 1)
    assert [v.outcome for v in judge.judge(100 + GRACE)] == [TraceOutcome.DELIVERED]


def test_loss_at_the_second_hop_names_its_group():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.observe(obs(A, "enriched", 3, 40, 10_001), 0)
    judge.committed("enricher", "orders", 0, 6)
    judge.committed("router", "enriched", 3, 40)
    assert judge.judge(0) == []
    judge.committed("router", "enriched", 3, 41)
    assert judge.judge(10) == []
    (verdict,) = judge.judge(10 + GRACE)
    assert (verdict.outcome, verdict.hop, verdict.group, verdict.source, verdict.committed_offset) == (
        TraceOutcome.LOST,
        1,
        "router",
        ("enriched", 3, 40),
        41,
    )
    assert "never appeared on eu|us" in verdict.detail


def test_duplicates_are_reported_once_per_stage():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.observe(obs(A, "enriched", 0, 7, 10_010), 0)
    judge.observe(obs(A, "enriched", 0, 8, 10_020), 0)
    (verdict,) = judge.judge(1)
    assert (verdict.outcome, verdict.hop, verdict.group, verdict.source, verdict.copies) == (
        TraceOutcome.DUPLICATED,
        0,
        "enricher",
        ("orders", 0, 5),
        (("enriched", 0, 7), ("enriched", 0, 8)),
    )
    assert judge.judge(2) == [] and judge.open_traces() == 1
    judge.observe(obs(A, "eu", 0, 1, 10_030), 3)
    judge.observe(obs(A, "us", 1, 1, 10_040), 3)
    duplicated, delivered = judge.judge(4)
    assert (duplicated.outcome, duplicated.hop, duplicated.group) == (TraceOutcome.DUPLICATED, 1, "router")
    assert duplicated.copies == (("eu", 0, 1), ("us", 1, 1))
    assert duplicated.source == ("enriched", 0, 7)
    assert "its input stage already held 2 copies" in duplicated.detail
    assert delivered.outcome is TraceOutcome.DELIVERED
    assert delivered.latencies_ms == (10, 20)


def test_lost_waits_for_the_group_to_pass_every_copy():
    judge = new_judge()
    judge.observe(obs(A, "enriched", 0, 7, 10_010), 0)
    judge.observe(obs(A, "enriched", 0, 9, 10_020), 0)
    judge.observe(obs(A, "orders", 0, 5, 10_000), 0)
    judge.committed("router", "enriched", 0, 8)
    assert [v.outcome for v in judge.judge(0)] == [TraceOutcome.DUPLICATED]
    assert judge.judge(GRACE * 5) == []
    judge.committed("router", "enriched", 0, 10)
    assert judge.judge(GRACE * 6) == []
    (lost,) = judge.judge(GRACE * 7)
    assert lost.source == ("enriched", 0, 7) and lost.hop == 1
    assert "other copies: enriched[0]@9" in lost.detail


def test_a_new_copy_restarts_the_grace_once_the_group_passes_it():
    judge = new_judge()
    judge.observe(obs(A, "enriched", 0, 7, 10_010), 0)
    judge.committed("router", "enriched", 0, 8)
    assert judge.judge(0) == []  # the grace starts
    judge.observe(obs(A, "enriched", 0, 9, 10_020), GRACE - 1)
    assert [v.outcome for v in judge.judge(GRACE)] == [TraceOutcome.DUPLICATED]
    judge.committed("router", "enriched", 0, 10)
    assert judge.judge(2 * GRACE) == []  # the grace starts again: the router only now passed the copy
    assert judge.judge(3 * GRACE - 1) == []
    assert [v.outcome for v in judge.judge(3 * GRACE)] == [TraceOutcome.LOST]


def test_replays_never_double_count():
    judge = new_judge()
    first = obs(A, "orders", 0, 5, 10_000)
    assert judge.observe(first, 0) is True
    assert judge.observe(first, 5) is False
    copy = obs(A, "enriched", 0, 7, 10_010)
    assert judge.observe(copy, 6) is True
    assert judge.observe(copy, 7) is False
    assert judge.judge(8) == []
    (state,) = judge.states().values()
    assert {stage: list(records) for stage, records in state.observations.items()} == {
        0: [("orders", 0, 5)],
        1: [("enriched", 0, 7)],
    }
    assert state.observations[0][("orders", 0, 5)] == (10_000, 0)  # the first sighting's judge time


def test_a_late_copy_after_delivered_is_a_duplicate_and_a_late_replay_is_nothing():
    judge = new_judge()
    for record in (obs(A, "orders", 0, 5, 1), obs(A, "enriched", 0, 7, 2), obs(A, "eu", 0, 1, 3)):
        judge.observe(record, 0)
    assert [v.outcome for v in judge.judge(1)] == [TraceOutcome.DELIVERED]
    assert judge.observe(obs(A, "eu", 0, 1, 3), 2) is False
    assert judge.judge(3) == []
    assert judge.observe(obs(A, "us", 0, 9, 4), 4) is True
    (verdict,) = judge.judge(5)
    assert (verdict.outcome, verdict.hop, verdict.copies) == (TraceOutcome.DUPLICATED, 1, (("eu", 0, 1), ("us", 0, 9)))
    assert judge.judge(6) == [] and judge.open_traces() == 0


def test_a_trace_reported_lost_that_moves_on_is_judged_again():
    judge = new_judge()
    judge.observe(obs(A, "orders", 0, 5, 1), 0)
    judge.committed("enricher", "orders", 0, 6)
    judge.judge(0)
    assert [v.outcome for v in judge.judge(GRACE)] == [TraceOutcome.LOST]
    judge.observe(obs(A, "enriched", 0, 7, 2), MAX_WAIT - 1)
    assert judge.open_traces() == 1
    # The wait counts from the reopening, not from the first sighting.
    assert judge.judge(MAX_WAIT + 10) == []
    judge.observe(obs(A, "eu", 0, 1, 3), MAX_WAIT + 11)
    (verdict,) = judge.judge(MAX_WAIT + 12)
    assert verdict.outcome is TraceOutcome.DELIVERED
    assert "reported LOST before it moved on" in verdict.detail


def test_sink_before_source_waits_for_the_source_within_the_grace():
    judge = new_judge()
    judge.observe(obs(A, "us", 0, 1, 10_100), 0)
    assert judge.judge(0) == [] and judge.judge(GRACE - 1) == []
    judge.observe(obs(A, "orders", 0, 5, 10_000), GRACE - 1)
    judge.observe(obs(A, "enriched", 0, 7, 10_050), GRACE - 1)
    (verdict,) = judge.judge(GRACE - 1)
    assert verdict.latencies_ms == (50, 50) and verdict.end_to_end_ms == 100


def test_sink_alone_is_delivered_after_the_grace_without_latencies():
    judge = new_judge()
    judge.observe(obs(A, "us", 0, 1, 10_100), 0)
    assert judge.judge(GRACE - 1) == []
    (verdict,) = judge.judge(GRACE)
    assert (verdict.outcome, verdict.latencies_ms, verdict.end_to_end_ms, verdict.source) == (
        TraceOutcome.DELIVERED,
        (),
        100,
        None,
    )
    assert "stage(s) 0, 1 never observed" in verdict.detail


def test_take_changed_reports_what_to_write_and_delete():
    judge = new_judge(remember_resolved=1)
    judge.observe(obs(A, "orders", 0, 5, 1), 0)
    judge.observe(obs(B, "orders", 0, 6, 1), 0)
    assert [(route, trace_id) for route, trace_id, _ in judge.take_changed()] == [("flow", A), ("flow", B)]
    assert judge.take_changed() == []
    assert judge.judge(1) == [] and judge.take_changed() == []
    judge.observe(obs(A, "eu", 0, 1, 3), 10)
    judge.observe(obs(B, "eu", 0, 2, 3), 20)
    judge.take_changed()
    judge.judge(10 + GRACE)
    (changed_a,) = judge.take_changed()
    assert changed_a[:2] == ("flow", A) and changed_a[2].resolved is TraceOutcome.DELIVERED
    judge.judge(20 + GRACE)
    # B resolved; A, the oldest resolved, is forgotten: only one is remembered.
    assert [(route, trace_id, state is None) for route, trace_id, state in judge.take_changed()] == [
        ("flow", B, False),
        ("flow", A, True),
    ]
    # Beyond the memory a late copy opens a new trace.
    assert judge.observe(obs(A, "us", 0, 9, 4), 30) is True and judge.open_traces() == 1
    judge.forget("flow", A)
    assert judge.take_changed() == [("flow", A, None)] and judge.open_traces() == 0


def test_observations_that_do_not_fit_the_routes_are_refused():
    judge = new_judge()
    with pytest.raises(ObservationError, match="route 'other' is not configured"):
        judge.observe(Observation(A, "other", 0, "orders", 0, 1, 1, 1), 0)
    with pytest.raises(ObservationError, match="topic 'nope' is not on route 'flow'"):
        judge.observe(Observation(A, "flow", 0, "nope", 0, 1, 1, 1), 0)
    with pytest.raises(ObservationError, match="topic 'eu' is stage 2 of route 'flow', not 1"):
        judge.observe(Observation(A, "flow", 1, "eu", 0, 1, 1, 1), 0)
    with pytest.raises(ObservationError, match="the trace id is 3 bytes"):
        judge.observe(Observation(b"abc", "flow", 0, "orders", 0, 1, 1, 1), 0)
    assert judge.open_traces() == 0


def test_state_key_is_route_zero_byte_id():
    assert state_key("flow", A) == b"flow\x00" + A
    with pytest.raises(ValueError, match="16 bytes, got 3"):
        state_key("flow", b"abc")


# -- packed states -------------------------------------------------------------------------

stages = st.integers(min_value=0, max_value=65_535)
int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
wheres = st.tuples(st.text(min_size=1, max_size=5), st.integers(min_value=0, max_value=(1 << 31) - 1), int64)
outcomes = st.sampled_from([None, TraceOutcome.DELIVERED, TraceOutcome.LOST, TraceOutcome.UNRESOLVED])


@st.composite
def trace_states(draw):
    resolved = draw(outcomes)
    return TraceState(
        draw(int64),
        draw(int64),
        draw(
            st.dictionaries(
                stages, st.dictionaries(wheres, st.tuples(int64, int64), min_size=1, max_size=3), max_size=3
            )
        ),
        draw(st.dictionaries(stages, int64, max_size=3)),
        draw(st.sets(stages, max_size=3)),
        resolved,
        None if resolved is None else draw(int64),
        draw(outcomes),
    )


@given(trace_states())
def test_pack_unpack_round_trip(state):
    assert TraceState.unpack(state.pack()) == state
    assert TraceState.unpack(state.pack()).pack() == state.pack()


def test_malformed_states_are_refused_naming_the_problem():
    state = TraceState(
        5, 6, {0: {("orders", 0, 5): (1, 2)}, 1: {("é", 1, 2): (3, 4)}}, {0: 9}, {1}, TraceOutcome.LOST, 7
    )
    raw = state.pack()
    assert raw[0] == 1
    for cut in range(len(raw)):
        with pytest.raises(ValueError, match="truncated|version"):
            TraceState.unpack(raw[:cut])
    with pytest.raises(ValueError, match="1 bytes after its end"):
        TraceState.unpack(raw + b"\x00")
    with pytest.raises(ValueError, match="version 9 is unknown"):
        TraceState.unpack(b"\x09" + raw[1:])
    with pytest.raises(ValueError, match="resolved outcome code 7 is unknown"):
        TraceState.unpack(raw[:1] + b"\x07" + raw[2:])


# -- crash safety ----------------------------------------------------------------------------

TOPICS = ("orders", "enriched", "eu", "us")
COMMITS = (("enricher", "orders"), ("router", "enriched"))
IDS = (A, B, C)


def _restarted(store: dict, committed: dict, remember: int) -> TraceJudge:
    judge = new_judge(grace_ms=10, max_wait_ms=60, remember_resolved=remember)
    for (route, trace_id), raw in store.items():
        judge.load(route, trace_id, TraceState.unpack(raw))
    judge.take_changed()  # loaded, not changed
    for (group, topic, partition), offset in committed.items():
        judge.committed(group, topic, partition, offset)
    return judge


def _apply(judge: TraceJudge, store: dict) -> None:
    for route, trace_id, state in judge.take_changed():
        if state is None:
            store.pop((route, trace_id), None)
        else:
            store[(route, trace_id)] = state.pack()


steps = st.one_of(
    st.tuples(
        st.just("observe"),
        st.sampled_from(range(len(IDS))),
        st.sampled_from(TOPICS),
        st.integers(0, 3),
        st.integers(0, 15),
    ),
    st.tuples(st.just("commit"), st.sampled_from(COMMITS), st.integers(0, 1), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("judge"), st.just(0), st.just(""), st.just(0), st.integers(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, min_size=5, max_size=60), st.integers(0, 3))
def test_a_judge_restarted_from_its_saved_states_after_every_step_gives_the_same_verdicts(script, remember):
    steady = new_judge(grace_ms=10, max_wait_ms=60, remember_resolved=remember)
    steady_store: dict = {}
    store: dict = {}
    committed: dict = {}
    now = 0
    for kind, a, b, c, d in script:
        restarted = _restarted(store, committed, remember)
        if kind == "observe":
            now += d
            trace, topic, offset = IDS[a], b, c
            # One record, one timestamp: a replay is identical.
            record = obs(trace, topic, a % 2, offset, 1_000 + 10 * FLOW.stage_of(topic) + offset)
            assert steady.observe(record, now) == restarted.observe(record, now)
        elif kind == "commit":
            (group, topic), partition, offset = a, b, c
            steady.committed(group, topic, partition, offset)
            restarted.committed(group, topic, partition, offset)
            key = (group, topic, partition)
            committed[key] = max(committed.get(key, -1), offset)
        else:
            now += d
            verdicts = steady.judge(now)
            assert verdicts == restarted.judge(now)
            for verdict in verdicts:
                event(verdict.outcome.value)
        _apply(steady, steady_store)
        _apply(restarted, store)
        assert store == steady_store
        assert steady_store == {key: state.pack() for key, state in steady.states().items()}
        assert restarted.open_traces() == steady.open_traces()


# -- at rest -------------------------------------------------------------------------------


def test_judge_at_rest_exact_sets():
    observations = [
        # A: delivered; its source observed twice (a replay).
        obs(A, "orders", 0, 1, 100),
        obs(A, "orders", 0, 1, 100),
        obs(A, "enriched", 0, 1, 110),
        obs(A, "us", 0, 1, 150),
        # B: stuck after hop 0, and the enricher committed past it: lost.
        obs(B, "orders", 0, 2, 200),
        # C: stuck at stage 1, waiting on the router.
        obs(C, "orders", 1, 3, 300),
        obs(C, "enriched", 1, 3, 310),
        # D: two copies at stage 1, none downstream.
        obs(D, "orders", 1, 4, 400),
        obs(D, "enriched", 1, 4, 410),
        obs(D, "enriched", 1, 5, 420),
    ]
    # The router has read enriched[1] up to offset 2: C (offset 3) and D (4, 5) are still ahead of it.
    committed = {("enricher", "orders", 0): 3, ("enricher", "orders", 1): 5, ("router", "enriched", 1): 3}
    result = judge_at_rest(ROUTES, observations, committed)
    assert isinstance(result, AtRestResult)
    assert {(v.trace_id, v.outcome, v.hop, v.source, v.copies, v.committed_offset) for v in result.verdicts} == {
        (A, TraceOutcome.DELIVERED, 1, ("enriched", 0, 1), (), None),
        (B, TraceOutcome.LOST, 0, ("orders", 0, 2), (), 3),
        (D, TraceOutcome.DUPLICATED, 0, ("orders", 1, 4), (("enriched", 1, 4), ("enriched", 1, 5)), None),
    }
    assert [v.trace_id for v in result.verdicts] == [A, B, D]
    assert result.counts == {"flow": {"DELIVERED": 1, "LOST": 1, "DUPLICATED": 1, "UNRESOLVED": 0, "PENDING": 2}}
    (delivered,) = [v for v in result.verdicts if v.outcome is TraceOutcome.DELIVERED]
    assert delivered.latencies_ms == (10, 40) and delivered.end_to_end_ms == 150 - ORIGIN

    # With the router past C and both of D's copies, C is lost, and D duplicated and lost, at hop 1.
    committed[("router", "enriched", 1)] = 6
    result = judge_at_rest(ROUTES, observations, committed)
    (c_lost,) = [v for v in result.verdicts if v.trace_id == C]
    assert (c_lost.outcome, c_lost.hop, c_lost.group, c_lost.source, c_lost.committed_offset) == (
        TraceOutcome.LOST,
        1,
        "router",
        ("enriched", 1, 3),
        6,
    )
    d_verdicts = [(v.outcome, v.hop, v.group) for v in result.verdicts if v.trace_id == D]
    assert d_verdicts == [(TraceOutcome.DUPLICATED, 0, "enricher"), (TraceOutcome.LOST, 1, "router")]
    assert result.counts["flow"] == {"DELIVERED": 1, "LOST": 3, "DUPLICATED": 1, "UNRESOLVED": 0, "PENDING": 0}


def test_judge_at_rest_refuses_unknown_routes():
    with pytest.raises(ObservationError, match="route 'other'"):
        judge_at_rest(ROUTES, [Observation(A, "other", 0, "orders", 0, 1, 1, 1)], {})


def test_open_traces_are_counted_per_route():
    routes = parse_routes("flow=orders>enricher>enriched;short=orders>shipper>shipped")
    judge = TraceJudge(routes, grace_ms=GRACE, max_wait_ms=MAX_WAIT)
    for trace_id, route in ((A, "flow"), (B, "flow"), (C, "short")):
        judge.observe(Observation(trace_id, route, 0, "orders", 0, 1, 10_010, ORIGIN), 0)
    assert (judge.open_traces("flow"), judge.open_traces("short"), judge.open_traces()) == (2, 1, 3)
