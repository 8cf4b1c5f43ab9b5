"""The high watermark signal of log rewinds: a fall seen in a fetch is a rewind only once the
partition's leader confirms it (a leader just elected cleanly serves a lagging high
watermark, and refuses ListOffsets until it has caught up)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from aiokafka.errors import UnknownError
from faust.types import TP

from kdiv.worker import rewinds
from kdiv.worker.rewinds import RewindChecks
from kdiv.worker.unit import UnitOfWork
from tests.harness.streams import Log
from tests.unit.test_log_rewind import validated

ORDERS = TP("orders", 0)


class Consumer:
    """The worker's consumer as the check sees it: the last fetch's high watermark, and the
    leader's answer to ListOffsets (an exception: its refusal)."""

    def __init__(self, fetched: int, answer: int | BaseException | None, epoch_end: int = -1) -> None:
        self.fetched = fetched
        self.answer = answer
        self.asked = 0
        # Where the leader epoch last validated ends on the leader (OffsetForLeaderEpoch).
        self._thread = SimpleNamespace(leader_epoch_ends=self.leader_epoch_ends)
        self.epoch_end = epoch_end
        self.epochs_asked: list[dict] = []
        self.restarted: dict[TP, int] = {}

    def highwater(self, tp: TP) -> int:
        return self.fetched

    async def highwaters(self, *tps: TP) -> dict[TP, Any]:
        self.asked += 1
        if isinstance(self.answer, BaseException):
            raise self.answer
        if self.answer is None:
            await asyncio.sleep(3600)  # a leader that never answers
        return dict.fromkeys(tps, self.answer)

    async def leader_epoch_ends(self, epochs: dict[TP, int]) -> dict[TP, tuple[int, int]]:
        self.epochs_asked.append(dict(epochs))
        return {tp: (epoch, self.epoch_end) for tp, epoch in epochs.items()}

    async def restart_at(self, offsets: dict[TP, int]) -> None:
        self.restarted.update(offsets)


def worker_over(consumer: Consumer) -> RewindChecks:
    """The worker's rewind checks with only what the check reads: the validated partitions and the consumer."""
    live, _ = validated(Log("orders"), range(1, 201))  # offsets 0..200
    return RewindChecks(cast(Any, SimpleNamespace(consumer=consumer)), live, UnitOfWork(), None, lambda: 0)


async def test_a_lagging_high_watermark_the_leader_does_not_confirm_is_no_rewind():
    consumer = Consumer(fetched=150, answer=201)
    worker = worker_over(consumer)
    await worker.check_high_watermarks()
    assert consumer.asked == 1
    assert worker.live.take_rewinds() == [] and consumer.restarted == {}
    assert worker.live.validator.partitions[("orders", 0)].last_offset == 200


async def test_a_leader_refusing_to_answer_is_asked_again_at_the_next_commit():
    # OFFSET_NOT_AVAILABLE (KIP-207), which aiokafka 0.14 knows only as UnknownError.
    consumer = Consumer(fetched=150, answer=UnknownError("offset not available"))
    worker = worker_over(consumer)
    await worker.check_high_watermarks()
    assert worker.live.take_rewinds() == []

    assert consumer.restarted == {}

    consumer.answer = 150  # a truncated log, confirmed
    await worker.check_high_watermarks()
    (rewind,) = worker.live.take_rewinds()
    assert (rewind.first_offset, rewind.last_offset, rewind.detected_by) == (150, 200, "high watermark")
    assert "ends at offset 150" in rewind.detail
    # Read on from the new end, whatever the consumer took as read before.
    assert consumer.restarted == {ORDERS: 150}


async def test_a_leader_that_does_not_answer_in_time_holds_no_commit_for_long(monkeypatch):
    monkeypatch.setattr(rewinds, "HIGHWATER_CONFIRM_TIMEOUT_S", 0.05)
    worker = worker_over(Consumer(fetched=150, answer=None))
    await worker.check_high_watermarks()
    assert worker.live.take_rewinds() == []


async def test_a_high_watermark_past_the_validated_offsets_asks_nobody():
    consumer = Consumer(fetched=201, answer=0)
    worker = worker_over(consumer)
    await worker.check_high_watermarks()
    assert consumer.asked == 0 and worker.live.take_rewinds() == []


async def test_the_leader_confirms_a_lower_end_than_the_fetch_said():
    """The rewind starts where the leader says the log ends, not where the fetch said."""
    consumer = Consumer(fetched=190, answer=120)
    worker = worker_over(consumer)
    await worker.check_high_watermarks()
    (rewind,) = worker.live.take_rewinds()
    assert (rewind.first_offset, rewind.last_offset) == (120, 200)
    assert consumer.restarted == {ORDERS: 120}


async def test_a_log_refilled_since_its_truncation_is_rewound_from_where_it_diverged():
    """New records written after the truncation put the log's end (151) above where it was
    cut (101): the end of the leader epoch last validated says where."""
    consumer = Consumer(fetched=150, answer=151, epoch_end=101)
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (4, 200)  # the epoch of offset 200, the last validated
    await worker.check_high_watermarks()
    assert consumer.epochs_asked == [{ORDERS: 4}]
    (rewind,) = worker.live.take_rewinds()
    assert (rewind.first_offset, rewind.last_offset, rewind.detected_by) == (101, 200, "high watermark")
    assert "diverged from what was validated at offset 101" in rewind.detail
    assert consumer.restarted == {ORDERS: 101}


async def test_a_log_refilled_past_the_validated_offsets_is_a_rewind_only_where_its_epoch_diverged():
    # The fetch saw the truncated log's end; by the commit, new records refilled it past
    # offset 200. The leader epoch of offset 200 ends at 101 on the leader: cut there.
    consumer = Consumer(fetched=102, answer=252, epoch_end=101)
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (4, 200)
    await worker.check_high_watermarks()
    (rewind,) = worker.live.take_rewinds()
    assert (rewind.first_offset, rewind.last_offset) == (101, 200)
    assert "refilled since" in rewind.detail and consumer.restarted == {ORDERS: 101}

    # A new leader that has every record validated (its epoch ends past them): nothing.
    consumer = Consumer(fetched=102, answer=252, epoch_end=201)
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (4, 200)
    await worker.check_high_watermarks()
    assert worker.live.take_rewinds() == [] and consumer.restarted == {}


async def test_without_a_known_epoch_the_end_is_the_truncation_point():
    consumer = Consumer(fetched=150, answer=150, epoch_end=101)
    worker = worker_over(consumer)  # a worker started afresh: no epoch validated yet
    await worker.check_high_watermarks()
    assert consumer.epochs_asked == []
    (rewind,) = worker.live.take_rewinds()
    assert rewind.first_offset == 150
