"""TiCDC Avro row-checksum verification throughput, against fastavro decoding the same messages.

    python bench/ticdc.py [--records N] [--runs R] [--time-zone ZONE] [--profile]

Builds N TiCDC-shaped Avro value records (Confluent framing, checksum extension fields) for a
table with one column of every type TiCDC's Avro encoder emits, some nullable, encodes them
with fastavro's schemaless_writer, then measures in the same run (best of --runs):

(a) decode only: fastavro's schemaless_reader on each message body;
(b) decode + verify: the same, then kdiv's verifier on each decoded value.

The figure to watch is the ratio (b)/(a) in rows/s: the share of the decoder's throughput left
once every row is verified; absolute rows/s depend on the machine. --profile prints cProfile's
top costs of one (b) pass.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import io
import os
import pstats
import random
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import fastavro

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kdiv.ticdc.avro import AvroChecksumVerifier
from kdiv.ticdc.checksum import ChecksumVerdict


def _column(avro_type: str, tidb_type: str, **parameters: str) -> dict[str, Any]:
    return {"type": avro_type, "connect.parameters": {"tidb_type": tidb_type, **parameters}}


def _nullable(avro_type: str, tidb_type: str, **parameters: str) -> list[Any]:
    return ["null", _column(avro_type, tidb_type, **parameters)]


STATUSES = ["new", "paid", "shipped", "delivered", "returned"]
TAGS = ["gift", "express", "fragile", "bulk"]

VALUE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "orders",
    "namespace": "default.shop",
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


def _row(rng: random.Random, row_id: int) -> dict[str, Any]:
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


def build_messages(records: int, verifier: AvroChecksumVerifier) -> list[bytes]:
    """Confluent-framed value messages (schema ID 7), each carrying its row's checksum."""
    rng = random.Random(7)
    parsed = fastavro.parse_schema(VALUE_SCHEMA)
    messages: list[bytes] = []
    for row_id in range(records):
        row = _row(rng, row_id)
        row["_tidb_row_level_checksum"] = str(verifier.checksum(row, VALUE_SCHEMA))
        out = io.BytesIO()
        out.write(b"\x00" + struct.pack(">I", 7))
        fastavro.schemaless_writer(out, parsed, row)
        messages.append(out.getvalue())
    return messages


def best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--time-zone", default="UTC", help="the TiCDC server zone the verifier assumes")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top costs of one decode+verify pass")
    args = parser.parse_args()

    verifier = AvroChecksumVerifier(time_zone=args.time_zone)
    messages = build_messages(args.records, verifier)
    parsed = fastavro.parse_schema(VALUE_SCHEMA)
    n = len(messages)

    # Every verdict must be OK, or the figure measures a fault path.
    probe = AvroChecksumVerifier(time_zone=args.time_zone)
    verdicts = [
        probe.verify(fastavro.schemaless_reader(io.BytesIO(m[5:]), parsed, None), VALUE_SCHEMA).verdict  # type: ignore[arg-type]
        for m in messages
    ]
    not_ok = sum(verdict is not ChecksumVerdict.OK for verdict in verdicts)
    if not_ok:
        sys.exit(f"bench messages are not clean: {not_ok} rows not OK")

    reader = fastavro.schemaless_reader
    bytes_io = io.BytesIO

    def decode_only() -> None:
        for message in messages:
            reader(bytes_io(message[5:]), parsed, None)

    def decode_and_verify() -> None:
        check = AvroChecksumVerifier(time_zone=args.time_zone).verify
        for message in messages:
            check(reader(bytes_io(message[5:]), parsed, None), VALUE_SCHEMA)  # type: ignore[arg-type]

    decode_s = best_of(args.runs, decode_only)
    verify_s = best_of(args.runs, decode_and_verify)
    decode_rate, verify_rate = n / decode_s, n / verify_s
    columns = VALUE_SCHEMA["fields"].index(next(f for f in VALUE_SCHEMA["fields"] if f["name"] == "_tidb_op"))
    print(
        f"rows: {n}, columns: {columns}, mean message bytes: {sum(map(len, messages)) / n:.0f}, zone: {args.time_zone}"
    )
    print(f"(a) fastavro decode only:   {decode_rate:,.0f} rows/s")
    print(f"(b) decode + kdiv verify:   {verify_rate:,.0f} rows/s")
    print(f"verify alone (derived):     {n / (verify_s - decode_s):,.0f} rows/s" if verify_s > decode_s else "")
    print(f"ratio (b)/(a):              {verify_rate / decode_rate:.3f}")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(decode_and_verify)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
