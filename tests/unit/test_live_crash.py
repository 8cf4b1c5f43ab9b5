"""Property: a worker that crashes at any point of its writes, restores a prefix of them and
re-reads from its last committed offset reports exactly what an uncrashed worker reports.

The writes are made by the production `kdiv.worker.unit.UnitOfWork` into an in-memory sink
(`MemorySink`) that keeps them in one ordered log and fails at a chosen write or at the
release; the committed offset is one that a released commit returned (the unit of work
owns the offsets it covers).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdiv.div.record import ConsumedRecord
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import HEADER_NAME, ChecksumType, Kind, scan_div_header
from kdiv.incident.shape import Incident
from kdiv.state.tables import partition_key
from kdiv.worker.incidents import incidents_for
from kdiv.worker.live import LiveValidation
from kdiv.worker.unit import Change, UnitOfWork

TOPIC = "orders"
NOW = 1_700_000_000_000


@st.composite
def faulty_stream(draw) -> list[ConsumedRecord]:
    """One partition written by 1-3 producers, with push markers and injected faults."""
    stampers = [
        DivStamper(
            uuid.UUID(int=i + 1).bytes,
            checksum_type=ChecksumType.ADHASH,
            max_records_per_segment=draw(st.integers(2, 6)),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    out = []
    for n in range(draw(st.integers(5, 60))):
        stamper = draw(st.sampled_from(stampers))
        action = draw(st.sampled_from(["data"] * 8 + ["sop", "eop", "untracked"]))
        if action == "sop":
            out += stamper.control(TOPIC, 0, Kind.START_OF_PUSH, NOW + n)
        elif action == "eop":
            out += stamper.control(TOPIC, 0, Kind.END_OF_PUSH, NOW + n)
        elif action == "untracked":
            out.append(("untracked", b"k", b"v"))
        else:
            out += stamper.data(TOPIC, 0, b"k%d" % n, b"v%d" % n, NOW + n)
    for stamper in stampers:
        out += stamper.end_segment(TOPIC, 0, True, NOW + 100)

    records: list[ConsumedRecord] = []

    def append(key, value, headers):
        records.append(ConsumedRecord(TOPIC, 0, len(records), NOW, key, value, headers))

    for item in out:
        if isinstance(item, tuple):
            append(item[1], item[2], ())
            continue
        fault = draw(st.sampled_from(["none"] * 12 + ["drop", "dup", "corrupt", "malformed"]))
        if fault == "drop":
            continue
        if fault == "malformed":
            append(item.key, item.value, ((HEADER_NAME, b"\x01\x02"),))
            continue
        value = item.value
        if fault == "corrupt" and value:
            value = bytes([value[0] ^ 0xFF]) + value[1:]
        append(item.key, value, item.headers)
        if fault == "dup":
            append(item.key, item.value, item.headers)
    return records


class Crash(Exception):
    """The worker died at this write."""


class MemorySink:
    """A `StateSink` over one ordered log of (kind, key, value); it crashes before the write
    numbered `fail_at` (0: the first), or at the release when fewer writes come."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.fail_at: int | None = None
        # Crash at the first write after a release instead (after a push marker's early commit).
        self.fail_after_release = False
        self.steps: list[str] = []

    def _write(self, kind: str, key: bytes, value: object) -> None:
        if self.fail_at is not None:
            if self.fail_at == 0:
                raise Crash(kind)
            self.fail_at -= 1
        self.log.append((kind, key, value))

    async def send_ledger(self, topic: str, partition: int, entries: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        self.steps.append("ledger")
        for key, value in entries:
            self._write("ledger", key, value)
        return []

    async def send_observations(self, records: Sequence[tuple[bytes, bytes]]) -> list[Awaitable]:
        self.steps.append("observations")
        for key, value in records:
            self._write("observation", key, value)
        return []

    async def send_incidents(self, incidents: Sequence[Incident]) -> list[Awaitable]:
        self.steps.append("incidents")
        for incident in incidents:
            self._write("incident", incident.key, incident)
        return []

    async def write_state(
        self, topic: str, partition: int, changes: Sequence[Change], *, again: bool = False
    ) -> list[Awaitable]:
        self.steps.append("state")
        for key, value in changes:
            self._write("state", key, value)
        return []

    async def write_traces(self, partition: int, changes: Sequence[Change], *, again: bool = False) -> list[Awaitable]:
        self.steps.append("traces")
        for key, value in changes:
            self._write("trace", key, value)
        return []

    async def release(self) -> None:
        self.steps.append("release")
        if self.fail_at is not None:
            raise Crash("release")
        if self.fail_after_release:
            self.fail_after_release = False
            self.fail_at = 0


class Worker:
    """Validation of one partition, its writes made by the production unit of work."""

    def __init__(self, saved: dict[bytes, bytes], in_push: bool) -> None:
        self.live = LiveValidation(DataIntegrityValidator(start_in_push=in_push))
        self.live.load(TOPIC, 0, saved.items())

    async def run_unit(self, records: list[ConsumedRecord], sink: MemorySink, committable: list[int]) -> None:
        """Validate `records` and commit them, as the batch path does: a push marker commits
        what came before it first, each record taken is covered by the unit; the offsets each
        released commit lets commit are appended to `committable`."""
        unit = UnitOfWork()
        key = (TOPIC, 0)
        for record in records:
            if self.live.opens_unit(record):
                unit.cover(key, record.offset)
                await self._commit(unit.split([key]), sink, committable)
            result = self.live.process(record, NOW)
            unit.touch(key)
            if result is not None:
                unit.add_incidents(key, incidents_for(result, NOW))
            unit.cover(key, record.offset + 1)
        await self._commit(unit, sink, committable)

    async def _commit(self, unit: UnitOfWork, sink: MemorySink, committable: list[int]) -> None:
        await unit.gather(self.live, None, "")
        committed = await unit.commit(sink)
        if (TOPIC, 0) in committed.offsets:
            committable.append(committed.offsets[(TOPIC, 0)])


def _saved_state(log: list) -> dict[bytes, bytes]:
    saved: dict[bytes, bytes] = {}
    for kind, key, value in log:
        if kind == "state":
            if value is None:
                saved.pop(key, None)
            else:
                saved[key] = value
    return saved


async def _replay(records, unit_cuts, in_push, crash_points, committed_choices):
    """Run over `records` with crashes; returns (incidents by key, final saved state). After
    a crash the worker starts again at an offset some released commit returned (Faust
    commits the offsets a flush hands it, maybe not the last ones: commits are periodic)."""
    log: list = []
    sink = MemorySink(log)
    bounds = sorted({c for c in unit_cuts if 0 < c < len(records)} | {len(records)})
    crash_points = list(crash_points)
    committed_choices = list(committed_choices)

    worker = Worker({}, in_push)
    start = 0  # the next record's offset
    units_run = 0
    committable: list[int] = []  # offsets released commits let commit, in order
    while start < len(records):
        end = next(b for b in bounds if b > start)
        units_run += 1
        crashing = bool(crash_points) and crash_points[0] <= units_run
        if crashing:
            crash_points.pop(0)
            # Anywhere in this unit's writes, or at its release; past them: right after it.
            # One time in four: at the first write after a release (a push marker's early
            # commit), which the worker starts again from.
            choice = committed_choices.pop(0) if committed_choices else 0
            if choice % 4 == 3:
                sink.fail_after_release = True
            else:
                sink.fail_at = choice % 24
        try:
            await worker.run_unit(records[start:end], sink, committable)
        except Crash:
            pass
        start = end
        if not crashing:
            continue
        sink.fail_at, sink.fail_after_release = None, False
        committed = committable[-1] if committable else 0
        if committed_choices and committable:
            committed = committable[-1 - committed_choices.pop(0) % len(committable)]
        committable = [offset for offset in committable if offset <= committed]
        worker = Worker(_saved_state(log), in_push)
        start = committed
    incidents = {key: value for kind, key, value in log if kind == "incident"}
    return incidents, _saved_state(log)


def _comparable(incidents):
    return {k: replace(v, detected_at_ms=0) for k, v in incidents.items()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=faulty_stream(),
    in_push=st.booleans(),
    unit_cuts=st.lists(st.integers(0, 200), max_size=12),
    crash_points=st.lists(st.integers(1, 30), min_size=1, max_size=4).map(sorted),
    committed_choices=st.lists(st.integers(0, 1000), max_size=8),
)
def test_crash_at_any_write_changes_no_incident_and_no_state(
    records, in_push, unit_cuts, crash_points, committed_choices
):
    expected_incidents, expected_state = asyncio.run(_replay(records, unit_cuts, in_push, [], []))
    incidents, state = asyncio.run(_replay(records, unit_cuts, in_push, crash_points, committed_choices))
    assert _comparable(incidents) == _comparable(expected_incidents)
    assert state == expected_state


def _two_records_of_a_new_producer(producer: int) -> tuple[list[ConsumedRecord], LiveValidation]:
    """START_OF_SEGMENT and two data records of one producer, and a live validation with no state."""
    stamper = DivStamper(uuid.UUID(int=producer).bytes, checksum_type=ChecksumType.ADHASH)
    out = stamper.data(TOPIC, 0, b"k", b"v", NOW) + stamper.data(TOPIC, 0, b"k", b"w", NOW)
    records = [ConsumedRecord(TOPIC, 0, i, NOW, o.key, o.value, o.headers) for i, o in enumerate(out)]
    live = LiveValidation(DataIntegrityValidator())
    live.load(TOPIC, 0, [])
    return records, live


def test_a_replayed_record_is_skipped_not_reported_duplicate():
    records, live = _two_records_of_a_new_producer(7)
    assert [live.process(r, NOW).verdict.value for r in records] == ["OK", "OK", "OK"]
    saved = dict(live.take_writes(TOPIC, 0).in_order())
    assert partition_key(TOPIC, 0) in saved

    restarted = LiveValidation(DataIntegrityValidator())
    restarted.load(TOPIC, 0, saved.items())
    assert [restarted.process(r, NOW) for r in records] == [None, None, None]
    assert restarted.replays_skipped == 3
    # A producer retry at a new offset is still a duplicate.
    retry = replace(records[-1], offset=3)
    assert restarted.process(retry, NOW).verdict.value == "DUPLICATE"


def test_producer_state_lost_after_partition_state_is_brought_forward_without_recounting():
    records, live = _two_records_of_a_new_producer(8)
    for r in records:
        live.process(r, NOW)
    writes = live.take_writes(TOPIC, 0).in_order()
    only_partition = dict(writes[:1])  # the crash kept the partition state, not the producer's

    restarted = LiveValidation(DataIntegrityValidator())
    restarted.load(TOPIC, 0, only_partition.items())
    assert [restarted.process(r, NOW).verdict.value for r in records] == ["OK", "OK", "OK"]
    assert restarted.validator.partition(TOPIC, 0).records == 3


def test_a_replay_is_judged_in_the_phase_it_was_first_judged_in():
    """A fault just before another producer's START_OF_PUSH stays a warning when replayed
    after a crash that kept the partition state but not the faulty producer's."""
    a = DivStamper(uuid.UUID(int=1).bytes, checksum_type=ChecksumType.ADHASH)
    b = DivStamper(uuid.UUID(int=2).bytes, checksum_type=ChecksumType.ADHASH)
    out = a.data(TOPIC, 0, b"k", b"0", NOW) + a.data(TOPIC, 0, b"k", b"1", NOW)
    out += a.data(TOPIC, 0, b"k", b"2", NOW) + b.control(TOPIC, 0, Kind.START_OF_PUSH, NOW)
    del out[2]  # a's seq 1 is lost: its seq 2 is MISSING, a warning outside a push
    records = [ConsumedRecord(TOPIC, 0, i, NOW, o.key, o.value, o.headers) for i, o in enumerate(out)]
    first, batch = records[:2], records[2:]

    live = LiveValidation(DataIntegrityValidator())
    live.load(TOPIC, 0, [])
    for r in first:
        live.process(r, NOW)
    saved = dict(live.take_writes(TOPIC, 0).in_order())
    units = []  # the batch's writes, unit by unit, as the worker makes them
    results = []
    for r in batch:
        if live.opens_unit(r):
            units.append(live.take_writes(TOPIC, 0).in_order())
        results.append(live.process(r, NOW))
    units.append(live.take_writes(TOPIC, 0).in_order())
    assert (results[0].verdict.value, results[0].fatal) == ("MISSING", False)

    # Crash after the first write of the batch: a partition state, not producer a's.
    saved.update(units[0][:1])
    restarted = LiveValidation(DataIntegrityValidator())
    restarted.load(TOPIC, 0, saved.items())
    replayed = restarted.process(batch[0], NOW)
    assert (replayed.verdict.value, replayed.fatal) == ("MISSING", False)


def test_loaded_state_is_written_again_with_the_first_unit():
    """A kept local store may be ahead of the changelog; the first unit after a load sends
    every loaded key again, so the changelog catches up even if every replay is skipped."""
    records, live = _two_records_of_a_new_producer(9)
    for r in records:
        live.process(r, NOW)
    saved = dict(live.take_writes(TOPIC, 0).in_order())

    restarted = LiveValidation(DataIntegrityValidator())
    restarted.load(TOPIC, 0, saved.items())
    assert restarted.process(records[-1], NOW) is None  # a replay, skipped
    assert dict(restarted.take_writes(TOPIC, 0).in_order()) == saved
    assert restarted.take_writes(TOPIC, 0) is None


class _Audit:
    """The pipeline audit as a unit of work takes from it: observations and trace changes."""

    def take_observations(self, topic: str, partition: int) -> list[tuple[bytes, bytes]]:
        return [(b"trace", b"observed")]

    def take_changes(self, partition: int) -> list[Change]:
        return [(b"open", b"state")]


def test_commit_writes_in_the_protocols_numbered_steps():
    records, _ = _two_records_of_a_new_producer(10)
    live = LiveValidation(DataIntegrityValidator(), ledger_topics=frozenset({TOPIC}))
    live.load(TOPIC, 0, [])
    unit = UnitOfWork()
    for record in records:
        live.process(record, NOW)
    unit.touch((TOPIC, 0))
    unit.touch(("observations", 3))
    unit.add_incidents((TOPIC, 0), incidents_for(live.process(replace(records[-1], offset=3), NOW), NOW))
    asyncio.run(unit.gather(live, _Audit(), "observations"))
    sink = MemorySink([])
    committed = asyncio.run(unit.commit(sink))
    assert sink.steps == ["ledger", "observations", "incidents", "state", "traces", "release"]
    kinds = [kind for kind, _, _ in sink.log]
    assert kinds == ["ledger", "observation", "incident", "state", "state", "trace"]
    assert sink.log[3][1] == partition_key(TOPIC, 0)  # the partition state before its producer's
    assert (committed.incidents, committed.ledger_entries, committed.state_writes) == (1, 1, 2)
    assert not unit and unit.partitions == []


class _Unacknowledged(MemorySink):
    async def send_incidents(self, incidents: Sequence[Incident]) -> list[Awaitable]:
        await super().send_incidents(incidents)
        failed: asyncio.Future = asyncio.get_running_loop().create_future()
        failed.set_exception(Crash("incident not acknowledged"))
        return [failed]


def test_an_unacknowledged_incident_stops_the_commit_before_the_state():
    records, live = _two_records_of_a_new_producer(11)
    unit = UnitOfWork()
    for record in records:
        live.process(record, NOW)
    result = live.process(replace(records[-1], offset=3), NOW)  # a DUPLICATE
    unit.add_incidents((TOPIC, 0), incidents_for(result, NOW))
    asyncio.run(unit.gather(live, None, ""))
    sink = _Unacknowledged([])
    with pytest.raises(Crash):
        asyncio.run(unit.commit(sink))
    assert sink.steps == ["incidents"] and [kind for kind, _, _ in sink.log] == ["incident"]


def test_bring_forward_applies_a_record_to_its_producer_and_leaves_the_partition_as_saved():
    records, live = _two_records_of_a_new_producer(12)
    validator = live.validator
    live.process(records[0], NOW)
    part = validator.partition(TOPIC, 0)
    before = (part.in_push, part.push_failed, part.last_offset, part.records, dict(part.verdict_counts))
    duplicate = replace(records[0], offset=1)  # seen again: a DUPLICATE, counted by validate
    found, raw = scan_div_header(duplicate.headers)
    result = validator.bring_forward(duplicate, NOW, found, raw)
    assert result.verdict.value == "DUPLICATE"
    assert (part.in_push, part.push_failed, part.last_offset, part.records, dict(part.verdict_counts)) == before
    result = validator.bring_forward(records[1], NOW, *scan_div_header(records[1].headers))
    assert result.verdict.value == "OK"
    assert validator.partitions[(TOPIC, 0)].tracker.segment(result.guid).last_offset == 1
    assert (part.last_offset, part.records) == before[2:4]


def test_the_unit_owns_its_offsets_through_split_failure_and_seek():
    """The offsets a unit covers are what its commit returns, once written: a split takes
    them with the work, a failed commit returns none and keeps them, a seek drops them."""
    unit = UnitOfWork()
    a, b = (TOPIC, 0), (TOPIC, 1)
    unit.cover(a, 10)
    unit.cover(b, 7)
    early = unit.split([a])
    assert asyncio.run(early.commit(MemorySink([]))).offsets == {a: 10}
    unit.cover(a, 15)
    failing = MemorySink([])
    failing.fail_at = 0
    with pytest.raises(Crash):
        asyncio.run(unit.commit(failing))
    assert asyncio.run(unit.commit(MemorySink([]))).offsets == {a: 15, b: 7}
    unit.cover(a, 20)
    unit.touch(b)
    unit.uncover(a)  # read again from elsewhere: nothing it took may commit
    assert asyncio.run(unit.commit(MemorySink([]))).offsets == {}
