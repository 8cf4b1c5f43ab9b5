"""Leader epochs (KIP-320): each fetched batch's epoch reaches the worker with its records, and
a batch of a newer epoch is validated only once the leader says the last epoch validated
ends at or past the next offset to validate; an end below it is a rewind from there."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any, cast

from aiokafka.consumer.fetcher import READ_COMMITTED, PartitionRecords
from aiokafka.errors import NotLeaderForPartitionError
from aiokafka.protocol.api import RequestHeader_v1
from faust.types import TP

from kdiv.worker.faustcompat.epochs import (
    NO_EPOCH,
    EpochedRecords,
    EpochsUnsupported,
    EpochTrackingRecords,
    OffsetForLeaderEpochRequest,
    batch_leader_epochs,
    records_from,
)
from kdiv.worker.faustcompat.parsed import _unpack_parsed
from kdiv.worker.rewinds import RewindChecks
from kdiv.worker.unit import UnitOfWork
from tests.harness.streams import Log
from tests.unit.test_log_rewind import validated
from tests.unit.test_parsed_records import batch

ORDERS = TP("orders", 0)


def in_epoch(raw: bytes, epoch: int) -> bytes:
    """`raw` (one batch) written in leader epoch `epoch` (bytes 12..15; not under the CRC)."""
    stamped = bytearray(raw)
    struct.pack_into(">i", stamped, 12, epoch)
    return bytes(stamped)


def parsed(data: bytes, fetch_offset: int = 0) -> EpochedRecords:
    records = PartitionRecords(ORDERS, EpochTrackingRecords(data), None, fetch_offset, None, None, True, READ_COMMITTED)
    taken = list(_unpack_parsed(records))
    return EpochedRecords(taken, records.__dict__["kdiv_epochs"])


def test_each_batch_names_its_leader_epoch():
    data = in_epoch(batch(0, 5), 3) + in_epoch(batch(5, 5), 3) + in_epoch(batch(10, 3), 7)
    records = parsed(data)
    assert [r.offset for r in records] == list(range(13))
    assert batch_leader_epochs(records) == [(0, 3), (5, 3), (10, 7)]
    # From the middle of a batch (a fetch starts at the batch holding the fetch offset): its
    # first record taken stands for it.
    from_seven = parsed(in_epoch(batch(5, 5), 3) + in_epoch(batch(10, 3), 7), fetch_offset=7)
    assert [r.offset for r in from_seven] == list(range(7, 13))
    assert batch_leader_epochs(from_seven) == [(7, 3), (10, 7)]


def test_records_kept_from_an_offset_keep_their_batches_epochs():
    records = parsed(in_epoch(batch(0, 5), 3) + in_epoch(batch(5, 5), 4) + in_epoch(batch(10, 3), 7))
    assert batch_leader_epochs(records_from(records, 7)) == [(5, 4), (10, 7)]
    assert [r.offset for r in records_from(records, 7)] == list(range(7, 13))
    assert records_from(records, 13) == []
    assert batch_leader_epochs([object()]) == []  # records from elsewhere: no epochs known


def test_the_request_asks_as_a_consumer_for_each_partitions_epoch():
    request = OffsetForLeaderEpochRequest({TP("b", 1): 4, TP("a", 0): 2, TP("a", 2): 9})
    struct_ = request.prepare({23: (2, 4)})  # Kafka 4 answers v2..v4
    assert struct_.API_VERSION == 3
    assert struct_.to_object() == {
        "replica_id": -1,
        "topics": [
            {
                "topic": "a",
                "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 2},
                    {"partition": 2, "current_leader_epoch": -1, "leader_epoch": 9},
                ],
            },
            {"topic": "b", "partitions": [{"partition": 1, "current_leader_epoch": -1, "leader_epoch": 4}]},
        ],
    }
    assert isinstance(struct_.build_request_header(1, "kdiv"), RequestHeader_v1)


# -- the check before a batch is validated ----------------------------------------------------


class Thread:
    """The consumer thread as the check asks it: where an epoch ends on the leader."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.asked: list[dict] = []

    async def leader_epoch_ends(self, epochs):
        self.asked.append(dict(epochs))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return dict.fromkeys(epochs, self.answer)


class Consumer:
    def __init__(self, answer) -> None:
        self._thread = Thread(answer)
        self.restarted: dict[TP, int] = {}

    async def restart_at(self, offsets) -> None:
        self.restarted.update(offsets)


def worker_over(consumer: Consumer) -> RewindChecks:
    live, _ = validated(Log("orders"), range(1, 201))  # offsets 0..200
    return RewindChecks(
        cast(Any, SimpleNamespace(consumer=consumer)),
        live,
        UnitOfWork(),
        SimpleNamespace(log_rewinds=0),
        lambda: 1_700_000_000_000,
    )


def fetched(first: int, *epochs: tuple[int, int]) -> EpochedRecords:
    return EpochedRecords([SimpleNamespace(offset=first)], list(epochs))


async def test_the_first_batch_teaches_the_epoch_and_a_later_one_of_the_same_epoch_asks_nobody():
    consumer = Consumer((5, 201))
    worker = worker_over(consumer)
    part = worker.live.validator.partitions[("orders", 0)]
    assert not await worker.log_diverged(("orders", 0), fetched(201, (201, 5)))
    part.last_offset = 201  # validated
    assert not await worker.log_diverged(("orders", 0), fetched(202, (202, 5)))
    part.last_offset = 202
    assert consumer._thread.asked == [] and worker.known_epoch(("orders", 0)) == 5


async def test_an_epoch_learnt_of_another_record_than_the_last_validated_is_not_known():
    """Revoked, the partition came back with more validated by another worker (or a rewind
    moved its state back): the epoch kept is of another record, and is not asked about."""
    consumer = Consumer((4, 101))
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (5, 150)
    assert worker.known_epoch(("orders", 0)) == NO_EPOCH
    assert not await worker.log_diverged(("orders", 0), fetched(201, (201, 6)))
    assert consumer._thread.asked == [] and worker.leader_epochs[("orders", 0)] == (6, 201)


async def test_replays_of_an_older_epoch_teach_nothing():
    worker = worker_over(Consumer((0, 0)))
    assert not await worker.log_diverged(("orders", 0), fetched(150, (100, 2)))
    assert worker.leader_epochs == {}


async def test_a_new_leader_holding_every_validated_record_is_no_rewind():
    consumer = Consumer((5, 201))  # epoch 5 ends at 201 on the new leader: all of it is there
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (5, 200)  # the epoch of offset 200, the last validated
    assert not await worker.log_diverged(("orders", 0), fetched(201, (201, 6)))
    assert consumer._thread.asked == [{ORDERS: 5}]
    assert worker.live.take_rewinds() == [] and consumer.restarted == {}
    assert worker.leader_epochs[("orders", 0)] == (6, 201)


async def test_a_new_leader_whose_log_diverged_below_the_validated_offsets_is_a_rewind_from_there():
    consumer = Consumer((4, 101))  # it never had epoch 5: its log went on in epoch 6 from offset 101
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (5, 200)  # the epoch of offset 200, the last validated
    # The new leader's records already fill the log past the old end: the position is valid.
    assert await worker.log_diverged(("orders", 0), fetched(201, (201, 6)))
    (incident,) = worker.unit.incidents(("orders", 0))
    assert (incident.verdict, incident.offset) == ("LOG_REWOUND", 101)
    assert "offsets 101..200" in incident.detail and "leader epoch" in incident.detail
    assert consumer.restarted == {ORDERS: 101}  # read again from where it diverged
    assert worker.live.validator.partitions[("orders", 0)].last_offset == 100


async def test_an_unanswered_question_fetches_the_batch_again_unvalidated():
    consumer = Consumer(NotLeaderForPartitionError())
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (5, 200)  # the epoch of offset 200, the last validated
    assert await worker.log_diverged(("orders", 0), fetched(201, (201, 6)))
    assert consumer.restarted == {ORDERS: 201} and worker.live.take_rewinds() == []
    assert worker.known_epoch(("orders", 0)) == 5  # asked again with the batch fetched again


async def test_a_broker_without_the_request_turns_the_signal_off():
    consumer = Consumer(EpochsUnsupported("node 1 does not answer OffsetForLeaderEpoch v3"))
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (5, 200)  # the epoch of offset 200, the last validated
    assert not await worker.log_diverged(("orders", 0), fetched(201, (201, 6)))
    assert not worker.checks_leader_epochs


async def test_records_without_epochs_are_not_checked():
    consumer = Consumer((0, 0))
    worker = worker_over(consumer)
    worker.leader_epochs[("orders", 0)] = (5, 200)  # the epoch of offset 200, the last validated
    assert not await worker.log_diverged(("orders", 0), [SimpleNamespace(offset=201)])
    assert not await worker.log_diverged(("orders", 0), fetched(201, (201, NO_EPOCH)))
    assert consumer._thread.asked == []
