"""A commit that fails on the broker or passes its bound is written again, whole, under the
same keys: no incident doubled (the readers keep one per key), none lost, and a retry sends
every tombstone (a delete may be in the store while its changelog record is not)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

import pytest
from aiokafka.errors import RequestTimedOutError

from kdiv.incident.shape import Incident
from kdiv.worker.unit import Change, CommitFailures, CommitTimedOut, PartitionWork, UnitOfWork

KEY = ("orders", 0)


def _incident(n: int) -> Incident:
    return Incident("orders", 0, None, None, None, "MISSING", n, "warning", f"gap {n}", None, 1_700_000_000_000)


class FlakySink:
    """Fails the first `failures` state writes with a broker timeout; can hang an ack."""

    def __init__(self, failures: int = 0, hang: bool = False) -> None:
        self.failures = failures
        self.hang = hang
        self.incidents: list[bytes] = []
        self.state: list[tuple[Change, bool]] = []
        self.released = 0

    async def send_ledger(self, topic: str, partition: int, entries: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        return []

    async def send_observations(self, records: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        return []

    async def send_incidents(self, incidents: Sequence[Incident]) -> list[Awaitable]:
        self.incidents += [i.key for i in incidents]
        return []

    async def write_state(
        self, topic: str, partition: int, changes: Sequence[Change], *, again: bool = False
    ) -> list[Awaitable]:
        if self.failures:
            self.failures -= 1
            raise RequestTimedOutError()
        self.state += [(change, again) for change in changes]
        if self.hang:
            return [asyncio.get_running_loop().create_future()]  # never acknowledged
        return []

    async def write_traces(self, partition: int, changes: Sequence[Change], *, again: bool = False) -> list[Awaitable]:
        return []

    async def release(self) -> None:
        self.released += 1


def _unit() -> UnitOfWork:
    unit = UnitOfWork()
    unit.add_incidents(KEY, [_incident(1), _incident(2)])
    work: PartitionWork = unit._work[KEY]
    work.state += [(b"p", b"state"), (b"gone", None)]
    work.has_state = True
    return unit


def test_a_failed_commit_keeps_the_unit_and_the_retry_writes_it_whole_with_tombstones():
    async def run():
        unit, sink = _unit(), FlakySink(failures=1)
        with pytest.raises(RequestTimedOutError):
            await unit.commit(sink)
        assert unit.partitions == [KEY] and sink.released == 0
        committed = await unit.commit(sink)
        return unit, sink, committed

    unit, sink, committed = asyncio.run(run())
    assert not unit and sink.released == 1
    # The incidents went twice, under the same keys: the readers keep one each.
    assert len(sink.incidents) == 4 and len(set(sink.incidents)) == 2
    assert committed.incidents == 2
    assert sink.state == [((b"p", b"state"), True), ((b"gone", None), True)]


def test_a_commit_past_its_bound_times_out_and_keeps_its_work():
    async def run():
        unit, sink = _unit(), FlakySink(hang=True)
        with pytest.raises(CommitTimedOut):
            await unit.commit(sink, timeout_s=0.05)
        return unit, sink

    unit, sink = asyncio.run(run())
    assert unit.partitions == [KEY] and unit.failed_commits == 1 and sink.released == 0


def test_a_split_of_a_failed_unit_writes_again_too():
    unit = _unit()
    unit.failed_commits = 1
    assert unit.split([KEY]).failed_commits == 1


def test_failures_are_one_run_logged_once_and_ended_by_a_success():
    failures = CommitFailures()
    assert failures.failed(TimeoutError(), 1000) is True
    assert failures.failed(RequestTimedOutError(), 3000) is False
    assert (failures.since_ms, failures.attempts) == (1000, 2)
    assert failures.succeeded() == (1000, 2)
    assert failures.since_ms is None and failures.succeeded() == (None, 0)
