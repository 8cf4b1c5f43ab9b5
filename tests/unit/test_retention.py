"""Records deleted before validation: the range found once and accounted for, and each
producer's next loss naming it, in both semantics, inside a push and out."""

from __future__ import annotations

import uuid

from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from kdiv.div.faults import Verdict
from kdiv.div.record import ConsumedRecord, consumed
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator, Semantics, ValidationResult
from kdiv.div.wire import Kind
from kdiv.incident.shape import Incident
from kdiv.state.values import StateValues
from kdiv.worker.faustcompat.epochs import fetched_span
from kdiv.worker.faustcompat.parsed import in_bulk
from kdiv.worker.incidents import DELETED_BEFORE_VALIDATION, deletion_incident, incidents_for
from kdiv.worker.live import LiveValidation
from kdiv.worker.retention import Deletion
from tests.harness.streams import GUID_A, GUID_B, NOW, Log
from tests.unit.test_parsed_records import batch

GUID_C = uuid.UUID("00000000-0000-4000-8000-00000000000c").bytes
GUID_D = uuid.UUID("00000000-0000-4000-8000-00000000000d").bytes
NOTE = "deleted before validation"


def new_live(semantics: Semantics = Semantics.EXACT, *, in_push: bool = False) -> LiveValidation:
    live = LiveValidation(DataIntegrityValidator(semantics=semantics, start_in_push=in_push), StateValues(7))
    live.load("orders", 0, [])
    return live


def judge(live: LiveValidation, records: list[ConsumedRecord]) -> list[Incident]:
    """What the worker does with one fetched batch (`BatchPath._validate_div`, `_observe`):
    the bulk path watching the producers behind a deletion, one by one where it stops, and
    every result's incidents with the deletion its loss lies in."""
    watch = live.producers_behind_deletions("orders", 0)
    results: list[ValidationResult] = []
    i = 0
    while True:
        i = live.process_run("orders", 0, records, i, NOW, watch, results)
        if i == len(records):
            break
        result = live.process(consumed("orders", 0, records[i]), NOW)
        if result is not None:
            results.append(result)
        i += 1
    return [
        incident
        for result in results
        for incident in incidents_for(result, NOW, live.deletion_behind(result) if live.behind_deletions else None)
    ]


def segments_started(log: Log, guids: list[bytes]) -> list[ConsumedRecord]:
    return [log.control(Kind.START_OF_SEGMENT, 0, 0, guid=guid) for guid in guids]


def data(log: Log, guid: bytes, seqs: range) -> list[ConsumedRecord]:
    return [log.data(0, seq, guid=guid) for seq in seqs]


def deleted(log: Log, records: list[ConsumedRecord]) -> None:
    """`records` were written, then deleted before anyone read them: their offsets are gone."""
    assert records and records[-1].offset == log.next_offset[0] - 1


def test_a_deletion_past_the_last_validated_offset_is_found_once_and_accounted_for():
    live = new_live()
    assert live.validated_to("orders", 0) is None  # nothing validated: no position to pass
    assert live.log_starts_at("orders", 0, 50, "fetch", "-") is None
    log = Log("orders")
    assert judge(live, segments_started(log, [GUID_A]) + data(log, GUID_A, range(1, 11))) == []
    assert live.validated_to("orders", 0) == 10

    assert live.log_starts_at("orders", 0, 11, "fetch", "-") is None  # the next offset: nothing deleted
    assert live.log_starts_at("orders", 0, 5, "fetch", "-") is None  # deleted after validation
    found = live.log_starts_at("orders", 0, 40, "fetch", "the consumer read offset 40 next after offset 10")
    assert found == Deletion("orders", 0, 11, 39, "fetch", "the consumer read offset 40 next after offset 10", False)
    # Accounted for as read: found once, and saved with the partition's next unit.
    assert live.validated_to("orders", 0) == 39
    assert live.log_starts_at("orders", 0, 40, "log start poll", "-") is None
    writes = live.take_writes("orders", 0)
    assert writes is not None
    again = LiveValidation(DataIntegrityValidator(), StateValues(7))
    again.load("orders", 0, [(k, v) for k, v in writes.in_order() if v is not None])
    assert again.resume_offset("orders", 0) == 40

    incident = deletion_incident(found, NOW)
    assert (incident.verdict, incident.offset, incident.severity, incident.producer) == (
        DELETED_BEFORE_VALIDATION,
        11,
        "warning",
        None,
    )
    assert "offsets 11..39 (29 offsets) were deleted" in incident.detail
    assert "found by fetch: the consumer read offset 40 next after offset 10" in incident.detail


def test_found_again_after_a_crash_it_is_the_same_incident_key():
    """A crash after the incident was written but before the state: the restarted worker
    finds it again from its saved offset, under the same key (a wider range if the log start
    moved on meanwhile); once the state is saved, not at all."""
    live = new_live()
    log = Log("orders")
    judge(live, segments_started(log, [GUID_A]) + data(log, GUID_A, range(1, 11)))
    saved = live.take_writes("orders", 0)
    assert saved is not None
    found = live.log_starts_at("orders", 0, 40, "fetch", "-")
    assert found is not None
    first = deletion_incident(found, NOW)

    restarted = LiveValidation(DataIntegrityValidator(), StateValues(7))
    restarted.load("orders", 0, [(k, v) for k, v in saved.in_order() if v is not None])
    again = restarted.log_starts_at("orders", 0, 60, "fetch", "-")
    assert again is not None and (again.first_offset, again.last_offset) == (11, 59)
    assert deletion_incident(again, NOW + 5).key == first.key


def test_each_producers_next_missing_says_its_records_were_deleted_and_nothing_else_does():
    live = new_live()
    log = Log("orders")
    before = segments_started(log, [GUID_A, GUID_B, GUID_D])
    for seqs in (range(1, 6),):
        before += data(log, GUID_A, seqs) + data(log, GUID_B, seqs) + data(log, GUID_D, seqs)
    assert judge(live, before) == []
    last_validated = log.next_offset[0] - 1
    # Written, then deleted before the worker read them: A's seq 6..8, B's seq 6..7. D wrote nothing.
    gone = data(log, GUID_A, range(6, 9)) + data(log, GUID_B, range(6, 8))
    deleted(log, gone)
    start = log.next_offset[0]
    found = live.log_starts_at("orders", 0, start, "fetch", "-")
    assert found is not None and (found.first_offset, found.last_offset) == (last_validated + 1, start - 1)

    # After the log start: D in order, a new producer C, then A and B go on.
    after = data(log, GUID_D, range(6, 9)) + segments_started(log, [GUID_C]) + data(log, GUID_C, range(1, 4))
    after += data(log, GUID_A, range(9, 12)) + data(log, GUID_B, range(8, 10))
    incidents = judge(live, after)
    assert sorted((i.verdict, i.producer, i.seq) for i in incidents) == [
        ("MISSING", GUID_A.hex(), 6),
        ("MISSING", GUID_B.hex(), 6),
    ]
    assert all(NOTE in i.detail and f"offsets {last_validated + 1}..{start - 1}" in i.detail for i in incidents)
    assert "seq 6..8 of segment 0 missing (3 records)" in incidents[0].detail + incidents[1].detail
    assert live.producers_behind_deletions("orders", 0) == set()  # every producer has been seen since

    # A loss of D's (seen since the deletion, in order) is the pipeline's: a plain MISSING.
    later = judge(live, data(log, GUID_D, range(10, 11)) + data(log, GUID_A, range(13, 14)))
    assert sorted((i.verdict, i.producer, i.seq) for i in later) == [
        ("MISSING", GUID_A.hex(), 12),
        ("MISSING", GUID_D.hex(), 9),
    ]
    assert not any(NOTE in i.detail for i in later)


def test_inside_a_push_the_deletion_is_fatal_and_the_gaps_incident_keeps_its_note():
    live = new_live(in_push=True)
    log = Log("orders")
    judge(live, segments_started(log, [GUID_A]) + data(log, GUID_A, range(1, 6)))
    deleted(log, data(log, GUID_A, range(6, 9)))
    found = live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-")
    assert found is not None and deletion_incident(found, NOW).severity == "fatal"

    # Inside a push Venice's state stays before the gap: each later record is judged after
    # it, and the gap's one incident is written again as it grows, the note kept each time.
    incidents = judge(live, data(log, GUID_A, range(9, 13)))
    assert {(i.verdict, i.seq, i.severity) for i in incidents} == {("MISSING", 6, "fatal")}
    assert len({i.key for i in incidents}) == 1 and len(incidents) == 4
    assert all(NOTE in i.detail for i in incidents)
    assert "3 later records of the producer judged after it" in incidents[-1].detail


def test_venice_semantics_keeps_its_verdicts_and_only_adds_the_note():
    live = new_live(Semantics.VENICE, in_push=True)
    log = Log("orders")
    judge(
        live, segments_started(log, [GUID_A, GUID_B]) + data(log, GUID_A, range(1, 4)) + data(log, GUID_B, range(1, 4))
    )
    deleted(log, data(log, GUID_A, range(4, 6)))
    assert live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-") is not None
    incidents = judge(live, data(log, GUID_A, range(6, 9)) + data(log, GUID_B, range(4, 6)))
    # Venice's rule inside a push: every later record of A is MISSING, one incident each;
    # all of them for the one gap the deletion made. B lost nothing.
    assert [(i.verdict, i.producer, i.seq) for i in incidents] == [("MISSING", GUID_A.hex(), s) for s in (6, 7, 8)]
    assert all(NOTE in i.detail for i in incidents)
    assert "seq 6 follows seq 3" in incidents[0].detail


def test_venice_semantics_outside_a_push_notes_the_first_loss_only():
    live = new_live(Semantics.VENICE)
    log = Log("orders")
    judge(live, segments_started(log, [GUID_A]) + data(log, GUID_A, range(1, 4)))
    deleted(log, data(log, GUID_A, range(4, 6)))
    assert live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-") is not None
    incidents = judge(live, data(log, GUID_A, range(6, 9)) + data(log, GUID_A, range(10, 11)))
    assert [(i.verdict, i.seq, NOTE in i.detail) for i in incidents] == [("MISSING", 6, True), ("MISSING", 10, False)]


def test_a_segment_whose_start_was_deleted_is_noted_too():
    """The producer's segment 0 ended before the deletion; segment 1's START_OF_SEGMENT and
    first records were deleted: its next record is UNREGISTERED_PRODUCER, for that reason."""
    live = new_live()
    log = Log("orders")
    stamper = DivStamper(GUID_A)
    for n in range(3):
        log.add_outgoing(stamper.data("orders", 0, b"k%d" % n, b"v", NOW))
    log.add_outgoing(stamper.end_segment("orders", 0, False, NOW))
    assert judge(live, list(log.records)) == []
    gone = [r for n in range(3, 5) for r in log.add_outgoing(stamper.data("orders", 0, b"k%d" % n, b"v", NOW))]
    deleted(log, gone)  # START_OF_SEGMENT 1, seq 1 and 2
    assert live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-") is not None
    incidents = judge(live, log.add_outgoing(stamper.data("orders", 0, b"k5", b"v", NOW)))
    assert [(i.verdict, i.segment, i.seq, NOTE in i.detail) for i in incidents] == [
        ("UNREGISTERED_PRODUCER", 1, 3, True)
    ]


def test_a_producer_behind_a_deletion_is_forgotten_with_its_partition():
    live = new_live()
    log = Log("orders")
    judge(live, segments_started(log, [GUID_A]) + data(log, GUID_A, range(1, 4)))
    deleted(log, data(log, GUID_A, range(4, 6)))
    live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-")
    assert live.producers_behind_deletions("orders", 0) == {GUID_A}
    live.unload("orders", 0)
    assert live.producers_behind_deletions("orders", 0) == set() and not live.behind_deletions


def test_a_loss_verdict_without_a_deletion_is_untouched():
    log = Log("orders")
    record = log.data(0, 5)
    result = ValidationResult(record, Verdict.MISSING, GUID_A, 0, 5, False, "seq 5 follows seq 3")
    (plain,) = incidents_for(result, NOW)
    (noted,) = incidents_for(result, NOW, Deletion("orders", 0, 1, 3, "fetch", "-", False))
    assert plain.detail == "seq 5 follows seq 3"
    assert noted.detail.startswith("seq 5 follows seq 3; deleted before validation") and noted.key == plain.key


def test_a_producer_unseen_since_an_earlier_deletion_stays_behind_it():
    live = new_live()
    log = Log("orders")
    judge(
        live, segments_started(log, [GUID_A, GUID_B]) + data(log, GUID_A, range(1, 3)) + data(log, GUID_B, range(1, 3))
    )
    deleted(log, data(log, GUID_A, range(3, 5)) + data(log, GUID_B, range(3, 4)))
    first = live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-")
    assert first is not None
    (a_first,) = judge(live, data(log, GUID_A, range(5, 7)))
    assert f"offsets {first.first_offset}..{first.last_offset}" in a_first.detail
    deleted(log, data(log, GUID_A, range(7, 9)) + data(log, GUID_B, range(4, 6)))
    second = live.log_starts_at("orders", 0, log.next_offset[0], "fetch", "-")
    assert second is not None and live.producers_behind_deletions("orders", 0) == {GUID_A, GUID_B}

    incidents = {i.producer: i for i in judge(live, data(log, GUID_B, range(6, 7)) + data(log, GUID_A, range(9, 10)))}
    assert (incidents[GUID_B.hex()].seq, incidents[GUID_A.hex()].seq) == (3, 7)
    assert (
        f"offsets {first.first_offset}..{first.last_offset}" in incidents[GUID_B.hex()].detail
    )  # last seen before both
    assert f"offsets {second.first_offset}..{second.last_offset}" in incidents[GUID_A.hex()].detail
    assert live.producers_behind_deletions("orders", 0) == set()


class _Position:
    """aiokafka's partition state, as a FetchResult reads and moves it."""

    paused = False

    def __init__(self, position: int) -> None:
        self.position = position

    def consumed_to(self, offset: int) -> None:
        self.position = offset


class _Assignment:
    active = True

    def __init__(self, position: int) -> None:
        self.state = _Position(position)

    def state_value(self, tp) -> _Position:
        return self.state


def test_a_fetch_names_where_it_started_and_the_position_it_left_past_control_batches():
    """What the worker tells a consumer reset from a transaction marker's gap by: the records
    of a fetch at offset 2 end at 4, its control batch (the marker at 5) moves the position to 6,
    and the next fetch starts there."""
    tp = TopicPartition("retention-fetch-span", 0)
    data = batch(0, 5, producer_id=7, transactional=True) + batch(5, 1, producer_id=7, transactional=True, control=True)
    assignment = _Assignment(2)
    records = PartitionRecords(tp, MemoryRecords(data), [], 2, None, None, True, READ_COMMITTED)
    fetched = in_bulk(FetchResult(tp, assignment=assignment, partition_records=records, backoff=0)).getall()
    assert [r.offset for r in fetched] == [2, 3, 4]
    assert fetched_span(fetched) == (2, 6) and assignment.state.position == 6
    assert fetched_span(list(fetched)) == (None, None)  # cut or copied: not known
