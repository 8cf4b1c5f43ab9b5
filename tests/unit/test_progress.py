"""Progress against the true log ends: lag, the oldest unvalidated record's age, stalls."""

from __future__ import annotations

import logging

from kdiv.config.settings import Settings
from kdiv.worker.logends import LogEnds
from kdiv.worker.progress import MAX_READINGS, Key, Progress

KEY = ("orders", 0)
OTHER = ("orders", 1)
S = 1000


def _progress(stall_s: int = 60) -> Progress:
    progress = Progress(stall_s * S)
    progress.assign([KEY, OTHER], 0)
    return progress


def test_lag_is_measured_against_the_log_end_read_not_assumed():
    progress = _progress()
    assert progress.of(KEY, 0).lag is None  # nothing read yet: unknown, not zero
    progress.starts_at(KEY, 0, 0)
    progress.log_ends({KEY: (0, 1200)}, 5 * S)
    assert progress.of(KEY, 5 * S).lag == 1200
    progress.validated(KEY, 1000, 6 * S)
    assert progress.of(KEY, 6 * S).lag == 200


def test_the_oldest_unvalidated_record_is_dated_by_the_last_read_before_it():
    progress = _progress()
    progress.starts_at(KEY, 0, 0)
    progress.log_ends({KEY: (0, 0)}, 0)
    progress.log_ends({KEY: (0, 10)}, 5 * S)  # records 0..9 appended after 0 s, by 5 s
    progress.log_ends({KEY: (0, 20)}, 10 * S)  # 10..19 after 5 s, by 10 s
    assert progress.of(KEY, 30 * S).lag_age_ms == 30 * S  # at most
    progress.validated(KEY, 10, 31 * S)
    assert progress.of(KEY, 31 * S).lag_age_ms == 26 * S
    progress.validated(KEY, 20, 32 * S)
    measured = progress.of(KEY, 32 * S)
    assert (measured.lag, measured.lag_age_ms) == (0, 0)


def test_a_backlog_without_progress_for_the_bound_is_a_stall_and_ends_with_progress():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 48, 0)
    progress.starts_at(OTHER, 0, 0)
    progress.log_ends({KEY: (0, 48), OTHER: (0, 0)}, 1 * S)
    progress.log_ends({KEY: (0, 1248), OTHER: (0, 0)}, 10 * S)  # appended after 1 s
    assert progress.judge(60 * S) == []  # 59 s since the backlog can have appeared: not yet
    changes = progress.judge(61 * S)
    assert [(c.key, c.began, c.since_ms, c.lag) for c in changes] == [(KEY, True, 1 * S, 1200)]
    assert progress.judge(80 * S) == []  # one change, not one per judgement
    assert [p.stalled_since_ms for p in progress.snapshot(80 * S)] == [1 * S, None]
    progress.validated(KEY, 100, 90 * S)
    ended = progress.judge(91 * S)
    assert [(c.key, c.began, c.since_ms) for c in ended] == [(KEY, False, 1 * S)]
    assert not progress.of(KEY, 91 * S).stalled


def test_an_idle_partition_with_no_backlog_never_stalls():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 5, 0)
    progress.log_ends({KEY: (0, 5)}, 0)
    assert progress.judge(3600 * S) == []


def test_progress_that_keeps_up_with_a_growing_log_is_no_stall():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 0, 0)
    for second in range(0, 600, 5):
        progress.log_ends({KEY: (0, (second + 5) * 10)}, second * S)
        progress.validated(KEY, second * 10, second * S)
        assert progress.judge(second * S) == []


def test_records_deleted_before_validation_are_not_a_backlog():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 0, 0)
    progress.log_ends({KEY: (500, 500)}, 0)  # DeleteRecords moved the log start to the end
    assert progress.of(KEY, 0).lag == 0
    assert progress.judge(600 * S) == []


def test_a_tail_of_transaction_markers_is_caught_up_once_looked_at():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 10, 0)
    progress.log_ends({KEY: (0, 11)}, 0)  # the commit marker at offset 10
    assert progress.suspects(10 * S, 5 * S) == []
    assert progress.suspects(10 * S, 10 * S) == [(KEY, 10, 11)]
    progress.only_markers_before_end(KEY, 10 * S)
    assert progress.of(KEY, 10 * S).lag == 0
    assert progress.judge(600 * S) == []


def test_no_stall_is_judged_while_progress_is_held_then_the_clock_restarts():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 0, 0)
    progress.log_ends({KEY: (0, 100)}, 0)
    progress.hold(100 * S)  # restoring tables until 100 s
    assert progress.judge(150 * S) == []
    assert progress.judge(160 * S)[0].since_ms == 100 * S


def test_a_restore_that_moves_holds_the_stall_clock_and_one_that_stands_still_is_stalled():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 0, 0)
    progress.log_ends({KEY: (0, 100)}, 0)
    for t in range(0, 300, 5):  # restoring, 10 changelog records a poll
        progress.restoring(5000 - 2 * t, t * S)
        assert progress.restore_stalled(t * S) is None
    assert progress.judge(300 * S) == []  # validation waits for the restore: no stall
    for t in range(300, 400, 5):  # the restore stands still at 4,400 left
        progress.restoring(4400, t * S)
    assert progress.restore_stalled(359 * S) is None
    assert progress.restore_stalled(360 * S) == (300 * S, 4400)
    progress.restoring(4399, 400 * S)
    assert progress.restore_stalled(400 * S) is None
    progress.restoring(None, 405 * S)  # restored: the partitions' own clocks run from the last hold
    assert progress.restore_stalled(10_000 * S) is None
    assert progress.judge(465 * S)[0].since_ms == 400 * S


def test_log_ends_unread_for_the_bound_make_progress_unknown_whether_or_not_a_read_failed_yet():
    progress = _progress(stall_s=60)  # measuring from 0
    assert not progress.measured_blind(59 * S) and progress.measured_blind(60 * S)
    progress.log_ends({}, 70 * S)
    assert not progress.measured_blind(129 * S)
    progress.log_ends_failed("no answer within 20 s", 100 * S)  # a read still waiting counts too
    assert progress.measured_blind(130 * S) and progress.blind_since_ms == 70 * S
    progress.log_ends({}, 135 * S)
    assert not progress.measured_blind(135 * S) and progress.log_ends_error is None


def test_a_revoked_partition_is_forgotten_and_a_seek_back_is_where_it_is():
    progress = _progress()
    progress.starts_at(KEY, 100, 0)
    progress.validated(KEY, 50, 1 * S)  # read again from 50 (a rewind)
    assert progress.of(KEY, 1 * S).validated == 50
    progress.assign([OTHER], 2 * S)
    assert progress.of(KEY, 2 * S) is None


def test_a_backlog_under_a_log_that_stands_still_is_stalled_from_its_first_read():
    """Records wait, nothing is validated and nothing more is written: every read sees the
    same end, and none of them makes the backlog younger."""
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 100, 0)
    for t in range(0, 120, 5):
        progress.log_ends({KEY: (0, 500)}, t * S)
        changes = progress.judge(t * S)
        if t == 60:
            assert [(c.key, c.began, c.since_ms) for c in changes] == [(KEY, True, 0)]
    assert progress.of(KEY, 115 * S).lag_age_ms == 115 * S


def test_a_group_that_rejoins_again_and_again_is_no_progress_and_its_stall_is_said():
    """Revoked and assigned again every 10 s, validating nothing: the partition's clock goes
    on through the rebalances, so the stall is said at the bound, once."""
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 100, 0)
    progress.log_ends({KEY: (0, 500)}, 0)
    began = []
    for t in range(0, 120, 10):
        progress.assign([OTHER], t * S)  # revoked
        progress.assign([KEY, OTHER], (t + 5) * S)  # assigned again
        progress.log_ends({KEY: (0, 500)}, (t + 5) * S)
        began += [change.since_ms for change in progress.judge((t + 5) * S) if change.key == KEY and change.began]
    assert began == [0]


def test_a_partition_back_after_the_stall_bound_is_measured_afresh():
    progress = _progress(stall_s=60)
    progress.starts_at(KEY, 100, 0)
    progress.log_ends({KEY: (0, 500)}, 0)
    progress.assign([OTHER], 10 * S)
    progress.assign([KEY, OTHER], 80 * S)
    assert progress.of(KEY, 80 * S).validated is None  # its new start is read again
    progress.starts_at(KEY, 400, 80 * S)
    progress.log_ends({KEY: (0, 500)}, 80 * S)
    assert progress.judge(139 * S) == []


def test_the_readings_kept_are_bounded_and_the_age_stays_an_upper_bound():
    progress = _progress()
    progress.starts_at(KEY, 0, 0)
    progress.log_ends({KEY: (0, 0)}, 0)
    for i in range(1, 5 * MAX_READINGS):
        progress.log_ends({KEY: (0, i)}, i * S)
    part = progress._parts[KEY]
    assert len(part.readings) <= MAX_READINGS + 1
    assert progress.of(KEY, 5 * MAX_READINGS * S).lag_age_ms == 5 * MAX_READINGS * S


def test_a_backlog_first_seen_after_the_log_ends_were_unreadable_counts_from_before():
    progress = _progress(stall_s=15)
    progress.starts_at(KEY, 110, 0)
    progress.log_ends({KEY: (0, 110)}, 1 * S)  # caught up; then the broker froze
    progress.log_ends({KEY: (0, 400)}, 31 * S)  # read again: a backlog, appended after 1 s
    assert [(c.key, c.since_ms) for c in progress.judge(31 * S)] == [(KEY, 1 * S)]


def test_seeks_back_again_and_again_are_no_progress_and_do_not_hide_a_stall():
    progress = _progress(stall_s=15)
    progress.starts_at(KEY, 110, 0)
    progress.log_ends({KEY: (0, 400)}, 1 * S)
    for second in range(2, 30):
        # A worker rejoining its group: seeks back to its committed offset, reads a little.
        progress.validated(KEY, 100, second * S)
        progress.validated(KEY, 110, second * S)
    assert [c.key for c in progress.judge(30 * S)] == [KEY]


def test_a_backlog_after_a_log_that_stood_still_is_dated_by_the_last_read_that_saw_it_still():
    """A leader frozen under its producer: the log end stands still for 40 s while the
    producer's request waits, then the producer is answered elsewhere and the log grows. The
    backlog is 2 s old when first seen, not 40: no stall yet."""
    progress = _progress(stall_s=15)
    progress.starts_at(KEY, 119, 0)
    for second in range(0, 42, 5):
        progress.log_ends({KEY: (0, 119)}, second * S)
    progress.log_ends({KEY: (0, 395)}, 42 * S)
    assert progress.judge(42 * S) == []
    assert progress.of(KEY, 42 * S).lag_age_ms == 2 * S
    assert [(c.key, c.since_ms) for c in progress.judge(55 * S)] == [(KEY, 40 * S)]


def test_partitions_that_stall_together_are_one_log_line_naming_them(caplog):
    """A burst over many partitions stalls them all at one judgement: one line when they
    stall and one when they resume, naming 20 and counting the rest, not a line each."""
    keys = [("orders", n) for n in range(30)]
    progress = Progress(60 * S)
    progress.assign(keys, 0)
    now = [0]
    ends = LogEnds(
        Settings.from_env({"KDIV_TOPICS": "orders"}), progress, lambda: keys, lambda key: None, lambda: now[0]
    )
    for key in keys:
        progress.starts_at(key, 0, 0)
    progress.log_ends(dict.fromkeys(keys, (0, 0)), 0)
    progress.log_ends(dict.fromkeys(keys, (0, 100)), 1 * S)
    with caplog.at_level(logging.WARNING, logger="kdiv"):
        now[0] = 62 * S
        ends.judge()
        for key in keys:
            progress.validated(key, 100, 70 * S)
        now[0] = 71 * S
        ends.judge()
    lines = [r.getMessage() for r in caplog.records if "validation" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("validation stalled on orders[0], orders[1], ")
    assert "orders[19] and 10 more partitions since " in lines[0] and ": 3000 records not validated" in lines[0]
    assert (
        lines[1].startswith("validation resumed on orders[0], ") and "and 10 more partitions, stalled since" in lines[1]
    )


def _backlogs_from_one_second() -> Progress:
    """KEY and OTHER both with 1,000 records appended after 0 s (by 1 s), none validated."""
    progress = _progress(stall_s=60)
    for key in (KEY, OTHER):
        progress.starts_at(key, 0, 0)
    progress.log_ends({KEY: (0, 0), OTHER: (0, 0)}, 0)
    progress.log_ends({KEY: (0, 1000), OTHER: (0, 1000)}, 1 * S)
    return progress


def test_records_waiting_in_a_worker_that_makes_progress_elsewhere_are_behind_not_stalled():
    # A burst: KEY's records wait their turn (its fetches answered with others' records, or
    # fetched and queued) while the worker validates OTHER's; the queue moves, so KEY is
    # behind, and says so by its lag and lag age.
    progress = _backlogs_from_one_second()
    progress.validated(OTHER, 500, 50 * S)
    assert progress.judge(70 * S, en_route={KEY}) == []
    assert progress.of(KEY, 70 * S).lag_age_ms == 70 * S
    progress.validated(OTHER, 1000, 100 * S)
    assert progress.judge(120 * S, en_route={KEY}) == []
    progress.validated(KEY, 1000, 125 * S)
    assert progress.judge(126 * S) == []


def test_records_en_route_to_a_worker_that_makes_no_progress_anywhere_are_stalled():
    progress = _backlogs_from_one_second()
    progress.validated(OTHER, 500, 5 * S)  # the last progress: 65 s ago at 70 s
    changes = progress.judge(70 * S, en_route={KEY, OTHER})
    assert [(c.key, c.since_ms) for c in changes] == [(KEY, 0), (OTHER, 5 * S)]


def test_a_partition_whose_records_never_reach_the_worker_is_stalled_while_others_progress():
    # Its leader frozen: no fetch of KEY is answered, while OTHER keeps being validated.
    progress = _backlogs_from_one_second()
    for t in range(10, 80, 10):
        progress.validated(OTHER, 10 * t, t * S)
    changes = progress.judge(70 * S, en_route={OTHER})
    assert [(c.key, c.began, c.since_ms) for c in changes] == [(KEY, True, 0)]


def test_a_partition_behind_that_stops_moving_with_the_worker_is_stalled_from_its_own_last_progress():
    progress = _backlogs_from_one_second()
    progress.validated(OTHER, 1000, 50 * S)
    assert progress.judge(100 * S, en_route={KEY}) == []  # the worker moved 50 s ago
    changes = progress.judge(111 * S, en_route={KEY})  # and not since: KEY waits in a queue that stands
    assert [(c.key, c.since_ms) for c in changes] == [(KEY, 0)]


def test_records_en_route_are_those_fetched_and_waiting_or_whose_fetch_was_answered_lately():
    """`records_en_route` over aiokafka's own fetch results and partition states: one with
    records left, one drained (aiokafka drops its records when taken), one fetch error; a
    fetch answered after the bound, one answered before it, one never answered (the names
    read are checked against aiokafka in test_faustcompat)."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from aiokafka import TopicPartition
    from aiokafka.consumer.fetcher import FetchError, FetchResult

    from kdiv.worker.faustcompat.internals import records_en_route

    tps = [TopicPartition("orders", n) for n in range(6)]
    waiting, drained, failed, answered, answered_before, never = tps
    records = OrderedDict()
    records[waiting] = FetchResult(waiting, assignment=None, partition_records=object(), backoff=0)
    records[drained] = FetchResult(drained, assignment=None, partition_records=None, backoff=0)
    records[failed] = FetchError(error=RuntimeError("not the leader"), backoff=0)
    # aiokafka's TopicPartitionState needs a running loop; its `timestamp` is all that is read.
    answered_at = {answered: 100 * S, answered_before: 39 * S}
    assignment = SimpleNamespace(_tp_state={tp: SimpleNamespace(timestamp=answered_at.get(tp)) for tp in tps})
    subscriptions = SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))
    fetcher = SimpleNamespace(_records=records, _subscriptions=subscriptions)
    app = SimpleNamespace(
        consumer=SimpleNamespace(_thread=SimpleNamespace(_consumer=SimpleNamespace(_fetcher=fetcher)))
    )
    assert records_en_route(app, 40 * S) == {("orders", 0), ("orders", 3)}
    # Before the consumer thread has started its consumer: nothing on its way.
    assert records_en_route(SimpleNamespace(consumer=SimpleNamespace(_thread=None)), 0) == set()


def test_the_batch_being_validated_is_on_its_way_until_it_is_in_the_unit_of_work():
    """Between the consumer and the unit of work: a batch's partitions, validated in turns,
    count as on their way while the batch is processed (`BatchPath.taking`)."""
    import asyncio
    from types import SimpleNamespace

    from aiokafka import TopicPartition

    from kdiv.worker.batchpath import BatchPath
    from kdiv.worker.unit import UnitOfWork

    seen: list[tuple[Key, frozenset]] = []
    path: BatchPath

    async def take(key, records, start, now_ms):
        seen.append((key, path.taking))
        await asyncio.sleep(0)
        return SimpleNamespace(stopped_at=None, commit_first=False)

    kind = SimpleNamespace(take=take)
    path = BatchPath(
        kinds=SimpleNamespace(of=lambda topic: kind),
        ownership=SimpleNamespace(load=lambda keys: list(keys)),
        unit=UnitOfWork(),
        sink=SimpleNamespace(),
        live=SimpleNamespace(),
        clock=lambda: 0,
        batch_max=10**6,
    )
    record = SimpleNamespace(offset=7)
    batch = {
        TopicPartition("orders", 0): [record],
        TopicPartition("orders", 1): [record],
        TopicPartition("orders", 2): [],
    }
    asyncio.run(path.process(batch))
    both = frozenset({("orders", 0), ("orders", 1)})
    assert seen == [(("orders", 0), both), (("orders", 1), both)]  # not the partition with no records
    assert path.taking == frozenset() and sorted(path.unit.partitions) == sorted(both)


def test_a_drained_batch_is_on_its_way_until_it_or_a_later_one_is_taken():
    """Drained from the fetcher in the consumer thread, a batch waits in a future while the
    one before it is validated: its partitions are held (`records_held`) until taken, and a
    batch dropped without being taken is released by the next one taken."""
    from types import SimpleNamespace

    from kdiv.worker.faustcompat.batches import BatchDrainConsumer
    from kdiv.worker.faustcompat.internals import records_en_route

    consumer = BatchDrainConsumer()
    first = consumer.hold(frozenset({("orders", 0), ("orders", 1)}))
    second = consumer.hold(frozenset({("orders", 2)}))
    dropped = consumer.hold(frozenset({("orders", 3)}))
    third = consumer.hold(frozenset({("orders", 4)}))
    assert consumer.records_held() == {("orders", n) for n in range(5)}
    # Seen by the progress check with nothing else on its way.
    app = SimpleNamespace(consumer=SimpleNamespace(records_held=consumer.records_held, _thread=None))
    assert records_en_route(app, 0) == {("orders", n) for n in range(5)}
    consumer.release_held(first)
    assert consumer.records_held() == {("orders", 2), ("orders", 3), ("orders", 4)}
    consumer.release_held(None)  # a batch that was never drained: nothing changes
    assert consumer.records_held() == {("orders", 2), ("orders", 3), ("orders", 4)}
    consumer.release_held(second)
    consumer.release_held(third)  # `dropped` came before it: released too
    assert consumer.records_held() == frozenset()
    assert dropped < third
