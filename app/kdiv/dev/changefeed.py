"""`kdiv changefeed-demo`: a TiCDC-shaped changefeed, for the demo and the tests.

Writes what a TiCDC changefeed with `[integrity] integrity-check-level = "correctness"` and the
Avro protocol writes for one table with a column of every type TiCDC's Avro encoder emits:
Confluent-framed key and value, schemas registered under the topic's `-key` and `-value`
subjects (TiCDC uses the topic name strategy), each value carrying its row's checksum in
`_tidb_row_level_checksum`; a DELETE is a tombstone. Occasional faults are planted: a value
changed after its checksum was computed (CHECKSUM_MISMATCH, as a bad transformation or a
flipped bit would) and a row TiCDC itself flagged (`_tidb_corrupted`, CORRUPTED_FLAG). What
was planted where is returned, so tests can assert exactly those verdicts.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import itertools
import json
import logging
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fastavro

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.config.settings import RegistrySettings
from kdiv.dev.demo import ensure_topic
from kdiv.dev.outage import Backoff, BrokerOutage, is_outage, retry, wait_until_back
from kdiv.kafka.produce import started_producer
from kdiv.registry.client import RegistryUnavailable, SchemaRegistry
from kdiv.state.framing import frame
from kdiv.ticdc.avro import AvroChecksumVerifier

log = logging.getLogger("kdiv.changefeed-demo")

FAULTS = ("mismatch", "flag")


def _column(avro_type: str, tidb_type: str, **parameters: str) -> dict[str, Any]:
    return {"type": avro_type, "connect.parameters": {"tidb_type": tidb_type, **parameters}}


def _nullable(avro_type: str, tidb_type: str, **parameters: str) -> list[Any]:
    return ["null", _column(avro_type, tidb_type, **parameters)]


STATUSES = ["new", "paid", "shipped", "delivered", "returned"]
TAGS = ["gift", "express", "fragile", "bulk"]
TABLE = "orders"
NAMESPACE = "default.shop"

# TiCDC's Avro key schema: the handle key columns, named like the value record.
KEY_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": TABLE,
    "namespace": NAMESPACE,
    "fields": [{"name": "id", "type": _column("long", "BIGINT")}],
}

VALUE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": TABLE,
    "namespace": NAMESPACE,
    "fields": [
        {"name": "id", "type": _column("long", "BIGINT")},
        {"name": "tenant", "type": _column("int", "INT")},
        {"name": "flag", "type": _column("int", "INT")},  # TINYINT(1)
        {"name": "qty", "type": _column("int", "INT UNSIGNED")},
        {"name": "big_unsigned", "type": _column("string", "BIGINT UNSIGNED")},
        {"name": "amount", "type": _column("string", "DECIMAL")},
        {"name": "discount", "type": _nullable("string", "DECIMAL"), "default": None},
        {"name": "ratio", "type": _column("float", "FLOAT")},
        {"name": "score", "type": _column("double", "DOUBLE")},
        {"name": "customer", "type": _column("string", "TEXT")},
        {"name": "note", "type": _nullable("string", "TEXT"), "default": None},
        {"name": "payload", "type": _column("bytes", "BLOB")},
        {"name": "created", "type": _column("string", "DATETIME")},
        {"name": "updated", "type": _column("string", "TIMESTAMP")},
        {"name": "ship_day", "type": _nullable("string", "DATE"), "default": None},
        {"name": "window", "type": _column("string", "TIME")},
        {"name": "status", "type": _column("string", "ENUM", allowed=",".join(STATUSES))},
        {"name": "tags", "type": _column("string", "SET", allowed=",".join(TAGS))},
        {"name": "bits", "type": _column("bytes", "BIT", length="12")},
        {"name": "model_year", "type": _column("int", "YEAR")},
        {"name": "attributes", "type": _nullable("string", "JSON"), "default": None},
        {"name": "_tidb_op", "type": "string", "default": ""},
        {"name": "_tidb_commit_ts", "type": "long", "default": 0},
        {"name": "_tidb_commit_physical_time", "type": "long", "default": 0},
        {"name": "_tidb_row_level_checksum", "type": "string", "default": ""},
        {"name": "_tidb_corrupted", "type": "boolean", "default": False},
        {"name": "_tidb_checksum_version", "type": "int", "default": 0},
    ],
}


def _moment(rng: random.Random) -> datetime.datetime:
    return datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=rng.randrange(366 * 86400))


def random_row(rng: random.Random, row_id: int) -> dict[str, Any]:
    """A row of `VALUE_SCHEMA` with random values of every column type, checksum not yet set."""
    tags = [tag for tag in TAGS if rng.random() < 0.3]
    commit_ts = (1_716_126_891_406 + row_id) << 18
    return {
        "id": row_id,
        "tenant": rng.randrange(-(2**31), 2**31),
        "flag": rng.randrange(2),
        "qty": rng.randrange(2**16),
        "big_unsigned": str(rng.randrange(2**64)),
        "amount": f"{rng.randrange(10**8)}.{rng.randrange(100):02d}",
        "discount": None if rng.random() < 0.5 else f"{rng.randrange(100)}.{rng.randrange(1000):03d}",
        # A float32 value, as fastavro reads an Avro float back.
        "ratio": struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0],
        "score": rng.uniform(-1e12, 1e12),
        "customer": f"customer-{rng.randrange(10**6):06d} ñ",
        "note": None if rng.random() < 0.7 else "note " * rng.randrange(1, 20),
        "payload": rng.randbytes(rng.randrange(0, 64)),
        "created": f"{_moment(rng):%Y-%m-%d %H:%M:%S}",
        "updated": f"{_moment(rng):%Y-%m-%d %H:%M:%S}.{rng.randrange(1000):03d}",
        "ship_day": None if rng.random() < 0.3 else f"{_moment(rng):%Y-%m-%d}",
        "window": f"{_moment(rng):%H:%M:%S}",
        "status": rng.choice(STATUSES),
        "tags": ",".join(tags),
        "bits": rng.randrange(1, 4096).to_bytes(2, "big"),
        "model_year": rng.randrange(1901, 2156),
        "attributes": None if rng.random() < 0.5 else f'{{"size": {rng.randrange(50)}, "colour": "red"}}',
        "_tidb_op": "c" if rng.random() < 0.7 else "u",
        "_tidb_commit_ts": commit_ts,
        "_tidb_commit_physical_time": commit_ts >> 18,
        "_tidb_row_level_checksum": "",
        "_tidb_corrupted": False,
        "_tidb_checksum_version": 1,
    }


def encode_avro(schema_id: int, parsed_schema: Any, record: dict[str, Any]) -> bytes:
    """`record` in Confluent's framing: magic byte, schema id, Avro binary."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_schema, record)
    return frame(schema_id, out.getvalue())


@dataclass(frozen=True)
class ChangefeedMessage:
    key: bytes
    value: bytes | None  # None: a DELETE (tombstone)
    row_id: int
    fault: str | None  # "mismatch", "flag" or None


@dataclass
class Planted:
    """Where each fault landed: (partition, offset) per fault kind, and what was written."""

    faults: dict[str, set[tuple[int, int]]] = field(default_factory=lambda: {f: set() for f in FAULTS})
    rows: int = 0
    deletes: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "deletes": self.deletes,
            "faults": {kind: sorted(list(at) for at in where) for kind, where in self.faults.items()},
        }


class ChangefeedMessages:
    """TiCDC Avro messages of the `orders` table, with faults at the given rates."""

    def __init__(
        self,
        key_schema_id: int,
        value_schema_id: int,
        *,
        seed: int = 7,
        mismatch_rate: float = 0.0,
        flag_rate: float = 0.0,
        delete_rate: float = 0.0,
        time_zone: str = "UTC",
    ) -> None:
        self.key_schema_id = key_schema_id
        self.value_schema_id = value_schema_id
        self.rng = random.Random(seed)
        self.rates = {"mismatch": mismatch_rate, "flag": flag_rate}
        self.delete_rate = delete_rate
        self._key = fastavro.parse_schema(KEY_SCHEMA)
        self._value = fastavro.parse_schema(VALUE_SCHEMA)
        self._checksums = AvroChecksumVerifier(time_zone=time_zone)
        self._next_id = 0

    def next(self, fault: str | None = None) -> ChangefeedMessage:
        """The next message; `fault` forces one, else the rates pick."""
        rng = self.rng
        row_id = self._next_id
        self._next_id += 1
        key = encode_avro(self.key_schema_id, self._key, {"id": row_id})
        if fault is None:
            for kind, rate in self.rates.items():
                if rate and rng.random() < rate:
                    fault = kind
                    break
        if fault is None and self.delete_rate and rng.random() < self.delete_rate:
            return ChangefeedMessage(key, None, row_id, None)
        row = random_row(rng, row_id)
        row["_tidb_row_level_checksum"] = str(self._checksums.checksum(row, VALUE_SCHEMA))
        if fault == "mismatch":
            row["amount"] = f"{row['amount']}1"  # changed after the checksum was taken
        elif fault == "flag":
            row["_tidb_corrupted"] = True
        elif fault is not None:
            raise ValueError(f"unknown changefeed fault {fault!r}; expected one of {', '.join(FAULTS)}")
        return ChangefeedMessage(key, encode_avro(self.value_schema_id, self._value, row), row_id, fault)


async def register_schemas(registry: RegistrySettings, topic: str) -> tuple[int, int]:
    """Register the key and value schemas under `topic`'s subjects, as TiCDC does; their ids."""
    client = SchemaRegistry(registry)
    try:
        key_id = await client.register(f"{topic}-key", json.dumps(KEY_SCHEMA))
        value_id = await client.register(f"{topic}-value", json.dumps(VALUE_SCHEMA))
    finally:
        await client.close()
    return key_id, value_id


async def _registered_schemas(registry: RegistrySettings, topic: str, *, forever: bool) -> tuple[int, int]:
    """The schemas' ids, once the registry (started beside this source in the development
    stack, and away while its broker is) registers them; a minute at most unless `forever`."""
    waiting_since = None
    for attempt in itertools.count():
        try:
            ids = await register_schemas(registry, topic)
        except RegistryUnavailable as down:
            if not forever and attempt == 59:
                raise
            if waiting_since is None:
                waiting_since = time.monotonic()
                log.warning("registry unavailable (%s), retrying until it registers the changefeed's schemas", down)
            await asyncio.sleep(min(1.0 * 2 ** min(attempt, 4), 10.0) if forever else 1.0)
            continue
        if waiting_since is not None:
            log.warning("registry available again after %.0f s", time.monotonic() - waiting_since)
        return ids
    raise AssertionError("unreachable")


async def write_changefeed(
    bootstrap: str,
    topic: str,
    registry: RegistrySettings,
    *,
    rows: int | None,
    partitions: int = 1,
    rate_per_s: float = 0.0,
    mismatch_rate: float = 0.0,
    flag_rate: float = 0.0,
    delete_rate: float = 0.0,
    faults_at: dict[int, str] | None = None,
    seed: int = 7,
    security: KafkaSecurity = PLAINTEXT,
    on_planted: Callable[[Planted], None] | None = None,
) -> Planted:
    """Write `rows` messages (None: forever, for the demo) to `topic`, created if missing.

    `faults_at`: row number -> fault, planted exactly there (tests); the rates plant the rest.
    """
    outage = BrokerOutage("kdiv changefeed-demo", log)
    backoff = Backoff()
    await retry(lambda: ensure_topic(bootstrap, topic, partitions, security), outage, backoff)
    key_id, value_id = await _registered_schemas(registry, topic, forever=rows is None)
    messages = ChangefeedMessages(
        key_id,
        value_id,
        seed=seed,
        mismatch_rate=mismatch_rate,
        flag_rate=flag_rate,
        delete_rate=delete_rate,
    )
    planted = Planted()

    producer = await retry(lambda: started_producer(bootstrap, security=security, linger_ms=5), outage, backoff)
    # Sent and not yet acknowledged, in order; each leaves once its write is acknowledged.
    in_flight: list[tuple[ChangefeedMessage, asyncio.Future]] = []
    # Not acknowledged when the broker went away: written again once it is back.
    unsent: list[ChangefeedMessage] = []

    async def settle() -> None:
        while in_flight:
            message, sent = in_flight[0]
            metadata = await sent
            in_flight.pop(0)
            planted.rows += 1
            if message.value is None:
                planted.deletes += 1
            if message.fault is not None:
                planted.faults[message.fault].add((metadata.partition, metadata.offset))
                log.warning(
                    "planted %s at %s[%d]@%d (row %d)",
                    message.fault,
                    topic,
                    metadata.partition,
                    metadata.offset,
                    message.row_id,
                )
                if on_planted is not None:
                    on_planted(planted)

    async def write(message: ChangefeedMessage) -> None:
        in_flight.append((message, await producer.send(topic, message.value, key=message.key)))

    try:
        written = 0
        while unsent or rows is None or written < rows:
            try:
                while unsent:
                    await write(unsent[0])
                    unsent.pop(0)
                    await settle()
                if rows is not None and written >= rows:
                    break
                message = messages.next((faults_at or {}).get(written))
                written += 1
                unsent.append(message)  # until the producer took it
                await write(message)
                unsent.pop()
                if rate_per_s:
                    await settle()
                    outage.ended()
                    backoff.reset()
                    await asyncio.sleep(1 / rate_per_s)
                elif len(in_flight) >= 500:
                    await settle()
            except Exception as failed:
                if not is_outage(failed):
                    raise
                outage.failed(failed)
                # A write that timed out may or may not have landed: written again, as TiCDC
                # re-sends after a sink error (at least once), so a row may be in the topic
                # twice; only acknowledged writes are counted as planted.
                unsent[:0] = [message for message, _ in in_flight]
                in_flight.clear()
                await wait_until_back(producer.client, outage, backoff)
        await settle()
        outage.ended()
    finally:
        await producer.stop()
    return planted
