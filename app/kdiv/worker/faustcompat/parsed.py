"""The watched topics' records as aiokafka parsed them, taken from the worker's fetcher in bulk.

aiokafka parses a fetched record batch in C, then, one record at a time in Python, checks
its offset, copies it into a ConsumerRecord (a dataclass and a tuple of its headers) and
yields it through two generator frames to `FetchResult.getall`'s append loop. For a worker
that validates in about 2 us a record, that costs as much again. For the watched topics
the worker's fetcher hands over each batch's parsed records in bulk: they have every field
the validator reads but topic and partition, which are the batch's.

Only the worker's own consumer does (`parse_in_bulk`, called on the aiokafka consumer
Faust's consumer thread starts for kdiv). Its fetcher reads each fetch response with
aiokafka's own `Fetcher._proc_fetch_request`, bound to that fetcher alone with other globals:
its records read through `EpochTrackingRecords` (`kdiv.worker.faustcompat.epochs`), and each
fetch result of a watched topic made `in_bulk`, still of aiokafka's exact type `FetchResult`,
which the fetcher checks. No module or class of aiokafka changes: every other aiokafka
consumer of the process, of any topic, reads as aiokafka alone does.

`_unpack_parsed` is aiokafka 0.14's `PartitionRecords._unpack_records` (CRC check,
read_committed filtering of aborted transactions, control batches, compacted batches)
with one change: a batch's records are taken as a list and the fetch position moves past
the batch at once (tests/unit/test_parsed_records.py compares both paths record by record).
That is exact only when the whole fetch result is drained in one `getall` without a record
limit, which is what `_getall_parsed` does and the only way Faust reads (it sets no
`broker_max_poll_records`); any other read takes aiokafka's own `getall`.

Each partition's records come as `EpochedRecords`, naming the leader epoch of each batch
(`kdiv.worker.faustcompat.epochs`, for the worker's leader epoch check of log rewinds), and
the offset the fetch was made at and the position it left (for the worker's check of
records deleted before validation: a fetch that starts where the last one left off or at
the next offset to validate was no reset to the log start).
"""

from __future__ import annotations

from types import FunctionType, MethodType
from typing import Any

import aiokafka.errors as errors
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.consumer.fetcher import READ_COMMITTED, Fetcher, FetchResult, PartitionRecords

from kdiv.worker.faustcompat.epochs import NO_EPOCH, EpochedRecords, EpochTrackingRecords


def parse_in_bulk(consumer: Any, topics: frozenset[str]) -> None:
    """Have this started aiokafka consumer, and no other, return the records of `topics` as
    parsed, from `getmany` (see the module doc). Call before it fetches: right after `start`,
    while it has no assignment yet."""
    fetcher = consumer._fetcher
    read_response = Fetcher._proc_fetch_request

    def bulk_result(tp: Any, **parts: Any) -> FetchResult:
        result = FetchResult(tp, **parts)
        return in_bulk(result) if tp.topic in topics else result

    # aiokafka's code, reading these names from its module's globals: here from a copy of
    # them with kdiv's records and results in place.
    names = {**aiokafka_fetcher.__dict__, "MemoryRecords": EpochTrackingRecords, "FetchResult": bulk_result}
    own = FunctionType(
        read_response.__code__, names, read_response.__name__, read_response.__defaults__, read_response.__closure__
    )
    fetcher._proc_fetch_request = MethodType(own, fetcher)


def in_bulk(result: FetchResult) -> FetchResult:
    """Have one fetch result, not yet read, hand its records over parsed and in bulk."""
    records = result._partition_records
    # Replaces the generator of aiokafka's own `_unpack_records`, not started yet.
    records._records_iterator = _unpack_parsed(records)
    # On the instance: `type(result) is FetchResult` still holds, as the fetcher requires.
    result.getall = MethodType(_getall_parsed, result)
    return result


def _getall_parsed(self: FetchResult, max_records=None):
    if max_records is not None:
        return FetchResult.getall(self, max_records)
    tp = self._topic_partition
    if not self.check_assignment(tp) or not self.has_more():
        return []
    records = self._partition_records
    fetched_from = records.next_fetch_offset  # the fetch offset: nothing is drained yet
    iterator = records._records_iterator
    # Drained in C: the generator yields whole lists (`yield from`).
    taken = list(iterator) if iterator is not None else []
    records._records_iterator = None
    self._update_position()
    self._partition_records = None
    return EpochedRecords(taken, records.__dict__.pop("kdiv_epochs", []), fetched_from, records.next_fetch_offset)


def _unpack_parsed(self: PartitionRecords):
    tp = self._tp
    records = self._records
    # (first offset, leader epoch) of each batch yielded, for `_getall_parsed`.
    epochs: list[tuple[int, int]] = self.__dict__.setdefault("kdiv_epochs", [])
    while records.has_next():
        next_batch = records.next_batch()
        if self._check_crcs and not next_batch.validate_crc():
            raise errors.CorruptRecordException(f"Invalid CRC - {tp}")
        if self._isolation_level == READ_COMMITTED and next_batch.producer_id is not None:
            self._consume_aborted_up_to(next_batch.base_offset)
            if next_batch.is_control_batch and self._contains_abort_marker(next_batch):
                self._aborted_producers.discard(next_batch.producer_id)
            if next_batch.is_transactional and next_batch.producer_id in self._aborted_producers:
                self.next_fetch_offset = next_batch.next_offset
                continue
        if next_batch.is_control_batch:
            self.next_fetch_offset = next_batch.next_offset
            continue
        parsed = list(next_batch)
        # Records below the fetch position: the rest of a batch read before a seek.
        first = 0
        position = self.next_fetch_offset
        while first < len(parsed) and parsed[first].offset < position:
            first += 1
        # Past the batch's last offset even when compaction removed its last records.
        self.next_fetch_offset = next_batch.next_offset
        if first < len(parsed):
            epochs.append((parsed[first].offset, getattr(records, "batch_epoch", NO_EPOCH)))
            yield from parsed[first:] if first else parsed
