"""Topic IDs: the identity a broker gives a topic, new when it is deleted and created again.

Offsets name records only within one incarnation of a topic. A worker that saved "validated
up to offset 200" of a topic since deleted and recreated would read offset 201 of another
log. Kafka's Metadata (v10+) carries each topic's ID; aiokafka does not read it, librdkafka's
admin client does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from kdiv.config.settings import Settings

log = logging.getLogger("kdiv.topicids")

# What a broker without topic IDs answers (Metadata before v10, or IDs not yet assigned).
_NO_ID = "AAAAAAAAAAAAAAAAAAAAAA"


class TopicIds:
    """Reads topic IDs through one admin client, kept for the worker's lifetime."""

    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        self._config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": settings.bootstrap,
            **settings.kafka_security.librdkafka_config(),
        }
        self._timeout_s = timeout_s
        self._admin: AdminClient | None = None

    def describe(self, names: Iterable[str]) -> dict[str, str]:
        """Topic name -> topic ID (base64, as Kafka's tools print it) for the topics that have one.

        A topic missing from the answer has no usable ID: deleted, unknown, or a broker that
        does not give IDs. Raises KafkaException when the cluster does not answer.
        """
        names = sorted(set(names))
        if not names:
            return {}
        if self._admin is None:
            self._admin = AdminClient(self._config)
        futures = self._admin.describe_topics(TopicCollection(names), request_timeout=self._timeout_s)
        found: dict[str, str] = {}
        for name, future in futures.items():
            try:
                description = future.result(timeout=self._timeout_s)
            except KafkaException as missing:
                log.debug("no topic id for %s: %s", name, missing)
                continue
            topic_id = str(description.topic_id) if description.topic_id is not None else ""
            if topic_id and topic_id != _NO_ID:
                found[name] = topic_id
        return found

    async def current(self, names: Iterable[str]) -> dict[str, str]:
        """`describe` off the event loop; {} (the signal unavailable) when it fails."""
        try:
            return await asyncio.to_thread(self.describe, list(names))
        except (KafkaException, TimeoutError) as failed:
            log.warning("could not read topic ids (a recreated topic is then told by other signals): %s", failed)
            return {}
