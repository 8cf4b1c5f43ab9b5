"""The aiokafka producer kdiv's own writers use (the DIV writer, the development registry)."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.kafka.requests import bound_requests


def new_producer(bootstrap_servers: str, *, security: KafkaSecurity = PLAINTEXT, **options) -> AIOKafkaProducer:
    """A producer, not started, whose every record is acknowledged by all in-sync replicas, and
    whose every request fits in its `max_request_size` (`kdiv.kafka.requests`)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers, **{"acks": "all", "linger_ms": 5, **security.aiokafka_kwargs(), **options}
    )
    bound_requests(producer, name=f"kdiv's producer to {bootstrap_servers}")
    return producer


async def started_producer(
    bootstrap_servers: str, *, security: KafkaSecurity = PLAINTEXT, **options
) -> AIOKafkaProducer:
    """`new_producer`, started; a start that fails closes what it opened (for a retry)."""
    producer = new_producer(bootstrap_servers, security=security, **options)
    try:
        await producer.start()
    except BaseException:
        await producer.stop()
        raise
    return producer


async def track_topic(producer: AIOKafkaProducer, topic: str) -> None:
    """Have the producer's client keep `topic`'s metadata; call before writing to it.

    Once aiokafka's client tracks any topic, each metadata refresh asks for the tracked topics
    only and replaces what it knew. A topic it learned otherwise (from the full fetch at its
    start, before any topic was tracked) is then dropped, and a batch already queued for it
    waits for a leader that no refresh brings back, until the request timeout. A tracked
    topic stays. Cheap once tracked: a set lookup."""
    await producer.client.add_topic(topic)
