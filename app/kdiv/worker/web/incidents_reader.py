"""The incidents the views show: every worker follows the whole incidents topic into its
`RecentIncidents`, so any worker answers `/incidents/` for the group, and keeps how far it
has read each partition (the view's `read_to`).

The topic's records are untrusted: a record whose value is not an incident is counted
(`bad_incident_records`) and logged with its place, never held, and reading goes on. What is
held is bounded by count and by bytes, keys included (`RecentIncidents`).
"""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaConsumer

from kdiv.config.settings import Settings
from kdiv.incident.shape import Incident
from kdiv.kafka.consume import topic_partitions

log = logging.getLogger("kdiv.worker")


def follow_incidents(app, worker) -> None:
    """Have the app follow the incidents topic into the worker's `recent` incidents and
    `incidents_read_to` while it runs."""

    @app.task
    async def follow_incidents() -> None:
        await read_incidents(worker)


def incidents_consumer(settings: Settings) -> AIOKafkaConsumer:
    """The consumer `read_incidents` follows the incidents topic with, not started."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.app_id}-incidents-reader",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **settings.kafka_security.aiokafka_kwargs(),
    )


async def read_incidents(worker) -> None:
    """Follow the whole incidents topic, so every worker can show every incident."""
    consumer = incidents_consumer(worker.settings)
    await consumer.start()
    try:
        assigned = await topic_partitions(consumer, worker.settings.incidents)
        consumer.assign(assigned)
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    add_incident(worker, record)
            # The view says how far it has read: a worker's list trails the topic by a
            # fetch, and a reader can tell "not yet read" from "not there".
            for tp in assigned:
                worker.incidents_read_to[tp.partition] = await consumer.position(tp)
    finally:
        await consumer.stop()


def add_incident(worker, record) -> None:
    """Keep one record of the incidents topic among the worker's recent incidents."""
    if record.value is None:
        return
    try:
        incident = Incident.from_value(record.value)
    except (ValueError, TypeError) as bad:
        worker.stats.bad_incident_records += 1
        log.error("unreadable incident at %s[%d]@%d: %s", record.topic, record.partition, record.offset, bad)
        return
    # A compacted topic refuses records without a key; b"" stands in should one come.
    worker.recent.add(record.key or b"", incident, len(record.value))
