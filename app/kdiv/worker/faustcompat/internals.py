"""Recovery and assignment state Faust keeps without a public API, read in one place; the
aiokafka producer under Faust's, for sends in whole batches."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka.consumer.fetcher import FetchResult
from faust.types import TP

from kdiv.kafka.produce import track_topic as track_producer_topic
from kdiv.untrusted import preview


def changelog_highwater(app: Any, tp: TP) -> int | None:
    """The end offset recovery restores a changelog partition to (None when not restoring it)."""
    return app.tables.recovery.active_highwaters.get(tp)


def restored_partitions(app: Any, table: Any) -> Any:
    """The changelog partitions recovery restored for `table` as an active."""
    return app.tables.recovery.actives_for_table.get(table, ())


def recovery_status(app: Any) -> dict:
    """Whether tables are recovering, and how many changelog records are left: by Faust's
    count, and by kdiv's own against the end offsets read at assignment
    (`kdiv.worker.faustcompat.bulkrestore`), which holds until every assigned partition's
    store has read to its end, whatever Faust says."""
    recovery = app.tables.recovery
    active = recovery.active_remaining_total()
    bulk = getattr(recovery, "bulk", None)
    in_progress = bool(recovery.in_recovery)
    if bulk is not None:
        left = bulk.remaining()
        # While kdiv reads in bulk, Faust's count is from offsets it has not updated yet.
        active = left if bulk.running else max(active, left)
        in_progress = in_progress or bulk.running or left > 0
    return {
        "in_progress": in_progress,
        "active_remaining": active,
        "standby_remaining": recovery.standby_remaining_total(),
    }


def restore_remaining(app: Any) -> int | None:
    """The changelog records left to restore while the tables recover (active and standby:
    either moving is progress); None when they do not."""
    status = recovery_status(app)
    return status["active_remaining"] + status["standby_remaining"] if status["in_progress"] else None


def records_en_route(app: Any, answered_since_ms: int) -> set[tuple[str, int]]:
    """The partitions whose records are on their way to the worker: fetched and waiting in its
    aiokafka fetcher or in a batch drained from it and not yet taken (`records_held`), or
    asked for in a fetch its partition's leader answered without error since
    `answered_since_ms` (aiokafka's wall clock, in ms; a full fetch response names each
    partition asked, with no records past the response's size bound). Read from the event
    loop while the consumer thread changes them: each table is copied in one step (no Python
    code runs in it, so the GIL is not let go), then looked at."""
    held = getattr(app.consumer, "records_held", None)
    en_route: set[tuple[str, int]] = set(held()) if held is not None else set()
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None)
    if consumer is None:
        return en_route
    fetcher = consumer._fetcher
    waiting = list(fetcher._records.items())
    en_route.update(
        (tp.topic, tp.partition) for tp, result in waiting if isinstance(result, FetchResult) and result.has_more()
    )
    subscription = fetcher._subscriptions.subscription
    assignment = None if subscription is None else subscription.assignment
    if assignment is not None:
        for tp, state in list(assignment._tp_state.items()):
            answered = state.timestamp
            if answered is not None and answered >= answered_since_ms:
                en_route.add((tp.topic, tp.partition))
    return en_route


def committed_offset(app: Any, tp: TP) -> int | None:
    """The offset Faust's consumer last committed (or found committed) for a partition."""
    consumer = app.consumer
    return None if consumer is None else consumer._committed_offset.get(tp)


def peer_topics(app: Any) -> dict:
    """Other workers' web URLs with the topic partitions Faust's assignor gave each."""
    return app.assignor.external_topics_metadata()


async def hand_over_table_writes(app: Any) -> None:
    """Wait until every table write is handed to the Kafka producer.

    Faust queues table writes and a task hands them over one per event-loop turn; while the
    worker validates a fetched batch the loop does not turn, so without this a commit (which
    waits for them) would wait for many batches."""
    await app.producer.buffer.flush()


async def track_topic(app: Any, topic: str) -> None:
    """Have the producer's client keep `topic`'s metadata before the first write to it
    (`kdiv.kafka.produce.track_topic` says why: under load, the worker's first commit
    otherwise waited for good on a state changelog's batch)."""
    await track_producer_topic(app.producer._ensure_producer(), topic)


async def send_in_batches(
    app: Any, topic: str, partition: int, records: Iterable[tuple[bytes, bytes | None]]
) -> list[asyncio.Future]:
    """Hand keyed records for one partition to Faust's (non-transactional) aiokafka producer
    in whole record batches, bypassing its per-message send; the futures of the batches.

    One `send` per record costs a future and a queue step each, more than the record's
    validation; a batch builder appends in C."""
    return [future for future, _ in await send_counted_batches(app, topic, partition, records)]


async def send_counted_batches(
    app: Any, topic: str, partition: int, records: Iterable[tuple[bytes, bytes | None]]
) -> list[tuple[asyncio.Future, int]]:
    """`send_in_batches`, with each batch's record count: a batch's future resolves to the
    metadata of its first record, so its last record's offset is that offset + count - 1."""
    await track_topic(app, topic)
    producer = app.producer._ensure_producer()
    sent = []
    batch = producer.create_batch()
    for key, value in records:
        if batch.append(key=key, value=value, timestamp=None) is None:
            count = batch.record_count()
            sent.append((await producer.send_batch(batch, topic, partition=partition), count))
            batch = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                raise ValueError(f"a record for {topic}[{partition}] is larger than a whole batch (key {preview(key)})")
    count = batch.record_count()
    if count:
        sent.append((await producer.send_batch(batch, topic, partition=partition), count))
    return sent


async def topic_partitions(app: Any, topic: str) -> list[int]:
    """The partitions of `topic` as Faust's aiokafka producer knows them (what a keyed send
    without a partition hashes over), in order; waits for its metadata like a send."""
    return sorted(await app.producer._ensure_producer().partitions_for(topic))
