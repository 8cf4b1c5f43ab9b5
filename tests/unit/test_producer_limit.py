"""The producer limit per partition (KDIV_PRODUCERS_LIMIT): the least recently seen producers
are evicted, their saved state deleted, and one incident per overflow episode counts them."""

from __future__ import annotations

import uuid

from kdiv.config.settings import Settings
from kdiv.div.record import ConsumedRecord
from kdiv.div.segment import SegmentStatus, as_segment, last_offset, status_of
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import ChecksumType
from kdiv.state.tables import producer_key
from kdiv.worker.incidents import PRODUCERS_LIMIT, eviction_incident
from kdiv.worker.live import LiveValidation

TOPIC = "t"
NOW = 1_700_000_000_000


def guid(n: int) -> bytes:
    return uuid.UUID(int=n).bytes


class Partition:
    """One partition's log, written by one stamper per producer number."""

    def __init__(self) -> None:
        self.stampers: dict[int, DivStamper] = {}
        self.next_offset = 0

    def write(self, producer: int) -> list[ConsumedRecord]:
        """The producer's next data record, after its START_OF_SEGMENT when it opens one."""
        return self._at_next_offsets(self._stamper(producer).data(TOPIC, 0, b"k", b"v", NOW))

    def end(self, producer: int) -> list[ConsumedRecord]:
        return self._at_next_offsets(self._stamper(producer).end_segment(TOPIC, 0, True, NOW))

    def _stamper(self, producer: int) -> DivStamper:
        return self.stampers.setdefault(producer, DivStamper(guid(producer), checksum_type=ChecksumType.ADHASH))

    def _at_next_offsets(self, out) -> list[ConsumedRecord]:
        records = []
        for o in out:
            records.append(ConsumedRecord(TOPIC, 0, self.next_offset, NOW, o.key, o.value, o.headers))
            self.next_offset += 1
        return records


def feed(target, records: list[ConsumedRecord]) -> list[str]:
    """Each record to a validator or a live validation; their verdicts."""
    validate = target.process if isinstance(target, LiveValidation) else target.validate
    results = [validate(r, NOW) for r in records]
    return [result.verdict.value if result is not None else "REPLAY" for result in results]


def test_the_least_recently_seen_producers_are_evicted_one_incident_per_episode():
    v = DataIntegrityValidator(max_producers=3)
    log = Partition()
    for producer in (1, 2, 3, 4, 5):  # offsets 0..9, two each
        assert feed(v, log.write(producer)) == ["OK", "OK"]
    feed(v, log.write(1))  # offset 10: producer 1 is the most recently seen now
    eviction = v.evict_over_limit(TOPIC, 0)
    assert eviction is not None
    assert eviction.guids == (guid(2), guid(3))
    assert set(v.partition(TOPIC, 0).tracker.segments) == {guid(1), guid(4), guid(5)}
    assert (eviction.since_offset, eviction.episode_evicted, eviction.limit) == (10, 2, 3)
    assert eviction.newest_last_offset == 5

    # Within the limit: nothing more, and the episode goes on while the partition is full.
    assert v.evict_over_limit(TOPIC, 0) is None
    feed(v, log.write(6))
    later = v.evict_over_limit(TOPIC, 0)
    assert later is not None and later.guids == (guid(4),)
    assert (later.since_offset, later.episode_evicted) == (10, 3)
    first, second = eviction_incident(eviction, NOW), eviction_incident(later, NOW + 1)
    assert first.key == second.key  # the episode's one incident, rewritten with the count
    assert (second.verdict, second.severity, second.offset) == (PRODUCERS_LIMIT, "warning", 10)
    assert "3 producers evicted since offset 10" in second.detail
    assert "judged as a new producer" in second.detail


def test_an_episode_ends_when_the_partition_has_room_again():
    v = DataIntegrityValidator(max_producers=2)
    log = Partition()
    for producer in (1, 2, 3):
        feed(v, log.write(producer))
    assert v.evict_over_limit(TOPIC, 0).since_offset == 5
    v.partition(TOPIC, 0).tracker.evict([guid(3)])  # as maxAge expiry would
    assert v.evict_over_limit(TOPIC, 0) is None
    for producer in (7, 8):
        feed(v, log.write(producer))
    again = v.evict_over_limit(TOPIC, 0)
    assert (again.guids, again.since_offset, again.episode_evicted) == ((guid(2),), 9, 1)


def test_no_limit_evicts_nothing():
    v = DataIntegrityValidator(max_producers=0)
    log = Partition()
    for producer in range(1, 50):
        feed(v, log.write(producer))
    assert v.evict_over_limit(TOPIC, 0) is None
    assert len(v.partition(TOPIC, 0).tracker.segments) == 49


def test_an_evicted_producer_seen_again_is_judged_as_a_new_producer():
    """Venice's rule for an unknown GUID: mid-segment is fine after the push, not inside one."""
    log = Partition()
    before = log.write(1) + log.write(1) + log.write(2) + log.write(3)
    again = log.write(1)  # its seq 3, after its seq 2 of before the eviction
    for start_in_push, expected in ((False, "OK"), (True, "UNREGISTERED_PRODUCER")):
        v = DataIntegrityValidator(max_producers=2, start_in_push=start_in_push)
        assert set(feed(v, before)) == {"OK"}
        assert v.evict_over_limit(TOPIC, 0).guids == (guid(1),)
        [result] = [v.validate(r, NOW) for r in again]
        assert (result.verdict.value, result.fatal) == (expected, start_in_push)


def test_evicted_producers_are_deleted_from_the_saved_state():
    live = LiveValidation(DataIntegrityValidator(max_producers=2))
    live.load(TOPIC, 0, [])
    log = Partition()
    for producer in (1, 2):
        feed(live, log.write(producer))
    saved = dict(live.take_writes(TOPIC, 0).in_order())
    assert producer_key(TOPIC, 0, guid(2)) in saved

    for producer in (3, 4, 1):
        feed(live, log.write(producer))
    assert live.evict_over_limit(TOPIC, 0).guids == (guid(2), guid(3))
    writes = dict(live.take_writes(TOPIC, 0).in_order())
    assert writes[producer_key(TOPIC, 0, guid(2))] is None
    # Producer 3 was never saved, and is deleted all the same (a crash may have saved it).
    assert writes[producer_key(TOPIC, 0, guid(3))] is None
    assert writes[producer_key(TOPIC, 0, guid(1))] is not None
    saved.update(writes)
    restarted = LiveValidation(DataIntegrityValidator(max_producers=2))
    restarted.load(TOPIC, 0, [(k, v) for k, v in saved.items() if v is not None])
    assert set(restarted.validator.partition(TOPIC, 0).tracker.segments) == {guid(1), guid(4)}


def test_an_evicted_producer_seen_again_before_the_writes_is_saved_not_deleted():
    live = LiveValidation(DataIntegrityValidator(max_producers=1))
    live.load(TOPIC, 0, [])
    log = Partition()
    feed(live, log.write(1) + log.write(2))
    assert live.evict_over_limit(TOPIC, 0).guids == (guid(1),)
    feed(live, log.write(1))
    writes = dict(live.take_writes(TOPIC, 0).in_order())
    assert writes[producer_key(TOPIC, 0, guid(1))] is not None


def test_a_restored_partition_over_a_lowered_limit_is_evicted_and_written():
    live = LiveValidation(DataIntegrityValidator())
    live.load(TOPIC, 0, [])
    log = Partition()
    feed(live, log.write(1) + log.write(2) + log.write(3))
    saved = dict(live.take_writes(TOPIC, 0).in_order())

    restarted = LiveValidation(DataIntegrityValidator(max_producers=1))
    restarted.load(TOPIC, 0, saved.items())
    restarted.take_writes(TOPIC, 0)  # the first unit after a load rewrites what was loaded
    assert restarted.take_writes(TOPIC, 0) is None
    assert restarted.evict_over_limit(TOPIC, 0).guids == (guid(1), guid(2))
    writes = dict(restarted.take_writes(TOPIC, 0).in_order())
    assert writes[producer_key(TOPIC, 0, guid(1))] is None
    assert writes[producer_key(TOPIC, 0, guid(2))] is None


def test_packed_states_give_their_offset_and_status_unpacked_or_not():
    v = DataIntegrityValidator()
    log = Partition()
    feed(v, log.write(1) + log.write(2) + log.end(2))
    tracker = v.partition(TOPIC, 0).tracker
    for state in tracker.segments.values():
        packed = as_segment(state).pack()
        assert last_offset(packed) == last_offset(state) == as_segment(state).last_offset
        assert status_of(packed) is status_of(state) is as_segment(state).status
    assert status_of(tracker.segments[guid(1)]) is SegmentStatus.IN_PROGRESS
    assert status_of(as_segment(tracker.segments[guid(2)]).pack()) is SegmentStatus.END_OF_FINAL_SEGMENT


def test_defaults_bound_producers_and_expire_them_after_a_week():
    settings = Settings.from_env({"KDIV_TOPICS": "a"})
    assert settings.producers_limit == 100_000
    assert settings.max_age_ms == 7 * 24 * 3600 * 1000
    assert Settings.from_env({"KDIV_TOPICS": "a", "KDIV_PRODUCERS_LIMIT": "0"}).producers_limit == 0
