"""Warnings that said nothing was wrong, silenced where they came from."""

from __future__ import annotations

from kdiv.config.settings import Settings
from kdiv.kafka.discovery import named_topics
from kdiv.reconcile.kafka_source import KdivKafkaDataSource, register_source


class Registry:
    def __init__(self) -> None:
        self.registered: list[type] = []

    def register(self, source: type) -> None:
        self.registered.append(source)


class Session:
    """What register_source uses of a SparkSession: its data source registry."""

    def __init__(self) -> None:
        self.dataSource = Registry()


def test_the_kafka_source_is_registered_once_per_session():
    first, second = Session(), Session()
    for _ in range(4):  # a run reads several times
        register_source(first)
    register_source(second)
    assert first.dataSource.registered == [KdivKafkaDataSource]
    assert second.dataSource.registered == [KdivKafkaDataSource]


def test_a_watched_topic_on_a_route_is_waited_for_once():
    settings = Settings.from_env({"KDIV_TOPICS": "kdiv-demo", "KDIV_ROUTES": "demo=kdiv-demo>proc>kdiv-demo-out"})
    assert named_topics(settings) == ("kdiv-demo", "kdiv-demo-out")
