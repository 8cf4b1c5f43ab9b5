"""Property: a worker that crashes at any point of its writes, restores a prefix of them and
re-reads from its last committed offset reports exactly what an uncrashed worker reports.

The simulation follows `kdiv.worker.live`'s protocol: per unit, incidents are written, then the
partition state, then the producer states, into one ordered log; a crash keeps a prefix of
that log; the committed offset is that of some unit whose writes were all kept.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdiv.div.record import ConsumedRecord
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import HEADER_NAME, ChecksumType, Kind
from kdiv.state.tables import partition_key
from kdiv.worker.incidents import incidents_for
from kdiv.worker.live import LiveValidation

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


class SimulatedWorker:
    """A worker on a persisted log: writes go to `log`; state is restored from a prefix of it."""

    def __init__(self, saved: dict[bytes, bytes], in_push: bool) -> None:
        self.live = LiveValidation(DataIntegrityValidator(start_in_push=in_push))
        self.live.load(TOPIC, 0, saved.items())

    def run_unit(self, unit: list[ConsumedRecord], log: list) -> None:
        incidents: list = []
        writes: list = []
        for record in unit:
            if self.live.opens_unit(record):
                writes.append(self._flush(incidents))
                incidents = []
            result = self.live.process(record, NOW)
            if result is not None:
                incidents.extend(incidents_for(result, NOW))
        writes.append(self._flush(incidents))
        for batch in writes:
            log.extend(batch)

    def _flush(self, incidents) -> list:
        batch = [("incident", i.key, i) for i in incidents]
        writes = self.live.take_writes(TOPIC, 0)
        if writes is not None:
            batch += [("state", k, v) for k, v in writes.in_order()]
        return batch


def _replay(records, unit_cuts, in_push, crash_points, committed_choices):
    """Run over `records` with crashes; returns (incidents by key, final saved state)."""
    log: list = []
    saved_state: dict[bytes, bytes] = {}
    incidents: dict[bytes, object] = {}
    bounds = [0, *[c for c in unit_cuts if 0 < c < len(records)], len(records)]
    units = [records[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    crash_points = list(crash_points)
    committed_choices = list(committed_choices)

    worker = SimulatedWorker({}, in_push)
    position = 0  # next unit to run
    # (unit index after which the log length was n): used to pick committed offsets
    unit_ends: list[tuple[int, int]] = []
    while position < len(units):
        start_len = len(log)
        worker.run_unit(units[position], log)
        unit_ends.append((position, len(log)))
        position += 1
        if crash_points and crash_points[0] <= position:
            crash_points.pop(0)
            # Keep a prefix of the log, cut anywhere inside this unit's writes.
            keep = start_len + (committed_choices.pop(0) if committed_choices else 0) % (len(log) - start_len + 1)
            del log[keep:]
            # Committed: the last unit whose writes all survived (Faust commits after a flush).
            survived = [u for u, n in unit_ends if n <= keep]
            committed_unit = survived[-1] if survived else -1
            if committed_choices and committed_unit >= 0:
                committed_unit -= committed_choices.pop(0) % (committed_unit + 1)
            unit_ends = [(u, n) for u, n in unit_ends if u <= committed_unit]
            saved_state = {}
            for kind, key, value in log:
                if kind == "state":
                    if value is None:
                        saved_state.pop(key, None)
                    else:
                        saved_state[key] = value
            worker = SimulatedWorker(saved_state, in_push)
            position = committed_unit + 1
    for kind, key, value in log:
        if kind == "incident":
            incidents[key] = value
        elif value is None:
            saved_state.pop(key, None)
        else:
            saved_state[key] = value
    return incidents, saved_state


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
    expected_incidents, expected_state = _replay(records, unit_cuts, in_push, [], [])
    incidents, state = _replay(records, unit_cuts, in_push, crash_points, committed_choices)
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
