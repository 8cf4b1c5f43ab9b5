"""A peer's signed request is taken once: its nonce is kept while the request's time is in
the window, at O(1) amortised cost per request and at most a bounded number of them."""

from __future__ import annotations

import logging
from collections import deque

import pytest
from yarl import URL

from kdiv.worker.web.auth import PEER_NONCE, PEER_SIGNATURE, PEER_TIME, SignedRequests, peer_target, request_signature
from kdiv.worker.web.nonces import SpentNonces

TOKEN = "s3cret-token"
ORIGIN = URL("http://kdiv-worker-1:6066")
WINDOW_MS = 30_000


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def signed_headers(at_ms: int, nonce: str, path: str = "/producers?scope=local") -> dict[str, str]:
    signature = request_signature(TOKEN, "GET", peer_target(ORIGIN.join(URL(path))), at_ms, nonce, b"")
    return {PEER_TIME: str(at_ms), PEER_NONCE: nonce, PEER_SIGNATURE: signature}


def nonce(n: int) -> str:
    return f"{n:032x}"


def test_a_replayed_request_is_refused_while_its_time_is_in_the_window():
    clock = Clock(1_000_000)
    signed = SignedRequests(TOKEN, ORIGIN, WINDOW_MS, clock=clock)
    headers = signed_headers(clock.ms, nonce(1))
    assert signed.check("GET", "/producers?scope=local", headers, b"") == headers[PEER_SIGNATURE]
    for later in (0, 1, WINDOW_MS):
        clock.ms = 1_000_000 + later
        assert signed.check("GET", "/producers?scope=local", headers, b"") is None, later
    clock.ms = 1_000_000 + WINDOW_MS + 1  # the request's time has left the window: refused for that
    assert signed.check("GET", "/producers?scope=local", headers, b"") is None
    fresh = signed_headers(clock.ms, nonce(1))  # the same nonce, newly signed: a new request
    assert signed.check("GET", "/producers?scope=local", fresh, b"") is not None


def test_a_request_dated_ahead_keeps_its_nonce_until_its_own_time_leaves_the_window():
    clock = Clock(1_000_000)
    signed = SignedRequests(TOKEN, ORIGIN, WINDOW_MS, clock=clock)
    first = signed_headers(clock.ms, nonce(1))
    ahead = signed_headers(clock.ms + WINDOW_MS, nonce(2))  # a peer's clock a window ahead
    assert signed.check("GET", "/producers?scope=local", first, b"") is not None
    assert signed.check("GET", "/producers?scope=local", ahead, b"") is not None
    clock.ms += 2 * WINDOW_MS  # the first has expired; the one ahead is still in the window
    assert signed.check("GET", "/producers?scope=local", ahead, b"") is None


def test_the_store_is_bounded_and_refuses_rather_than_forgets(caplog):
    clock = Clock(1_000_000)
    signed = SignedRequests(TOKEN, ORIGIN, WINDOW_MS, max_nonces=100, clock=clock)
    accepted = [signed_headers(clock.ms, nonce(n)) for n in range(100)]
    for headers in accepted:
        assert signed.check("GET", "/producers?scope=local", headers, b"") is not None
    with caplog.at_level(logging.WARNING, logger="kdiv.worker.web.auth"):
        for n in range(100, 110):
            assert signed.check("GET", "/producers?scope=local", signed_headers(clock.ms, nonce(n)), b"") is None
    assert len([r for r in caplog.records if "are kept, the most kept" in r.getMessage()]) == 1  # not one each
    for headers in accepted:  # kept, none forgotten to make room
        assert signed.check("GET", "/producers?scope=local", headers, b"") is None
    clock.ms += WINDOW_MS + 1
    assert signed.check("GET", "/producers?scope=local", signed_headers(clock.ms, nonce(200)), b"") is not None


class CountingDeque(deque):
    """Counts how many kept nonces are looked at: the cost of a check, without timing it."""

    looked_at = 0

    def __getitem__(self, index):
        CountingDeque.looked_at += 1
        return super().__getitem__(index)

    def popleft(self):
        CountingDeque.looked_at += 1
        return super().popleft()


def test_each_check_costs_o1_amortised_and_the_store_holds_a_window_of_requests(monkeypatch):
    spent = SpentNonces(capacity=1_000_000)
    monkeypatch.setattr(spent, "_taken", CountingDeque())
    CountingDeque.looked_at = 0
    per_window = 3_000  # 100 requests/s for 30 s, for ten windows
    requests = 10 * per_window
    largest = 0
    for n in range(requests):
        now_ms = n * 10
        # Peers' clocks differ: times spread over the window, behind and ahead.
        at_ms = now_ms + (n * 7919 % (2 * WINDOW_MS)) - WINDOW_MS
        assert spent.take(nonce(n), at_ms + WINDOW_MS, now_ms)
        largest = max(largest, len(spent))
    # Each nonce is looked at a bounded number of times: taken, maybe blocked at the front, forgotten.
    assert CountingDeque.looked_at <= 3 * requests
    assert largest <= 2 * per_window + 1  # kept at most two windows: bounded by the rate, not the history
    assert len(spent) == len(spent._taken)


def test_spent_nonces_refuse_a_replay_and_forget_only_after_expiry():
    spent = SpentNonces(capacity=2)
    assert spent.take("a", until_ms=100, now_ms=0)
    assert not spent.take("a", until_ms=200, now_ms=100)  # until is inclusive
    assert spent.take("b", until_ms=150, now_ms=100)
    assert not spent.take("c", until_ms=300, now_ms=100)  # full
    assert spent.full(100)
    assert spent.take("a", until_ms=300, now_ms=101)  # "a" expired: taken anew, "b" kept
    assert not spent.take("b", until_ms=300, now_ms=101)
    with pytest.raises(ValueError):
        SpentNonces(capacity=0)
