"""Log rewinds: validated offsets whose records are gone are named once, then validated as new."""

from __future__ import annotations

from kdiv.div.faults import Verdict
from kdiv.div.validator import DataIntegrityValidator, Semantics
from kdiv.div.wire import Kind
from kdiv.state.values import StateValues
from kdiv.worker.incidents import LOG_REWOUND, rewind_incident
from kdiv.worker.live import LiveValidation, Rewind
from tests.harness.streams import NOW, Log


def validated(log: Log, seqs: range) -> tuple[LiveValidation, list]:
    """A live validation that has validated START_OF_SEGMENT and `seqs` of `log`, state saved."""
    live = LiveValidation(DataIntegrityValidator(), StateValues(7))
    live.load(log.topic, 0, [])
    records = [log.control(Kind.START_OF_SEGMENT, 0, 0)] + [log.data(0, seq) for seq in seqs]
    for record in records:
        result = live.process(record, NOW)
        assert result is not None and result.verdict is Verdict.OK
    return live, records


def restarted(live: LiveValidation, topic: str) -> LiveValidation:
    """A new owner of the partition, loaded from what `live` wrote."""
    writes = live.take_writes(topic, 0)
    assert writes is not None
    again = LiveValidation(DataIntegrityValidator(), StateValues(7))
    again.load(topic, 0, [(k, v) for k, v in writes.in_order() if v is not None])
    return again


def test_a_recreated_topic_is_one_rewind_and_its_records_are_validated_as_new():
    old = Log("orders")
    live, _ = validated(old, range(1, 201))  # offsets 0..200
    assert live.check_topic_id("orders", 0, "id-1") is None  # first seen: nothing to compare
    assert live.take_rewinds() == []

    live = restarted(live, "orders")  # the topic id is part of the saved state
    assert live.check_topic_id("orders", 0, "id-1") is None
    found = live.check_topic_id("orders", 0, "id-2")
    assert found == live.take_rewinds()[0]
    assert (found.first_offset, found.last_offset, found.detected_by) == (0, 200, "topic id")
    assert "id-1" in found.detail and "id-2" in found.detail

    # The producer goes on in the new log from offset 0: every record judged, all in order.
    new = Log("orders")
    results = [live.process(new.data(0, seq), NOW) for seq in range(201, 501)]
    assert all(r is not None and r.verdict is Verdict.OK for r in results)
    assert live.replays_skipped == 0
    assert live.check_topic_id("orders", 0, "id-2") is None  # the new id stays


def test_a_truncated_log_is_rewound_to_its_new_end():
    log = Log("orders")
    live, records = validated(log, range(1, 201))
    found = live.rewind("orders", 0, 150, "high watermark", "the log now ends at offset 150")
    assert found is not None and (found.first_offset, found.last_offset) == (150, 200)
    assert live.rewind("orders", 0, 150, "high watermark", "again") is None  # nothing validated there now

    # Below the new end: replays, skipped. From it: new records of the producer, in order.
    assert live.process(records[100], NOW) is None
    truncated = Log("orders")
    truncated.next_offset[0] = 150
    resent = [live.process(truncated.data(0, seq), NOW) for seq in range(201, 221)]
    assert [r.verdict for r in resent if r is not None] == [Verdict.OK] * 20


def test_a_rewind_inside_a_push_is_fatal_and_identified_by_its_first_offset():
    rewind = Rewind("orders", 3, 0, 200, "topic id", "recreated", in_push=True)
    incident = rewind_incident(rewind, NOW)
    assert (incident.verdict, incident.severity, incident.offset) == (LOG_REWOUND, "fatal", 0)
    assert incident.key == rewind_incident(rewind, NOW + 1).key
    assert "offsets 0..200" in incident.detail


def test_a_replayed_offset_holding_a_record_past_its_producers_state_is_a_rewind_by_content():
    old = Log("orders")
    live, records = validated(old, range(1, 201))  # offsets 0..200
    live = restarted(live, "orders")
    # Redelivered from offset 150 (the committed offset): the same records until offset 179,
    # then the log was truncated there and the producer went on with seq 201.. at offsets 180..
    replays = [live.process(r, NOW) for r in records[150:180]]
    assert replays == [None] * 30 and live.replays_skipped == 30
    new = Log("orders")
    new.next_offset[0] = 180
    results = [live.process(new.data(0, seq), NOW) for seq in range(201, 241)]
    (found,) = live.take_rewinds()
    assert (found.first_offset, found.last_offset, found.detected_by) == (180, 200, "content")
    assert "segment 0 seq 201, past its segment 0 seq 200" in found.detail
    assert [r.verdict for r in results if r is not None] == [Verdict.OK] * 40
    assert live.replays_skipped == 30


def test_a_replay_of_the_validated_records_is_no_rewind_and_venice_semantics_looks_at_no_content():
    old = Log("orders")
    live, records = validated(old, range(1, 51))
    live = restarted(live, "orders")
    assert [live.process(r, NOW) for r in records[10:]] == [None] * 41
    assert live.take_rewinds() == []

    venice = LiveValidation(DataIntegrityValidator(semantics=Semantics.VENICE), StateValues(7))
    venice.load("orders", 0, [])
    for record in records:
        venice.process(record, NOW)
    new = Log("orders")
    new.next_offset[0] = 40
    assert venice.process(new.data(0, 60), NOW) is None  # at a validated offset: skipped as a replay
    assert venice.take_rewinds() == []
