"""What a client may hold of a worker's web server, decided without I/O (time is given):
which connection a new one takes the place of at the cap, and which client faults are logged
as a line of their own and which as a count.

At the cap (KDIV_WEB_MAX_CONNECTIONS) a new connection is not refused while some open one
has no request under way: the one longest in that state (idle, or still sending its request
head) is closed for it. So connections held open without asking anything (slow clients, or a
flood of them) cannot keep a health probe out: it takes the place of the oldest of them. Only
when every connection is answering a request is the new one refused. The web server's file
descriptors stay at the cap (plus the connections accepted in one turn of the event loop),
well under the process' limit, so the worker's own files and sockets are never starved.

The server (`kdiv.worker.faustcompat.webserver`) applies these; the module is pure.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)

# The kinds of client fault counted, in the order a count line names them.
MALFORMED = "malformed requests"
HEADER_TIMEOUT = "request heads not sent whole in time"
EVICTED = "connections closed at the cap for a new one"
REFUSED = "connections refused at the cap"
FAULT_KINDS = (MALFORMED, HEADER_TIMEOUT, EVICTED, REFUSED)
# One fault of each kind, as its own log line names it.
ONE_FAULT = {
    MALFORMED: "malformed request",
    HEADER_TIMEOUT: "request head not sent whole in time",
    EVICTED: "connection closed at the cap for a new one",
    REFUSED: "connection refused at the cap",
}


@dataclass(frozen=True, slots=True)
class WebBounds:
    """The bounds, from the KDIV_WEB_* settings."""

    header_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    fault_log_interval_s: float

    @classmethod
    def from_settings(cls, settings) -> WebBounds:
        return cls(
            settings.web_header_timeout_s,
            settings.web_idle_timeout_s,
            settings.web_max_connections,
            settings.web_fault_log_interval_s,
        )


def descriptor_shortage(cap: int, soft_limit: int) -> str | None:
    """Why the cap does not leave the worker's own files and sockets enough descriptors
    (half the process' limit is kept for them), or None when it does."""
    if soft_limit < 0 or cap <= soft_limit // 2:  # negative: no limit
        return None
    return (
        f"KDIV_WEB_MAX_CONNECTIONS={cap} is more than half the process' open file limit ({soft_limit}): "
        "the web server's connections could starve the worker's RocksDB files and Kafka sockets; "
        "lower it or raise the limit (ulimit -n)"
    )


@dataclass(frozen=True, slots=True)
class Admission(Generic[C]):
    """What becomes of a new connection: admitted or not, and the one closed for it."""

    admitted: bool
    evicted: C | None = None


class ConnectionTable(Generic[C]):
    """The open connections, each either waiting (no request under way: idle, or sending its
    request head) or busy (a request being answered), at most `cap` of them."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"a cap of {cap} connections admits none")
        self.cap = cap
        # Waiting connections, oldest first (a dict keeps insertion order; a connection that
        # starts waiting again is put at the end).
        self._waiting: dict[C, None] = {}
        self._busy: set[C] = set()

    def __len__(self) -> int:
        return len(self._waiting) + len(self._busy)

    def open(self, connection: C) -> Admission[C]:
        """A new connection: admitted when under the cap or in place of the oldest waiting one."""
        evicted = None
        if len(self) >= self.cap:
            if not self._waiting:
                return Admission(False)
            evicted = next(iter(self._waiting))
            del self._waiting[evicted]
        self._waiting[connection] = None
        return Admission(True, evicted)

    def busy(self, connection: C) -> None:
        """The connection's request is being answered: it is not closed for another."""
        if self._waiting.pop(connection, False) is None:
            self._busy.add(connection)

    def waiting(self, connection: C) -> None:
        """The connection has no request under way (its answer is sent)."""
        if connection in self._busy:
            self._busy.discard(connection)
            self._waiting[connection] = None

    def close(self, connection: C) -> None:
        self._waiting.pop(connection, None)
        self._busy.discard(connection)

    def is_waiting(self, connection: C) -> bool:
        return connection in self._waiting


class FaultTally:
    """Client faults, logged without flooding: the first of each kind in an interval is a line
    of its own; the interval's total, when there were more, is one line at its end."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._counts: dict[str, int] = {}
        self._ends: float | None = None

    @property
    def interval_ends(self) -> float | None:
        """When the current interval ends (None: no fault since the last count)."""
        return self._ends

    def record(self, kind: str, now: float) -> bool:
        """Count a fault; True when it is the first of its kind in the interval (log it)."""
        if self._ends is None:
            self._ends = now + self.interval_s
        count = self._counts.get(kind, 0) + 1
        self._counts[kind] = count
        return count == 1

    def summary(self, now: float) -> str | None:
        """At the interval's end: the line of its counts when some fault was not logged on its
        own (None otherwise); the next fault starts a new interval."""
        if self._ends is None or now < self._ends:
            return None
        counts, self._counts, self._ends = self._counts, {}, None
        if all(n == 1 for n in counts.values()):
            return None
        named = ", ".join(f"{counts[kind]:,} {kind}" for kind in FAULT_KINDS if kind in counts)
        return f"web clients in the last {self.interval_s:g} s: {named}"
