"""The live judge looks only at the open traces whose verdict may have changed: observed or
loaded since, due by time, or passed by their group's committed offset. Its verdicts and
state changes are those of a judge that walks every open trace on every call."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from kdiv.trace.judge import Observation, TraceJudge, TraceState, TraceVerdict
from kdiv.trace.routes import parse_routes

ROUTES = parse_routes("flow=orders>enricher>enriched>router>eu|us;short=orders>shipper>shipped")
FLOW = ROUTES[0]
TOPICS = {"flow": ("orders", "enriched", "eu", "us"), "short": ("orders", "shipped")}
COMMITS = (("enricher", "orders"), ("router", "enriched"), ("shipper", "orders"))
IDS = tuple(bytes([n]) * 16 for n in range(1, 6))


class FullWalkJudge(TraceJudge):
    """The judge as it was: every open trace looked at on every call."""

    def judge(self, now_ms: int) -> list[TraceVerdict]:
        verdicts: list[TraceVerdict] = []
        for key in self._attention:
            state = self._resolved.get(key)
            if state is not None:
                verdicts.extend(self._report_duplicates(key, state))
        self._attention.clear()
        for key, state in list(self._open.items()):
            verdicts.extend(self._report_duplicates(key, state))
            verdict = self._terminal(key, state, now_ms)
            if verdict is not None:
                verdicts.append(verdict)
                self._resolve(key, state, verdict.outcome, now_ms)
        self._evict()
        verdicts.sort(key=lambda verdict: (verdict.route, verdict.trace_id))
        return verdicts


class CountingJudge(TraceJudge):
    """Counts the open traces `judge` looks at."""

    looked_at = 0

    def _terminal(self, key, state, now_ms):
        self.looked_at += 1
        return super()._terminal(key, state, now_ms)


def _observation(route: str, trace_id: bytes, topic: str, partition: int, offset: int) -> Observation:
    stage = next(r for r in ROUTES if r.name == route).stage_of(topic)
    assert stage is not None
    # One record, one timestamp: a replay is identical.
    return Observation(trace_id, route, stage, topic, partition, offset, 1_000 + 10 * stage + offset, 900)


def _changed(judge: TraceJudge) -> list:
    return [(r, t, None if s is None else s.pack()) for r, t, s in judge.take_changed()]


steps = st.one_of(
    st.tuples(
        st.just("observe"),
        st.sampled_from(sorted(TOPICS)),
        st.integers(0, len(IDS) - 1),
        st.integers(0, 3),
        st.tuples(st.integers(0, 1), st.integers(0, 6), st.integers(0, 20)),
    ),
    st.tuples(st.just("commit"), st.just(""), st.integers(0, len(COMMITS) - 1), st.integers(0, 1), st.integers(0, 8)),
    # Mostly forward, sometimes back: the judge's time is the caller's.
    st.tuples(st.just("judge"), st.just(""), st.just(0), st.just(0), st.integers(-5, 40)),
    st.tuples(st.just("reload"), st.sampled_from(sorted(TOPICS)), st.integers(0, len(IDS) - 1), st.just(0), st.just(0)),
    st.tuples(st.just("forget"), st.sampled_from(sorted(TOPICS)), st.integers(0, len(IDS) - 1), st.just(0), st.just(0)),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(steps, min_size=5, max_size=80),
    st.integers(0, 3),
    st.sampled_from([(10, 60), (0, 30), (15, 15), (5, 0)]),
)
def test_the_verdicts_and_changes_are_those_of_a_full_walk(script, remember, timing):
    grace_ms, max_wait_ms = timing
    judges = [
        cls(ROUTES, grace_ms=grace_ms, max_wait_ms=max_wait_ms, remember_resolved=remember)
        for cls in (FullWalkJudge, TraceJudge)
    ]
    full, scheduled = judges
    now = 0
    for kind, route, a, b, c in script:
        if kind == "observe":
            partition, offset, elapsed = c
            now += elapsed
            topics = TOPICS[route]
            record = _observation(route, IDS[a], topics[b % len(topics)], partition, offset)
            assert full.observe(record, now) == scheduled.observe(record, now)
        elif kind == "commit":
            group, topic = COMMITS[a]
            for judge in judges:
                judge.committed(group, topic, b, c)
        elif kind == "judge":
            now += c
            verdicts = full.judge(now)
            assert scheduled.judge(now) == verdicts
            for verdict in verdicts:
                event(verdict.outcome.value)
        elif kind == "reload":
            # A state saved and loaded again, as after a restart: looked at afresh.
            state = full.states().get((route, IDS[a]))
            if state is not None:
                raw = state.pack()
                for judge in judges:
                    judge.load(route, IDS[a], TraceState.unpack(raw))
        else:
            for judge in judges:
                judge.forget(route, IDS[a])
        assert _changed(scheduled) == _changed(full)
        assert {k: s.pack() for k, s in scheduled.states().items()} == {k: s.pack() for k, s in full.states().items()}
        assert scheduled.open_traces() == full.open_traces()


def test_open_traces_nothing_happened_to_are_not_looked_at_again():
    judge = CountingJudge(ROUTES, grace_ms=1_000, max_wait_ms=60_000)
    for n in range(1_000):
        judge.observe(_observation("flow", n.to_bytes(16, "big"), "orders", n % 2, n), 0)
    assert judge.judge(0) == [] and judge.looked_at == 1_000
    judge.looked_at = 0
    assert judge.judge(30_000) == [] and judge.looked_at == 0
    # The group commits partition 0 past offsets 0..99: the 50 traces there, and no other.
    judge.committed("enricher", "orders", 0, 100)
    assert judge.judge(30_001) == [] and judge.looked_at == 50
    # Lost once the grace has passed since: those 50 only.
    judge.looked_at = 0
    lost = judge.judge(31_001)
    assert judge.looked_at == 50 and len(lost) == 50 and {v.outcome.value for v in lost} == {"LOST"}
    # A new observation is looked at on the next call, alone.
    judge.looked_at = 0
    judge.observe(_observation("flow", (1).to_bytes(16, "big"), "enriched", 0, 7), 31_500)
    assert judge.judge(31_500) == [] and judge.looked_at == 1
    # The rest (the one that moved on too: it was first seen at 0) wait out max_wait together.
    judge.looked_at = 0
    unresolved = judge.judge(60_000)
    assert judge.looked_at == 950 and len(unresolved) == 950 and judge.open_traces() == 0


def test_what_the_judge_keeps_to_look_again_does_not_outgrow_the_open_traces():
    judge = TraceJudge(ROUTES, grace_ms=0, max_wait_ms=3_600_000, remember_resolved=10)
    for now in range(20_000):
        trace_id = now.to_bytes(16, "big")
        judge.observe(_observation("flow", trace_id, "orders", 0, now), now)
        judge.judge(now)
        # Delivered soon after: its hour-long deadline and its wait on the group are stale.
        judge.observe(_observation("flow", trace_id, "eu", 0, now), now)
        judge.observe(_observation("flow", trace_id, "enriched", 0, now), now)
        assert [v.outcome.value for v in judge.judge(now)] == ["DELIVERED"]
    assert judge.open_traces() == 0
    assert len(judge._deadlines) <= 1_024 + 2 and sum(map(len, judge._waits.values())) <= 1_024 + 2
