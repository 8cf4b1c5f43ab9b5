import pytest

from kdiv.trace.header import TraceStamp
from kdiv.trace.sampling import Sampler, SamplingError, SamplingSpec


def never_draw() -> float:
    raise AssertionError("draw() called for a rate of 0 or 1")


def test_parse_fractions_percentages_and_default():
    spec = SamplingSpec.parse(" orders = 0.1 , payments=1,refunds=25 %,*=0.5")
    assert dict(spec.rates) == {"orders": 0.1, "payments": 1.0, "refunds": 0.25, "*": 0.5}
    assert spec.rate_for("orders") == 0.1
    assert spec.rate_for("refunds") == 0.25
    assert spec.rate_for("anything") == 0.5
    assert SamplingSpec.parse("orders=10%").rate_for("orders") == pytest.approx(0.1)


def test_without_a_default_unnamed_topics_are_not_sampled():
    assert SamplingSpec.parse("orders=1").rate_for("payments") == 0.0
    assert SamplingSpec.parse("").rate_for("orders") == 0.0
    assert SamplingSpec.parse("   ").rates == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("orders=1.5", r"entry 1 'orders=1.5': rate '1.5' is outside 0..1"),
        ("orders=-0.1", "outside 0..1"),
        ("orders=101%", "outside 0..1"),
        ("orders=nan", "outside 0..1"),
        ("orders=inf", "outside 0..1"),
        ("a=1,orders", r"entry 2 'orders': missing '='"),
        ("a=0.1,a=0.2", r"entry 2 'a=0.2': topic 'a' is given twice"),
        ("a=lots", "rate 'lots' is not a number"),
        ("a=1,,b=1", "entry 2 is empty"),
        ("a=1,", "entry 2 is empty"),
        ("bad topic=1", "'bad topic' is not a topic name"),
        ("=1", "'' is not a topic name"),
    ],
)
def test_parse_errors_name_the_entry_and_why(text, message):
    with pytest.raises(SamplingError, match=message) as caught:
        SamplingSpec.parse(text)
    assert repr(text) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_spec_refuses_rates_outside_0_1_when_built_directly():
    with pytest.raises(SamplingError, match="'orders' is 2"):
        SamplingSpec({"orders": 2})


def test_rates_0_and_1_never_draw():
    sampler = Sampler(SamplingSpec.parse("always=1,never=0"), draw=never_draw)
    for now in range(50):
        stamp = sampler.stamp_for("always", now)
        assert stamp is not None and stamp.origin_ms == now and len(stamp.trace_id) == 16
        assert sampler.stamp_for("never", now) is None
        assert sampler.stamp_for("unnamed", now) is None


def test_injected_draw_decides_exactly():
    draws = iter([0.1, 0.25, 0.3, 0.2499])
    ids = iter([b"a" * 16, b"b" * 16])
    sampler = Sampler(SamplingSpec.parse("orders=25%"), draw=lambda: next(draws), new_id=lambda: next(ids))
    results = [sampler.stamp_for("orders", 7) for _ in range(4)]
    assert results == [TraceStamp(b"a" * 16, 7), None, None, TraceStamp(b"b" * 16, 7)]
