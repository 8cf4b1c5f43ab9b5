"""The watched topics' records as aiokafka parsed them, taken from its fetcher in bulk.

aiokafka parses a fetched record batch in C, then, one record at a time in Python, checks
its offset, copies it into a ConsumerRecord (a dataclass and a tuple of its headers) and
yields it through two generator frames to `FetchResult.getall`'s append loop. For a worker
that validates in about 2 us a record, that costs as much again. For the watched topics
(`yield_parsed_records`) the fetcher hands over each batch's parsed records in bulk: they
have every field the validator reads but topic and partition, which are the batch's.

`_unpack_parsed` is aiokafka 0.14's `PartitionRecords._unpack_records` (CRC check,
read_committed filtering of aborted transactions, control batches, compacted batches)
with one change: a batch's records are taken as a list and the fetch position moves past
the batch at once. That is exact only when the whole fetch result is drained in one
`getall` without a record limit, which is what `_getall_parsed` does and the only way
Faust reads (it sets no `broker_max_poll_records`); any other read takes aiokafka's own path.

Each partition's records come as `EpochedRecords`, naming the leader epoch of each batch
(`kdiv.worker.faustcompat.epochs`, for the worker's leader epoch check of log rewinds), and
the offset the fetch was made at and the position it left (for the worker's check of
records deleted before validation: a fetch that starts where the last one left off or at
the next offset to validate was no reset to the log start).

The switch is per process and per topic: another aiokafka consumer of a watched topic in the
worker's process would get parsed records from `getmany` too. The worker has none (its
incidents reader follows the incidents topic); keep it so.
"""

from __future__ import annotations

import aiokafka.errors as errors
from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords

from kdiv.worker.faustcompat.epochs import NO_EPOCH, EpochedRecords, track_batch_epochs

# Topics whose records aiokafka's fetcher hands over as parsed, in this process.
_PARSED_TOPICS: set[str] = set()
_unpack_records = PartitionRecords._unpack_records
_getall = FetchResult.getall


def yield_parsed_records(topics: frozenset[str]) -> None:
    """Make every aiokafka consumer of this process return the records of `topics` as
    parsed, from `getall` without a record limit (see the module doc)."""
    _PARSED_TOPICS.update(topics)
    track_batch_epochs()
    PartitionRecords._unpack_records = _unpack_parsed_or_records
    FetchResult.getall = _getall_parsed


def _unpack_parsed_or_records(self: PartitionRecords):
    if self._tp.topic in _PARSED_TOPICS:
        return _unpack_parsed(self)
    return _unpack_records(self)


def _getall_parsed(self: FetchResult, max_records=None):
    tp = self._topic_partition
    if max_records is not None or tp.topic not in _PARSED_TOPICS:
        return _getall(self, max_records)
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
