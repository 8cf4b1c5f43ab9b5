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
import gc
import io
import os
import pstats
import random
import sys
import time
from collections.abc import Callable

import fastavro

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kdiv.dev.changefeed import VALUE_SCHEMA, encode_avro, random_row
from kdiv.ticdc.avro import AvroChecksumVerifier
from kdiv.ticdc.checksum import ChecksumVerdict


def build_messages(records: int, verifier: AvroChecksumVerifier) -> list[bytes]:
    """Confluent-framed value messages (schema ID 7) of the demo changefeed's table, each
    carrying its row's checksum."""
    rng = random.Random(7)
    parsed = fastavro.parse_schema(VALUE_SCHEMA)
    messages: list[bytes] = []
    for row_id in range(records):
        row = random_row(rng, row_id)
        row["_tidb_row_level_checksum"] = str(verifier.checksum(row, VALUE_SCHEMA))
        messages.append(encode_avro(7, parsed, row))
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
