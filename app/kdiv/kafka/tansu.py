"""Workarounds for brokers that speak the Kafka protocol but deviate from Apache Kafka.

This is the one module that knows about such deviations; everything else codes to the
Kafka protocol. Today the only such broker is Tansu, the embedded development broker
(`kdiv.dev.tansu`). Each workaround runs only when the caller says the broker is Tansu
(see `detect_tansu`), never on the Apache Kafka path.

Detection: Tansu reports the cluster id ``tansu_cluster`` in Metadata responses unless
started with another ``--cluster-id``. ``KDIV_BROKER_FLAVOR=tansu`` or ``=kafka``
overrides detection, e.g. for a Tansu started with a custom cluster id.

Workaround: end offsets (`end_offsets`).
    Tansu answers ListOffsets(latest) with the base offset of the last written batch
    plus one, which is too low whenever that batch held more than one record; under
    read_committed it answers 0 for a partition with an open transaction. Anything that
    reads "up to the end" (changelog recovery, completeness checks, planned batch reads)
    then silently stops short. Fetch responses do carry the correct high watermark and
    last stable offset, so on Tansu the end offset is taken from a Fetch at the last
    reported batch.

Workaround: producer ids (`enable_tansu_producer_ids`).
    Tansu fails InitProducerId v0 to v2 with UnknownServerError, and aiokafka only sends
    v0, so every idempotent or transactional aiokafka producer (a Faust worker with
    processing_guarantee="exactly_once" among them) dies at start with UnknownError.
    v3 works, so on Tansu aiokafka is taught to send v3. There is no per-producer hook
    (Faust creates its own producers), so this one is process-wide and happens only when
    called.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from collections.abc import Iterable

import aiokafka.errors as kafka_errors
import aiokafka.producer.sender as aiokafka_sender
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, TopicPartition
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka.protocol.types import (
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from kdiv.config.security import PLAINTEXT, KafkaSecurity

BROKER_FLAVOR_ENV = "KDIV_BROKER_FLAVOR"
TANSU_CLUSTER_ID = "tansu_cluster"

_FLAVORS = {"tansu": True, "kafka": False}
_DETECT_TIMEOUT_MS = 5000

# Tansu answers a Fetch with max_wait 0 with no partitions at all, so wait a little.
# The fetch offset normally holds a record, so the answer comes at once; the wait is
# only spent when every partition asked of a broker is empty.
_FETCH_MAX_WAIT_MS = 10
# Only the watermarks are wanted; a broker still returns at least one batch.
_FETCH_MAX_BYTES = 1
_FETCH_ATTEMPTS = 3

_READ_COMMITTED = 1
_READ_UNCOMMITTED = 0

# InitProducerId for a new producer: no id or epoch to bump yet.
_NO_PRODUCER_ID = -1
_NO_PRODUCER_EPOCH = -1


async def detect_tansu(
    client_or_bootstrap: str | list[str] | AIOKafkaClient | object,
    security: KafkaSecurity = PLAINTEXT,
) -> bool:
    """True when the broker is Tansu, so the workarounds in this module apply.

    `client_or_bootstrap`: a bootstrap address ("host:port" or a list of them), an
    AIOKafkaClient, or a started aiokafka consumer, producer or admin client.
    ``KDIV_BROKER_FLAVOR`` (``tansu`` / ``kafka``) wins over what the broker reports,
    and when set the broker is not contacted. `security` applies when a bootstrap address
    is given (a client brings its own).
    """
    forced = os.environ.get(BROKER_FLAVOR_ENV, "").strip().lower()
    if forced:
        if forced not in _FLAVORS:
            raise ValueError(f"{BROKER_FLAVOR_ENV}={forced!r} is not one of {', '.join(sorted(_FLAVORS))}")
        return _FLAVORS[forced]
    return await fetch_cluster_id(client_or_bootstrap, security) == TANSU_CLUSTER_ID


def detection_client(bootstrap: str | list[str], security: KafkaSecurity = PLAINTEXT) -> AIOKafkaClient:
    """The short-lived client `fetch_cluster_id` asks with, not started."""
    return AIOKafkaClient(
        bootstrap_servers=bootstrap,
        client_id="kdiv-detect",
        request_timeout_ms=_DETECT_TIMEOUT_MS,
        **security.aiokafka_kwargs(),
    )


async def fetch_cluster_id(
    client_or_bootstrap: str | list[str] | AIOKafkaClient | object,
    security: KafkaSecurity = PLAINTEXT,
) -> str | None:
    """The cluster id the broker reports in Metadata (None from brokers before Kafka 0.10.1).

    aiokafka reads the id but does not keep it (ClusterMetadata drops it), so this sends
    its own Metadata request for no topics.
    """
    if isinstance(client_or_bootstrap, (str, list)):
        client = detection_client(client_or_bootstrap, security)
        try:
            await client.bootstrap()
            return await _cluster_id_via(client)
        finally:
            await client.close()
    return await _cluster_id_via(_underlying_client(client_or_bootstrap))


async def end_offsets(
    consumer: AIOKafkaConsumer,
    partitions: Iterable[TopicPartition],
    *,
    tansu: bool,
) -> dict[TopicPartition, int]:
    """Exact end offsets: the offset after the last record a consumer of `consumer`'s
    isolation level can read (high watermark, or last stable offset under read_committed).

    On Apache Kafka this is `consumer.end_offsets`. On Tansu, whose ListOffsets answer is
    too low, each end is taken from a Fetch at max(reported - 1, 0), the offset of the
    last reported batch. The Fetch is sent on the consumer's connection but outside its
    fetcher, so the consumer's assignment, positions and buffered records are untouched
    and partitions need not be assigned to it.
    """
    partitions = list(partitions)
    reported = await consumer.end_offsets(partitions)
    if not tansu:
        return reported

    client: AIOKafkaClient = consumer._client
    read_committed = consumer._isolation_level == "read_committed"
    # consumer.end_offsets has just refreshed metadata for these partitions.
    fetch_offsets_by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
    for tp, reported_end in reported.items():
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            raise kafka_errors.LeaderNotAvailableError(
                f"no leader known for {tp.topic}[{tp.partition}] while reading its end offset"
            )
        # Even when it reports 0 (read_committed with an open transaction), ask: the
        # partition may hold records.
        fetch_offsets_by_leader[leader][tp] = max(reported_end - 1, 0)

    exact: dict[TopicPartition, int] = {}
    for ends in await asyncio.gather(
        *(
            _ends_from_fetch(client, leader, fetch_offsets, read_committed)
            for leader, fetch_offsets in fetch_offsets_by_leader.items()
        )
    ):
        exact.update(ends)
    return {tp: exact[tp] for tp in reported}


def enable_tansu_producer_ids() -> None:
    """Make aiokafka's idempotent and transactional producers work on Tansu. Tansu only.

    From the call on, every aiokafka producer in this process asks for its producer id
    with InitProducerId v3, which Tansu answers, instead of v0, which it fails. Call it
    when `detect_tansu` says the broker is Tansu, before starting producers (Faust's
    included). Calling it again does nothing. A broker that does not offer v3 still gets
    v0.
    """
    # The sender looks its handler up by module name on each InitProducerId and offers
    # no option or per-producer hook, so the name itself has to be rebound.
    installed = aiokafka_sender.InitPIDHandler
    if installed is _InitPIDHandlerV3:
        return
    if installed is not _AIOKAFKA_INIT_PID_HANDLER:
        raise RuntimeError(
            "aiokafka's InitPIDHandler has already been replaced by "
            f"{installed.__module__}.{installed.__qualname__}; not replacing it again"
        )
    aiokafka_sender.InitPIDHandler = _InitPIDHandlerV3


def _underlying_client(obj: object) -> AIOKafkaClient:
    if isinstance(obj, AIOKafkaClient):
        return obj
    # consumer and admin client: `_client`; producer: `client`.
    for attribute in ("_client", "client"):
        client = getattr(obj, attribute, None)
        if isinstance(client, AIOKafkaClient):
            return client
    raise TypeError(
        "expected a bootstrap address, an AIOKafkaClient or an aiokafka consumer, producer "
        f"or admin client, got {type(obj).__name__}"
    )


async def _cluster_id_via(client: AIOKafkaClient) -> str | None:
    node_id = client.get_random_node()
    if node_id is None:
        raise kafka_errors.KafkaConnectionError(
            "the client knows no broker yet; start it before asking for the cluster id"
        )
    # An empty list asks for no topics; None would list them all.
    response = await client.send(node_id, MetadataRequest(topics=[]))
    return getattr(response, "cluster_id", None)  # absent before Metadata v2


async def _ends_from_fetch(
    client: AIOKafkaClient,
    node_id: int,
    fetch_offsets: dict[TopicPartition, int],
    read_committed: bool,
) -> dict[TopicPartition, int]:
    ends: dict[TopicPartition, int] = {}
    missing = dict(fetch_offsets)
    for _attempt in range(_FETCH_ATTEMPTS):
        by_topic: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for tp, offset in missing.items():
            by_topic[tp.topic].append((tp.partition, offset, _FETCH_MAX_BYTES))
        request = FetchRequest(
            max_wait_time=_FETCH_MAX_WAIT_MS,
            min_bytes=1,
            max_bytes=_FETCH_MAX_BYTES,
            isolation_level=_READ_COMMITTED if read_committed else _READ_UNCOMMITTED,
            topics=list(by_topic.items()),
        )
        response = await client.send(node_id, request)
        for topic, partition_responses in response.topics:
            for partition, error_code, high_watermark, *rest in partition_responses:
                tp = TopicPartition(topic, partition)
                if tp not in missing:
                    continue
                if error_code:
                    raise kafka_errors.for_code(error_code)(
                        f"Fetch of {topic}[{partition}] at offset {missing[tp]} from broker "
                        f"{node_id}, to read its end offset, failed"
                    )
                # From Fetch v4 on, the field after the high watermark is the last stable
                # offset; aiokafka refuses read_committed below v4.
                ends[tp] = rest[0] if read_committed else high_watermark
                del missing[tp]
        if not missing:
            return ends
    names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in missing)
    raise kafka_errors.KafkaError(
        f"broker {node_id} left {names} out of {_FETCH_ATTEMPTS} Fetch responses; cannot read their end offsets"
    )


class _InitProducerIdResponseV3(Response):
    API_KEY = 22
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class _InitProducerIdRequestV3(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 22
    API_VERSION = 3
    RESPONSE_TYPE = _InitProducerIdResponseV3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("transaction_timeout_ms", Int32),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


# aiokafka picks the newest of these that the broker offers; v0 stays for brokers
# without v3 (Kafka before 2.5).
class _InitProducerIdRequest(Request[InitProducerIdRequest_v0 | _InitProducerIdRequestV3]):
    API_KEY = 22

    def __init__(self, transactional_id: str | None, transaction_timeout_ms: int):
        self._transactional_id = transactional_id
        self._transaction_timeout_ms = transaction_timeout_ms

    def build(
        self, request_struct_class: type[InitProducerIdRequest_v0 | _InitProducerIdRequestV3]
    ) -> InitProducerIdRequest_v0 | _InitProducerIdRequestV3:
        if request_struct_class is InitProducerIdRequest_v0:
            return InitProducerIdRequest_v0(self._transactional_id, self._transaction_timeout_ms)
        return _InitProducerIdRequestV3(
            self._transactional_id,
            self._transaction_timeout_ms,
            _NO_PRODUCER_ID,
            _NO_PRODUCER_EPOCH,
            {},
        )


_AIOKAFKA_INIT_PID_HANDLER = aiokafka_sender.InitPIDHandler


# Only the request changes: the v3 response has the fields the inherited
# handle_response reads.
class _InitPIDHandlerV3(_AIOKAFKA_INIT_PID_HANDLER):  # type: ignore[valid-type,misc]  # aiokafka's, untyped
    def create_request(self) -> _InitProducerIdRequest:
        txn_manager = self._sender._txn_manager
        return _InitProducerIdRequest(
            transactional_id=txn_manager.transactional_id,
            transaction_timeout_ms=txn_manager.transaction_timeout_ms,
        )
