"""Validator core throughput on a pre-built in-memory stream, against zlib.crc32 on the same bytes.

    python bench/validator.py [--records N] [--producers P] [--partitions K] [--value-size B]

The baseline is the floor of any validator that checks record integrity: one CRC32 over each
record's key and value, measured in the same run on the same records. The figure to watch is
the ratio validator/baseline; absolute records/s depend on the machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kdiv.div.record import ConsumedRecord
from kdiv.div.stamper import DivStamper
from kdiv.div.validator import DataIntegrityValidator, Semantics


def build_stream(records: int, producers: int, partitions: int, value_size: int) -> list[ConsumedRecord]:
    rng = random.Random(7)
    stampers = [DivStamper(max_records_per_segment=10_000) for _ in range(producers)]
    offsets = [0] * partitions
    stream: list[ConsumedRecord] = []
    now = 1_700_000_000_000
    while len(stream) < records:
        stamper = stampers[rng.randrange(producers)]
        partition = rng.randrange(partitions)
        key = b"key-%08d" % rng.randrange(1 << 20)
        for out in stamper.data("bench", partition, key, rng.randbytes(value_size), now):
            stream.append(ConsumedRecord("bench", partition, offsets[partition], now, out.key, out.value, out.headers))
            offsets[partition] += 1
    return stream[:records]


def best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    stream = build_stream(args.records, args.producers, args.partitions, args.value_size)
    n = len(stream)

    def baseline() -> None:
        crc32 = zlib.crc32
        for record in stream:
            crc32(record.value, crc32(record.key))  # type: ignore[arg-type]  # the stream has keys and values

    def validate(semantics: Semantics) -> None:
        validator = DataIntegrityValidator(semantics=semantics)
        check = validator.validate
        now = 1_700_000_000_000
        for record in stream:
            check(record, now)

    # Every verdict must be OK, or the figure measures a fault path.
    probe = DataIntegrityValidator()
    faults = sum(probe.validate(r, 0).verdict.is_fault for r in stream)
    if faults:
        sys.exit(f"bench stream is not clean: {faults} faults")

    base_s = best_of(args.runs, baseline)
    exact_s = best_of(args.runs, lambda: validate(Semantics.EXACT))
    venice_s = best_of(args.runs, lambda: validate(Semantics.VENICE))
    base_rate, exact_rate, venice_rate = n / base_s, n / exact_s, n / venice_s
    print(f"records: {n}, producers: {args.producers}, partitions: {args.partitions}, value bytes: {args.value_size}")
    print(f"baseline zlib.crc32(key+value): {base_rate:,.0f} records/s")
    print(f"kdiv validator, exact:          {exact_rate:,.0f} records/s")
    print(f"kdiv validator, venice:         {venice_rate:,.0f} records/s")
    print(f"ratio validator/baseline:       {exact_rate / base_rate:.3f} exact, {venice_rate / base_rate:.3f} venice")
    print(f"ratio exact/venice:             {exact_rate / venice_rate:.3f}")


if __name__ == "__main__":
    main()
