"""What a worker must know of the cluster before Faust starts: which topics it watches, their
partition counts (a state table per count, see `kdiv.worker.main`) and compaction policy, whether
the broker is Tansu; and the incidents topic, created compacted if missing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from kdiv.config.settings import Settings
from kdiv.kafka.requests import DEFAULT_REQUEST_BYTES, broker_request_max_bytes, request_limit
from kdiv.kafka.tansu import detect_tansu, fetch_cluster_id
from kdiv.kafka.topics import TopicCreationError, create_topic
from kdiv.state.tables import ledger_changelog_topic_name, ledger_partition_counts
from kdiv.trace.routes import validate_routes

log = logging.getLogger(__name__)
T = TypeVar("T")

_WAIT_LOG_EVERY_S = 10.0
_POLL_S = 1.0


class DiscoveryError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class WatchedTopic:
    name: str
    partitions: int
    # min.compaction.lag.ms when the topic is compacted, else None.
    compaction_lag_ms: int | None


@dataclass(frozen=True, slots=True)
class ClusterView:
    tansu: bool
    topics: tuple[WatchedTopic, ...]
    # The id the brokers report in Metadata (None when they give none): whose reports are this
    # cluster's (kdiv.worker.report_scope).
    cluster_id: str | None = None
    # The bytes one produce request may carry: Kafka's max.request.size default, or less where
    # the brokers accept less (socket.request.max.bytes; kdiv.kafka.requests).
    request_bytes: int = DEFAULT_REQUEST_BYTES

    @property
    def partition_counts(self) -> tuple[int, ...]:
        return tuple(sorted({t.partitions for t in self.topics}))

    def topic(self, name: str) -> WatchedTopic | None:
        return next((t for t in self.topics if t.name == name), None)


def run_in_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a private loop in a thread.

    Discovery runs when `kdiv.worker.main` is imported, before Faust has set up its loop; a thread
    keeps the caller's thread free of a closed or foreign event loop.
    """
    result: list = []

    def target() -> None:
        try:
            result.append(("ok", asyncio.run(coro)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result.append(("error", exc))

    thread = threading.Thread(target=target, name="kdiv-discovery")
    thread.start()
    thread.join()
    status, value = result[0]
    if status == "error":
        raise value
    return value


def admin_client(settings: Settings) -> AIOKafkaAdminClient:
    """The worker's admin client, not started."""
    return AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.app_id}-discovery",
        **settings.kafka_security.aiokafka_kwargs(),
    )


def named_topics(settings: Settings) -> tuple[str, ...]:
    """The topics the settings name (watched, changefeeds, routes), each once: a topic may be
    watched and on a route too."""
    return tuple(
        dict.fromkeys((*settings.topics, *settings.changefeeds.topics, *sorted(settings.audit.route_topics())))
    )


async def discover(settings: Settings, *, wait_s: float | None = None, create_own: bool = True) -> ClusterView:
    """Resolve the watched topics, waiting until they exist (forever when wait_s is None).

    `create_own`: create the topics the worker writes outside Faust's tables if missing
    (incidents, key ledgers); a read-only job must not create topics."""
    admin = admin_client(settings)
    await admin.start()
    try:
        tansu = await detect_tansu(admin)
        cluster_id = await fetch_cluster_id(admin)
        request_bytes = request_limit(DEFAULT_REQUEST_BYTES, None if tansu else await broker_request_max_bytes(admin))
        if create_own:
            # One partition: incidents are few, and one order makes "recent" and paging simple.
            await _ensure_compacted_topic(admin, settings, settings.incidents, 1)
            if settings.audit.judged_live:
                # Every observation of a trace is kept until judged: not compacted by trace key.
                await _ensure_compacted_topic(
                    admin, settings, settings.observations, settings.audit.partitions, compacted=False
                )
        started = last_log = time.monotonic()
        while True:
            counts = await _partition_counts(admin, settings)
            named = named_topics(settings)
            missing = [t for t in named if t not in counts]
            if counts and not missing:
                break
            pattern = settings.topic_pattern.pattern if settings.topic_pattern is not None else ""
            waiting_for = ", ".join(missing) if missing else f"a topic matching {pattern!r}"
            now = time.monotonic()
            if wait_s is not None and now - started >= wait_s:
                raise DiscoveryError(f"no such topic after {wait_s:.0f} s: {waiting_for}")
            if now - last_log >= _WAIT_LOG_EVERY_S or last_log == started:
                log.warning("waiting for watched topic(s) to exist: %s", waiting_for)
                for problem in validate_routes(settings.audit.routes, counts):
                    log.warning("pipeline audit: %s", problem)
                last_log = now
            await asyncio.sleep(_POLL_S)
        lags = await _compaction_lags(admin, settings, sorted(counts))
        # A changefeed topic is verified by row checksums: its compaction concerns no DIV rule.
        topics = tuple(
            WatchedTopic(name, counts[name], None if settings.is_changefeed(name) else lags[name])
            for name in sorted(counts)
        )
        cluster = ClusterView(tansu=tansu, topics=topics, cluster_id=cluster_id, request_bytes=request_bytes)
        if create_own:
            # A key ledger is partitioned as the compacted topics it covers.
            for partitions in ledger_partition_counts(cluster):
                await _ensure_compacted_topic(
                    admin, settings, ledger_changelog_topic_name(settings.app_id, partitions), partitions
                )
        return cluster
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient, settings: Settings) -> dict[str, int]:
    names = [n for n in await admin.list_topics() if settings.watches(n)]
    if not names:
        return {}
    counts = {}
    for described in await admin.describe_topics(names):
        if described.get("error_code", 0) == 0 and described["partitions"]:
            counts[described["topic"]] = len(described["partitions"])
    return counts


async def _compaction_lags(admin: AIOKafkaAdminClient, settings: Settings, names: list[str]) -> dict[str, int | None]:
    lags: dict[str, int | None] = {}
    to_read = []
    for name in names:
        if name in settings.compaction_lag_ms:
            lags[name] = settings.compaction_lag_ms[name]
        elif "*" in settings.compaction_lag_ms:
            lags[name] = settings.compaction_lag_ms["*"]
        else:
            to_read.append(name)
    if to_read:
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in to_read]
        for response in await admin.describe_configs(resources):
            for error_code, error_message, _type, name, entries, *_ in response.resources:
                if error_code:
                    raise DiscoveryError(f"cannot read the config of topic {name}: {error_message} ({error_code})")
                config = {entry[0]: entry[1] for entry in entries}
                policy = config.get("cleanup.policy") or "delete"
                lags[name] = int(config.get("min.compaction.lag.ms") or 0) if "compact" in policy else None
    return lags


async def _ensure_compacted_topic(
    admin: AIOKafkaAdminClient, settings: Settings, name: str, partitions: int, *, compacted: bool = True
) -> None:
    if name in await admin.list_topics():
        return
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=settings.replication_factor,
        topic_configs={"cleanup.policy": "compact" if compacted else "delete"},
    )
    try:
        await create_topic(admin, topic)
    except TopicCreationError as refused:
        raise DiscoveryError(str(refused)) from None
