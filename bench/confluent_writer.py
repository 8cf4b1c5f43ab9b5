"""The confluent_kafka writer's cost: records/s through a Producer with and without stamping.

    python bench/confluent_writer.py [--records N] [--record-size B] [--partitions K] [--keys C]
                                     [--repeat R] [--bootstrap HOST:PORT]

One run: start Apache Kafka (kdiv.dev.broker, unless --bootstrap or KDIV_BOOTSTRAP names one),
then R rounds, each sending N records of B random bytes, keyed with C keys (0: unkeyed), to
fresh K-partition topics twice: once through a plain `confluent_kafka.Producer` (the baseline),
once through `ConfluentDivWriter` (kdiv.writer.confluent), both with the writer's producer
configuration (`DEFAULT_CONFIG`: idempotence, acks=all, linger.ms=5, murmur2_random). Each side
is timed from its first `produce` to the end of its `flush` (every record acknowledged), in the
same process; the order alternates per round so neither side always runs on a warmer broker.
Prints records/s per side and round, the medians and the ratio stamped/plain; absolute figures
depend on the machine, the ratio is the figure to watch.

--cpu measures the hand-off alone, without a broker: N `produce` calls into a Producer whose
broker never answers (its queue holds them all), plain and through the writer, per round;
prints µs per record for each and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "app"))

from confluent_kafka import Producer

from kdiv.dev.broker import KafkaCluster
from kdiv.dev.demo import ensure_topic
from kdiv.writer.confluent import DEFAULT_CONFIG, ConfluentDivWriter


def records(count: int, size: int, keys: int, seed: int) -> list[tuple[bytes | None, bytes]]:
    rng = random.Random(seed)
    values = [rng.randbytes(size) for _ in range(min(count, 1000))]
    return [(None if keys == 0 else b"key-%d" % rng.randrange(keys), values[i % len(values)]) for i in range(count)]


def send(bootstrap: str, partitions: int, batch: list[tuple[bytes | None, bytes]], stamped: bool) -> float:
    """records/s, first produce to the end of flush, over a fresh topic."""
    topic = f"kdiv-bench-confluent-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topic(bootstrap, topic, partitions))
    producer = Producer({**DEFAULT_CONFIG, "bootstrap.servers": bootstrap})
    writer = ConfluentDivWriter(producer)
    produce = writer.produce if stamped else producer.produce
    if stamped:
        writer.partitions(topic)  # the metadata, as the plain producer's first produce fetches it
    else:
        producer.list_topics(topic, timeout=10)
    started = time.perf_counter()
    for key, value in batch:
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    if stamped:
        writer.close(300)
    elif producer.flush(300):
        raise SystemExit("plain producer: records left unacknowledged after 300 s")
    return len(batch) / (time.perf_counter() - started)


def hand_off_us(batch: list[tuple[bytes | None, bytes]], partitions: int, stamped: bool) -> float:
    """µs per `produce` into a queue no broker drains (the hand-off's CPU cost alone)."""
    producer = Producer(
        {
            **DEFAULT_CONFIG,
            "bootstrap.servers": "127.0.0.1:1",
            "queue.buffering.max.messages": len(batch) * 2 + 10,
            "queue.buffering.max.kbytes": 2**21,
            "message.timeout.ms": 600_000,
            "log_level": 0,
        }
    )
    writer = ConfluentDivWriter(producer, metadata_max_age_ms=2**62)
    writer._partitions["t"] = (writer.core.clock_ms(), list(range(partitions)))  # no metadata to ask for
    started = time.perf_counter()
    if stamped:
        for key, value in batch:
            writer.produce("t", value, key)
    else:
        # librdkafka's murmur2_random picks the partition (in C) when the record is sent.
        for key, value in batch:
            producer.produce("t", value, key)
    elapsed = time.perf_counter() - started
    producer.purge()
    producer.flush(10)
    return elapsed / len(batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys; 0: unkeyed (round robin)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", default=os.environ.get("KDIV_BOOTSTRAP"))
    parser.add_argument("--cpu", action="store_true", help="the hand-off's CPU cost alone, no broker")
    args = parser.parse_args()
    batch = records(args.records, args.record_size, args.keys, seed=1)
    if args.cpu:
        costs: dict[bool, list[float]] = {False: [], True: []}
        for round_number in range(args.repeat):
            for stamping in (False, True) if round_number % 2 == 0 else (True, False):
                costs[stamping].append(hand_off_us(batch, args.partitions, stamping))
            print(
                f"round {round_number + 1}: plain {costs[False][-1]:.2f} µs, stamped {costs[True][-1]:.2f} µs per record"
            )
        plain_us, stamped_us = statistics.median(costs[False]), statistics.median(costs[True])
        print(
            f"median: plain {plain_us:.2f} µs, stamped {stamped_us:.2f} µs per record; ratio {stamped_us / plain_us:.1f}"
        )
        return
    broker = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            broker = KafkaCluster(port=0).start()
            bootstrap = broker.bootstrap
        plain: list[float] = []
        stamped: list[float] = []
        for round_number in range(args.repeat):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for stamping in order:
                rate = send(bootstrap, args.partitions, batch, stamping)
                (stamped if stamping else plain).append(rate)
                print(f"round {round_number + 1} {'stamped' if stamping else 'plain':7} {rate:12,.0f} records/s")
        plain_median, stamped_median = statistics.median(plain), statistics.median(stamped)
        print(
            f"median: plain {plain_median:,.0f} records/s, stamped {stamped_median:,.0f} records/s; "
            f"ratio stamped/plain {stamped_median / plain_median:.2f} ({args.records:,} records of "
            f"{args.record_size} bytes, {args.keys or 'no'} keys, {args.partitions} partitions, {args.repeat} rounds)"
        )
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
