"""The tables' restore as kdiv reckons it (`kdiv.worker.faustcompat.bulkrestore`): what is left
against the end offsets read at assignment, whatever Faust's recovery says."""

from __future__ import annotations

from types import SimpleNamespace

from faust.types import TP

from kdiv.worker.faustcompat.bulkrestore import BulkRestore, Target
from kdiv.worker.faustcompat.internals import recovery_status

A, B = TP("app-state-p2-changelog", 0), TP("app-state-p2-changelog", 1)


def _bulk() -> BulkRestore:
    return BulkRestore(new_consumer=lambda: None, listener=SimpleNamespace(), idle_timeout_s=1.0)


def _app(bulk: BulkRestore, *, faust_recovering: bool, faust_left: int = 0) -> SimpleNamespace:
    recovery = SimpleNamespace(
        in_recovery=faust_recovering,
        active_remaining_total=lambda: faust_left,
        standby_remaining_total=lambda: 0,
        bulk=bulk,
    )
    return SimpleNamespace(tables=SimpleNamespace(recovery=recovery))


def test_what_is_left_is_counted_against_the_ends_read_at_assignment():
    bulk = _bulk()
    bulk.targets[A] = Target(end=1_000, position=400)
    bulk.targets[B] = Target(end=50, position=50)
    assert (bulk.remaining(), bulk.remaining([A]), bulk.remaining([B])) == (600, 600, 0)
    assert (bulk.is_whole(A), bulk.is_whole(B)) == (False, True)
    assert not bulk.is_whole(TP("other", 0))  # no target: not known to be whole
    bulk.keep_only([B])
    assert bulk.remaining() == 0 and A not in bulk.targets


def test_a_restore_faust_calls_complete_is_recovering_while_kdiv_counts_records_left():
    bulk = _bulk()
    bulk.targets[A] = Target(end=1_000, position=400)
    status = recovery_status(_app(bulk, faust_recovering=False))
    assert status == {"in_progress": True, "active_remaining": 600, "standby_remaining": 0}
    bulk.targets[A].position = 1_000
    assert recovery_status(_app(bulk, faust_recovering=False))["in_progress"] is False
    # While kdiv reads in bulk, its own count stands (Faust's offsets are not updated yet).
    bulk.running = True
    assert recovery_status(_app(bulk, faust_recovering=True, faust_left=5_000)) == {
        "in_progress": True,
        "active_remaining": 0,
        "standby_remaining": 0,
    }
