"""What a checkpoint asks of a partition's producer timestamps, without walking every producer.

A checkpoint (`DataIntegrityValidator.checkpoint`) asks two things of the last producer
timestamps of a partition's producers: which are older than the maxAge threshold (to expire
them), and the latest one not past the credible bound (the next checkpoint's anchor). Asked of
every producer, each state write of a partition cost a walk of all its producers, packed or
not: with 1,000 producers a partition and 1,000 partitions a commit touches a few records of
each, so the walk, not the records, set the cost of a record of a known producer.

`ProducerTimes` keeps, from the last walk, bounds that stay true as producers change: a
timestamp no tracked producer is older than, the latest credible timestamp and which producer
holds it, and a timestamp no producer past the credible bound is older than. The producers
changed since the last checkpoint are folded in; where the bounds can no longer answer exactly
(the latest one's producer left, or its clock went back, or the credible bound reached a
producer that was past it, or a producer may be old enough to expire) the checkpoint walks
every producer as before and the bounds are taken again from that walk. Every answer is the
walk's: `tests/unit/test_producer_times.py` holds both to the same checkpoints.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

# Past every timestamp (a bound with no producer behind it).
NEVER = 1 << 63


@dataclass(slots=True)
class ProducerTimes:
    """Bounds on one partition's last producer timestamps, true since the last walk."""

    # False: the next checkpoint walks every producer (nothing known yet, or a bound broken).
    exact: bool = False
    # No tracked producer's last timestamp is below this.
    oldest: int = NEVER
    # The latest last timestamp not past the credible bound (-1: none), and whose it is.
    latest: int = -1
    latest_guid: bytes | None = None
    # No producer past the credible bound (at the last walk, or changed since) is below this.
    ahead: int = NEVER
    # The credible bound the bounds were last taken under (None: none, every producer counts).
    credible: int | None = None

    def forget(self) -> None:
        """The producers changed other than by the records folded in (installed, rewound)."""
        self.exact = False

    def removed(self, guids: list[bytes]) -> None:
        """These producers are no longer tracked (evicted, expired)."""
        if self.latest_guid is not None and self.latest_guid in guids:
            self.exact = False

    def fold(self, guid: bytes, ts: int | None, credible: int | None) -> None:
        """A producer changed since the last checkpoint: its last timestamp now (None: no
        longer tracked)."""
        if ts is None:
            if guid == self.latest_guid:
                self.exact = False
            return
        if ts < self.oldest:
            self.oldest = ts
        if credible is not None and ts > credible:
            if ts < self.ahead:
                self.ahead = ts
            if guid == self.latest_guid:
                self.exact = False  # the latest one left the credible ones
        elif ts >= self.latest:
            self.latest, self.latest_guid = ts, guid
        elif guid == self.latest_guid:
            self.exact = False  # the latest one's clock went back

    def answers(self, threshold: int | None, credible: int | None) -> bool:
        """Whether the bounds answer this checkpoint exactly: no producer can be old enough
        to expire, and none past the credible bound can have come within it."""
        if not self.exact:
            return False
        if threshold is not None and self.oldest < threshold:
            return False
        if credible is None or self.credible is None:
            # Uncapped now and then, or a cap where there was none (or the reverse).
            return credible is None and self.credible is None
        return self.credible <= credible < self.ahead

    def answered(self, credible: int | None) -> None:
        """The bounds answered a checkpoint under this credible bound."""
        self.credible = credible

    def walked(self, times: list[tuple[int, bytes]], credible: int | None) -> None:
        """The bounds taken again from every tracked producer's (last timestamp, GUID)."""
        oldest, latest, latest_guid, ahead = NEVER, -1, None, NEVER
        for ts, guid in times:
            if ts < oldest:
                oldest = ts
            if credible is not None and ts > credible:
                if ts < ahead:
                    ahead = ts
            elif ts > latest or (ts == latest and latest_guid is None):
                latest, latest_guid = ts, guid
        self.exact, self.oldest, self.latest, self.latest_guid = True, oldest, latest, latest_guid
        self.ahead, self.credible = ahead, credible
