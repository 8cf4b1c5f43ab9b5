"""The aiokafka producer kdiv's own writers use (the DIV writer, the development registry)."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from kdiv.config.security import PLAINTEXT, KafkaSecurity


def new_producer(bootstrap_servers: str, *, security: KafkaSecurity = PLAINTEXT, **options) -> AIOKafkaProducer:
    """A producer, not started, whose every record is acknowledged by all in-sync replicas."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers, **{"acks": "all", "linger_ms": 5, **security.aiokafka_kwargs(), **options}
    )
