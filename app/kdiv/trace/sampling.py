"""Which records a producer traces: a per-topic sampling rate, and the sampler that applies it.

Spec text: comma-separated `topic=rate` entries, the rate a fraction (0..1) or a percentage
("orders=0.1,payments=100%,*=0.01"); "*" is every topic not named. No "*" means topics not
named are never traced, and empty text traces nothing.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kdiv.trace.header import TraceStamp, new_trace_id

ANY_TOPIC = "*"
# Kafka's rule for topic names.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class SamplingError(ValueError):
    """A sampling spec is invalid; the message names the entry and why."""


@dataclass(frozen=True)
class SamplingSpec:
    """topic -> the fraction (0..1) of its records to trace; "*" for every topic not named."""

    rates: Mapping[str, float]

    def __post_init__(self) -> None:
        for topic, rate in self.rates.items():
            if not isinstance(rate, int | float) or math.isnan(rate) or not 0 <= rate <= 1:
                raise SamplingError(f"sampling rate of {topic!r} is {rate!r}, outside 0..1")
        # Frozen means frozen: nobody changes the rates under a running sampler.
        object.__setattr__(self, "rates", MappingProxyType(dict(self.rates)))

    @classmethod
    def parse(cls, text: str) -> SamplingSpec:
        """The spec of `text` ("orders=0.1,payments=100%,*=0"); SamplingError naming the bad entry."""
        rates: dict[str, float] = {}
        if not text.strip():
            return cls(rates)
        for position, entry in enumerate(text.split(","), start=1):
            where = f"sampling spec {text!r}, entry {position} {entry.strip()!r}"
            if not entry.strip():
                raise SamplingError(f"sampling spec {text!r}: entry {position} is empty")
            topic, equals, rate_text = entry.partition("=")
            topic, rate_text = topic.strip(), rate_text.strip()
            if not equals:
                raise SamplingError(f"{where}: missing '=' (expected topic=rate)")
            if topic != ANY_TOPIC and not _TOPIC_NAME.fullmatch(topic):
                raise SamplingError(f"{where}: {topic!r} is not a topic name ([a-zA-Z0-9._-], 1 to 249) or '*'")
            if topic in rates:
                raise SamplingError(f"{where}: topic {topic!r} is given twice")
            rates[topic] = _parse_rate(rate_text, where)
        return cls(rates)

    def rate_for(self, topic: str) -> float:
        rate = self.rates.get(topic)
        if rate is None:
            return self.rates.get(ANY_TOPIC, 0.0)
        return rate


def _parse_rate(text: str, where: str) -> float:
    percent = text.endswith("%")
    number = text[:-1].strip() if percent else text
    try:
        rate = float(number)
    except ValueError:
        raise SamplingError(f"{where}: rate {text!r} is not a number or a percentage") from None
    if percent:
        rate /= 100
    # `not 0 <= rate <= 1` is also true of NaN.
    if not 0 <= rate <= 1:
        raise SamplingError(f"{where}: rate {text!r} is outside 0..1 (0%..100%)")
    return rate


class Sampler:
    """Decides, record by record, whether to trace it; `draw` is injected so tests are deterministic."""

    def __init__(
        self,
        spec: SamplingSpec,
        draw: Callable[[], float] = random.random,
        new_id: Callable[[], bytes] = new_trace_id,
    ) -> None:
        self.spec = spec
        self._draw = draw
        self._new_id = new_id

    def stamp_for(self, topic: str, now_ms: int) -> TraceStamp | None:
        """A new stamp when this record of `topic` is to be traced, else None."""
        rate = self.spec.rate_for(topic)
        # Rates 0 and 1 need no draw: exact, and no randomness spent.
        if rate <= 0:
            return None
        if rate < 1 and not self._draw() < rate:
            return None
        return TraceStamp(self._new_id(), now_ms)
