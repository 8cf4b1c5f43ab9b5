"""The one place kdiv touches Faust's and aiokafka's internals, pinned to tested releases.

Everything here names what Faust does that kdiv corrects or needs: exact end offsets and
exact seeks after assignment (`transport`), the watched topics' records in whole batches
(`batches`, taken in bulk from the worker's own aiokafka fetcher by `parsed`, with their
batches' leader epochs and OffsetForLeaderEpoch: `epochs`), table writes outside a stream, key
by key or in whole batches (`tables`; the unit of work's writes go through them and Faust's
producer in `sink`), and reads of recovery and assignment
state that Faust keeps without a public API (`internals`), and the web server's bounds on
what a client may hold, inside aiohttp's connections (`webserver`). The Tansu broker's aiokafka
workarounds stay in `kdiv.kafka.tansu`, the one module for broker deviations; their private
aiokafka names are listed in `PRIVATE_NAMES` too, so one test checks them all.

`check_versions` refuses releases these were not tested with: a Faust upgrade must fail at
start, and in the unit test of `PRIVATE_NAMES`, not silently lose records.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from packaging.version import InvalidVersion, Version

# (distribution, lowest tested, first untested)
TESTED = (
    ("faust-streaming", "0.15.3", "0.16"),
    ("aiokafka", "0.14.0", "0.15"),
    ("aiohttp", "3.14.0", "3.15"),
)

# Every private (or undocumented) name kdiv overrides or reads, with the parameters it
# expects, and why: tests/unit/test_faustcompat.py checks each one exists as described.
PRIVATE_NAMES: tuple[tuple[str, tuple[str, ...] | None, str], ...] = (
    (
        "faust.transport.consumer:Consumer._drain_messages",
        ("self", "fetcher"),
        "replaced: the watched topics' records are taken in batches, not one Event at a time",
    ),
    (
        "faust.transport.consumer:Consumer._wait_next_records",
        ("self", "timeout"),
        "called by the batch loop: Faust's fetch with its flow control",
    ),
    (
        "faust.transport.consumer:Consumer._to_message",
        ("self", "tp", "record"),
        "called for records that still go through Faust (changelogs)",
    ),
    ("faust.transport.consumer:Consumer._add_gap", ("self", "tp", "offset_from", "offset_to"), "Faust's gap rule"),
    ("faust.transport.consumer:Consumer._new_offset", ("self", "tp"), "overridden: commit at the flushed offset"),
    (
        "faust.transport.consumer:Consumer._filter_tps_with_pending_acks",
        ("self", "topics"),
        "overridden: flushed batches ack no Message",
    ),
    ("faust.transport.consumer:Consumer.wait_empty", ("self",), "overridden: revocation waits for the batch"),
    ("faust.transport.consumer:Consumer.commit", ("self", "topics", "start_new_transaction"), "flush first"),
    ("faust.transport.consumer:Consumer.perform_seek", ("self",), "overridden: seeks that lose nothing"),
    ("faust.transport.consumer:Consumer._read_offset", None, "Faust's read positions, reset at seeks"),
    ("faust.transport.consumer:Consumer._acked", None, "forgotten at seeks"),
    ("faust.transport.consumer:Consumer._acked_index", None, "forgotten at seeks"),
    ("faust.transport.consumer:Consumer._gap", None, "forgotten at seeks"),
    (
        "faust.transport.consumer:Consumer._committed_offset",
        None,
        "forgotten when a rewound log is read again; a changefeed partition's position before its first record",
    ),
    ("faust.transport.consumer:Consumer._buffered_partitions", None, "Faust's fetch filter"),
    (
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._fetch_records",
        ("self", "consumer", "active_partitions", "timeout", "max_records"),
        "stamped with the seek count",
    ),
    (
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._highwaters",
        ("self", "partitions"),
        "exact end offsets for recovery (faust 0.15 reads -1 under exactly_once)",
    ),
    (
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread.seek_to_committed",
        ("self",),
        "every source partition in one step",
    ),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._ensure_consumer", ("self",), "the aiokafka consumer"),
    ("faust.transport.drivers.aiokafka:Consumer._getmany", ("self", "active_partitions", "timeout"), "seek count"),
    ("faust.transport.drivers.aiokafka:Consumer._new_consumer_thread", ("self",), "kdiv's consumer thread"),
    ("faust.streams:_current_event", None, "the partition of a table write outside a stream"),
    (
        "faust.stores.rocksdb:Store._db_for_partition",
        ("self", "partition"),
        "table writes in one RocksDB write batch; one partition's items read alone",
    ),
    (
        "faust.stores.rocksdb:Store.set_persisted_offset",
        ("self", "tp", "offset"),
        "batched table writes: the changelog offset recovery restores after, as Faust's own ack callback",
    ),
    (
        "faust.tables.recovery:Recovery._build_offsets",
        ("self", "consumer", "tps", "destination", "title"),
        "bulkrestore: the tables restored in bulk before Faust plans its reads",
    ),
    ("faust.tables.recovery:Recovery.tp_to_table", None, "bulkrestore: the table of a changelog partition"),
    (
        "faust.tables.recovery:Recovery._add",
        ("self", "table", "tp", "offsets"),
        "bulkrestore: no store opened in the callback",
    ),
    (
        "faust.stores.rocksdb:Store.assign_partitions",
        ("self", "table", "tps", "generation_id"),
        "stores: no database opened in the rebalance callback",
    ),
    (
        "faust.stores.rocksdb:Store._try_open_db_for_partition",
        ("self", "partition"),
        "bulkrestore: the databases opened by the recovery, with Faust's retries",
    ),
    ("faust.stores.rocksdb:Store.rebalance_ack", None, "stores: set as Faust's assign_partitions does"),
    ("faust.stores.rocksdb:Store._dbs", None, "bulkrestore: the partitions open"),
    (
        "faust.stores.rocksdb:Store._open_for_partition",
        ("self", "partition"),
        "stores: a partition's keys in its table's one database",
    ),
    ("faust.stores.rocksdb:Store._path_with_suffix", ("self", "path", "suffix"), "stores: the table's database path"),
    (
        "faust.stores.rocksdb:Store.apply_changelog_batch",
        ("self", "batch", "to_key", "to_value"),
        "stores: each partition's records in one write batch",
    ),
    ("faust.stores.rocksdb:Store.reset_state", ("self",), "stores: the table's database let go"),
    ("faust.tables.manager:TableManager._recovery", None, "bulkrestore: KdivRecovery in its place"),
    ("faust.stores.rocksdb:Store.offset_key", None, "bulkrestore: the persisted offset, in the restore's write batch"),
    ("faust.stores.rocksdb:RocksDBOptions.as_options", ("self",), "stores: the shared cache and memtable budget"),
    ("faust.stores.rocksdb:RocksDBOptions.bloom_filter_size", None, "stores: as Faust's table options"),
    (
        "faust.stores.rocksdb:Store.__init__",
        ("self", "url", "app", "table"),
        "stores: rocksdb_options replaced after it",
    ),
    ("faust.stores:STORES", None, "stores: the kdiv-rocksdb:// alias"),
    ("faust.tables.recovery:Recovery.active_highwaters", None, "restore progress"),
    ("faust.tables.recovery:Recovery.actives_for_table", None, "what a table restored"),
    ("faust.tables.recovery:Recovery.in_recovery", None, "health"),
    ("faust.tables.recovery:Recovery.active_remaining_total", ("self",), "health"),
    ("faust.tables.recovery:Recovery.standby_remaining_total", ("self",), "health"),
    ("faust.assignor.partition_assignor:PartitionAssignor.external_topics_metadata", ("self",), "owners"),
    ("faust.tables.base:Collection.apply_changelog_batch", ("self", "batch"), "restore events"),
    ("faust.transport.producer:Producer.buffer", None, "table writes handed over before a commit"),
    ("faust.transport.producer:ProducerBuffer.flush", ("self",), "table writes handed over before a commit"),
    (
        "faust.transport.drivers.aiokafka:Producer._ensure_producer",
        ("self",),
        "its aiokafka producer: key ledger records sent in whole batches",
    ),
    (
        "aiokafka.consumer.fetcher:PartitionRecords._unpack_records",
        ("self",),
        "watched topics: its generator replaced by a copy that yields in bulk (parsed)",
    ),
    ("aiokafka.consumer.fetcher:PartitionRecords._records_iterator", None, "replaced, drained in C (parsed)"),
    ("aiokafka.consumer.fetcher:PartitionRecords._consume_aborted_up_to", ("self", "batch_offset"), "parsed"),
    ("aiokafka.consumer.fetcher:PartitionRecords._contains_abort_marker", ("self", "next_batch"), "parsed"),
    (
        "aiokafka.consumer.fetcher:FetchResult.getall",
        ("self", "max_records"),
        "watched topics: in bulk (parsed), on the worker's fetch results only",
    ),
    ("aiokafka.consumer.consumer:AIOKafkaConsumer._fetcher", None, "parsed: the worker's fetcher"),
    ("aiokafka.consumer.fetcher:Fetcher._records", None, "internals: the partitions whose fetched records wait"),
    (
        "aiokafka.consumer.subscription_state:Assignment._tp_state",
        None,
        "internals: when each partition's fetch was answered",
    ),
    (
        "aiokafka.consumer.subscription_state:TopicPartitionState.timestamp",
        None,
        "internals: set when the partition's leader answers a fetch without error",
    ),
    ("aiokafka.consumer.fetcher:FetchResult.has_more", ("self",), "internals: a fetch result not drained yet"),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._consumer", None, "internals: the fetcher's consumer"),
    (
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread.verify_event_path",
        ("self", "now", "tp"),
        "overridden: the watched topics are judged by kdiv's progress, not Faust's; not while a partition's position is being reset",
    ),
    ("aiokafka.consumer.fetcher:Fetcher._subscriptions", None, "a partition's position state (verify_event_path)"),
    (
        "aiokafka.consumer.fetcher:Fetcher._proc_fetch_request",
        ("self", "assignment", "node_id", "request"),
        "parsed: bound to the worker's fetcher with its records and results in place",
    ),
    ("aiokafka.consumer.fetcher:FetchResult", None, "parsed: the worker's fetch results, made in bulk"),
    ("aiokafka.consumer.fetcher:FetchResult._update_position", ("self",), "parsed"),
    ("aiokafka.consumer.fetcher:FetchResult._partition_records", None, "parsed"),
    (
        "aiokafka.consumer.fetcher:Fetcher._records",
        None,
        "transport: the fetched results a drain takes, within a budget",
    ),
    ("aiokafka.consumer.fetcher:PartitionRecords._records", None, "transport: a fetched result's bytes"),
    (
        "faust.transport.consumer:Consumer.pause_partitions",
        ("self", "tps"),
        "transport: a paused partition is not fetched by aiokafka either",
    ),
    (
        "faust.transport.consumer:Consumer.resume_partitions",
        ("self", "tps"),
        "transport: a resumed partition is fetched by aiokafka again",
    ),
    ("mode.threads:ServiceThread.thread_loop", None, "transport: aiokafka's pauses made in the consumer thread"),
    (
        "aiokafka.consumer.fetcher:Fetcher._max_partition_fetch_bytes",
        None,
        "transport: the fetch size per partition, set at each assignment within the worker's budget",
    ),
    (
        "faust.transport.consumer:ConsumerThread.on_partitions_assigned",
        ("self", "assigned", "generation_id"),
        "transport: the fetch size per partition set first",
    ),
    (
        "aiokafka.consumer.fetcher:Fetcher._create_fetch_waiter",
        ("self",),
        "transport: a drain waits for the first results, then takes those within its budget",
    ),
    ("aiokafka.consumer.fetcher:READ_COMMITTED", None, "parsed: aiokafka's isolation level constant"),
    (
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._create_worker_consumer",
        ("self", "transport"),
        "transport: the worker reads committed records under at_least_once too",
    ),
    (
        "aiokafka.consumer.consumer:AIOKafkaConsumer._isolation_level",
        None,
        "transport: read_committed, set before start",
    ),
    (
        "aiokafka.consumer.fetcher:MemoryRecords",
        None,
        "epochs: in the worker's fetcher EpochTrackingRecords, which also keeps each batch's leader epoch",
    ),
    ("aiokafka.record.memory_records:MemoryRecords.next_batch", None, "epochs: whole batches, in order"),
    ("aiokafka.protocol.api:Request.prepare", ("self", "versions"), "epochs: OffsetForLeaderEpoch, as aiokafka's own"),
    ("aiokafka.protocol.api:RequestStruct", None, "epochs: OffsetForLeaderEpoch v3"),
    ("aiokafka.protocol.api:Response", None, "epochs: OffsetForLeaderEpoch v3"),
    ("aiokafka.protocol.types:Schema", None, "epochs: OffsetForLeaderEpoch v3"),
    ("aiokafka.client:AIOKafkaClient.send", ("self", "node_id", "request"), "epochs: on the consumer's client"),
    ("faust.transport.consumer:ThreadDelegateConsumer._thread", None, "seeks and leader epochs in the consumer thread"),
    (
        "aiokafka.producer.producer:AIOKafkaProducer._message_accumulator",
        None,
        "kdiv.kafka.requests: each produce request bounded",
    ),
    ("aiokafka.producer.producer:AIOKafkaProducer._max_request_size", None, "kdiv.kafka.requests: the bound"),
    (
        "aiokafka.producer.message_accumulator:MessageAccumulator.drain_by_nodes",
        ("self", "ignore_nodes", "muted_partitions"),
        "kdiv.kafka.requests: replaced by a copy that bounds each node's request",
    ),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._batches", None, "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._cluster", None, "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._pop_batch", ("self", "tp"), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._waiter_future", None, "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._wakeup_handle", None, "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._loop", None, "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageAccumulator._wakeup", ("fut",), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageBatch._builder", None, "kdiv.kafka.requests: a batch's bytes"),
    ("aiokafka.producer.message_accumulator:MessageBatch.remaining_linger", ("self",), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageBatch.expired", ("self",), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageBatch.is_empty", ("self",), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageBatch.done_noack", ("self",), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:MessageBatch.failure", ("self", "exception"), "kdiv.kafka.requests"),
    ("aiokafka.producer.message_accumulator:BatchBuilder.size", ("self",), "kdiv.kafka.requests: a batch's bytes"),
    ("faust.transport.drivers.aiokafka:Producer._new_producer", ("self", "transactional_id"), "requests bounded"),
    ("aiokafka.producer.sender:InitPIDHandler", None, "Tansu: InitProducerId v3 (kdiv.kafka.tansu)"),
    ("aiokafka.producer.sender:InitPIDHandler.create_request", ("self",), "Tansu: the v3 request"),
    ("aiokafka.producer.sender:InitPIDHandler._sender", None, "Tansu: the transaction manager's ids"),
    ("aiokafka.producer.sender:Sender._txn_manager", None, "Tansu: the transaction manager's ids"),
    (
        "aiokafka.consumer.consumer:AIOKafkaConsumer._client",
        None,
        "Tansu: Fetch-based end offsets; kdiv.kafka.consume: any topic's partitions",
    ),
    ("aiokafka.client:AIOKafkaClient.fetch_all_metadata", ("self",), "kdiv.kafka.consume: any topic's partitions"),
    ("faust.web.drivers.aiohttp:Web._runner", None, "webserver: replaced by the runner with client bounds"),
    ("aiohttp.web_runner:AppRunner._make_server", ("self",), "webserver: its server makes bounded connections"),
    ("aiohttp.web_server:Server.__call__", ("self",), "webserver: the connection factory, overridden"),
    ("aiohttp.web_server:Server.request_handler", None, "webserver: wrapped to tell a connection its answer is sent"),
    ("aiohttp.web_server:Server.request_factory", None, "webserver: kept"),
    ("aiohttp.web_server:Server.handler_cancellation", None, "webserver: kept"),
    (
        "aiohttp.web_protocol:RequestHandler._request_count",
        None,
        "webserver: grows when a request head is parsed (the header timeout stops)",
    ),
    (
        "aiohttp.web_protocol:RequestHandler.handle_error",
        ("self", "request", "status", "exc", "message"),
        "webserver: a malformed request counted and answered in one WARNING line, not a traceback at ERROR",
    ),
    ("aiohttp.web_protocol:RequestHandler.force_close", ("self",), "webserver: a connection closed at a bound"),
)


class UntestedRelease(RuntimeError):
    """An installed Faust or aiokafka release outside the range kdiv's corrections were tested on."""


def check_versions(installed: Callable[[str], str] = version) -> None:
    """Raise UntestedRelease unless every pinned distribution is within its tested range."""
    for name, lowest, first_untested in TESTED:
        try:
            found = installed(name)
        except PackageNotFoundError:
            raise UntestedRelease(
                f"{name} is not installed; kdiv's worker needs {_range(lowest, first_untested)}"
            ) from None
        try:
            tested = Version(lowest) <= Version(found) < Version(first_untested)
        except InvalidVersion:
            tested = False
        if not tested:
            raise UntestedRelease(
                f"{name} {found} is installed, but kdiv's worker corrects its internals as tested with "
                f"{_range(lowest, first_untested)} only (kdiv.worker.faustcompat): install that range"
            )


def _range(lowest: str, first_untested: str) -> str:
    return f">={lowest},<{first_untested}"
