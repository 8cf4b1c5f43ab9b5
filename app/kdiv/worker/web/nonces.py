"""The nonces of peers' signed requests already taken (`kdiv.worker.web.auth`): each kept while
its request's time is inside the window, so a replay within the window is refused.

Checking one costs O(1) amortised: the nonces are in a dict, and in a queue in the order they
were taken, from whose front the expired ones are forgotten. A nonce may be kept longer than
its own expiry, behind one taken earlier that expires later, but never more than two windows
after it was taken (a request's time is at most one window ahead). At most `capacity` are kept:
when that many are unexpired a new one is refused, not taken by forgetting one whose replay
would then pass. Pure: time is given.
"""

from __future__ import annotations

from collections import deque

# About 200 bytes each (a 32-character hex nonce, a dict slot, a queue entry): ~10 MB full,
# for over 800 signed requests a second sustained through a 30 s window (its lifetime at most 2 windows).
MAX_SPENT_NONCES = 50_000


class SpentNonces:
    def __init__(self, capacity: int = MAX_SPENT_NONCES) -> None:
        if capacity < 1:
            raise ValueError(f"capacity {capacity} keeps no nonce")
        self.capacity = capacity
        self._until: dict[str, int] = {}
        self._taken: deque[tuple[int, str]] = deque()  # (until, nonce), oldest first

    def __len__(self) -> int:
        return len(self._until)

    def take(self, nonce: str, until_ms: int, now_ms: int) -> bool:
        """True when `nonce` is new (it is kept until `until_ms`); False when it was taken
        before and has not expired, or when `capacity` nonces are kept (see `full`)."""
        self._forget_expired(now_ms)
        if nonce in self._until or len(self._until) >= self.capacity:
            return False
        self._until[nonce] = until_ms
        self._taken.append((until_ms, nonce))
        return True

    def full(self, now_ms: int) -> bool:
        """True when no nonce could be taken at `now_ms`."""
        self._forget_expired(now_ms)
        return len(self._until) >= self.capacity

    def _forget_expired(self, now_ms: int) -> None:
        taken = self._taken
        while taken and taken[0][0] < now_ms:
            del self._until[taken.popleft()[1]]
