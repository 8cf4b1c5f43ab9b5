"""The commit that waited for good: aiokafka's producer drops a topic it learned from a full
metadata fetch once it tracks any other topic, and a batch queued for the dropped topic then
waits for a leader no refresh brings back (until the request timeout; Faust's is 20 minutes).
Faust makes that full fetch itself: its topic creation (the worker's changelogs, at start)
refreshes the producer's metadata while the producer tracks no topic yet. Reproduced here on
a real broker, and the cure kdiv's writers and worker use: every topic written to is tracked
first (`kdiv.kafka.produce.track_topic`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import NotLeaderForPartitionError

from kdiv.kafka.produce import track_topic


async def _queued_batch_after_another_topic_is_tracked(
    bootstrap: str, topic_factory: Callable[..., str], *, tracked_first: bool
) -> bool:
    """True when a batch queued for a topic known from the start is acknowledged after the
    producer began tracking a topic created later."""
    known = topic_factory(partitions=2)
    # Lingering keeps the batch queued while the other topic's metadata refresh lands, as a
    # batch waits behind a slow request to its node under load.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1500, request_timeout_ms=12_000)
    await producer.start()
    try:
        later = topic_factory(partitions=1)
        # What Faust's topic creation does: every topic's metadata, none of them tracked.
        await producer.client.force_metadata_update()
        assert producer.client.cluster.partitions_for_topic(known) == {0, 1}
        if tracked_first:
            await track_topic(producer, known)
        batch = producer.create_batch()
        batch.append(key=b"k", value=b"v", timestamp=None)
        acked = await producer.send_batch(batch, known, partition=1)
        await producer.client.add_topic(later)  # what a first write to the new topic does
        try:
            await asyncio.wait_for(asyncio.shield(acked), 6)
        except TimeoutError:
            # Still waiting well past the linger; it fails only at the request timeout.
            with contextlib.suppress(NotLeaderForPartitionError):
                await acked
            return False
        return True
    finally:
        await asyncio.wait_for(producer.stop(), 60)


async def test_a_batch_for_a_topic_dropped_from_the_metadata_waits_and_tracking_it_cures_that(bootstrap, topic_factory):
    assert await _queued_batch_after_another_topic_is_tracked(bootstrap, topic_factory, tracked_first=False) is False
    assert await _queued_batch_after_another_topic_is_tracked(bootstrap, topic_factory, tracked_first=True) is True
