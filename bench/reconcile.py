"""Reconcile job read throughput: kdiv's data source and Spark's kafka source against a plain confluent-kafka read.

    python bench/reconcile.py [--sizes 100000,1000000] [--records N] [--partitions 4]
                              [--repeat 3] [--batch-records 5000] [--max-records-per-split 500000]
                              [--consumer-config KEY=VALUE ...] [--master local[2]] [--bootstrap HOST:PORT]

One run: start Apache Kafka (kdiv.dev.broker, unless --bootstrap or KDIV_BOOTSTRAP names one), create a
topic of --partitions partitions and write --records records (default: the largest size) with
confluent-kafka: keys drawn from records/4 distinct keys, --value-size-byte values and a 47-byte
``div`` header (the size of a DIV END_OF_SEGMENT header), round robin over the partitions.
Then, for each size S of --sizes, a snapshot of the topic's first S records (S/partitions from
the start of each partition) is read by each stage, --repeat times, interleaved:

  plain        a bare confluent-kafka consumer, with the data source's consumer settings, reads
               the snapshot's ranges one partition at a time, touching nothing: the ceiling of
               any librdkafka-based reader;
  datasource   `kdiv.reconcile.kafka_source.read_topics(source="python")` through Spark with the
               job's kind of aggregation, the latest record per key (groupBy key: max offset,
               count), collected to the driver. Its result is checked: every record counted once,
               every key found.
  sparksource  the same through Spark's own kafka source (`source="spark"`: the connector
               `kdiv fetch-jars` cached, which the session loads), same snapshot offsets, same check.

Stages are functions in STAGES: a later stage (the full reconciliation) is one more function there.

Excluded from the throughput and reported on their own: the SparkSession's start, and the first
query of each Spark source in the session (Python workers start, the JVM compiles the read path).

Figures: records/min per stage and size (median of --repeat, and the best), the ratios
datasource/plain, sparksource/plain and sparksource/datasource (the two sources in the same run)
at each size, and the scaling of each stage (records/min at the largest size
over records/min at the smallest). "others" is the CPU the machine spent, during the stage, on
processes this bench did not start, as a share of all cores: well above 0 means the run shared
the machine and its figure is low.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from kdiv.dev.broker import KafkaCluster  # noqa: E402
from kdiv.reconcile.kafka_source import (  # noqa: E402
    DEFAULT_BATCH_RECORDS,
    DEFAULT_MAX_RECORDS_PER_SPLIT,
    READER_CONSUMER_DEFAULTS,
    read_topics,
)
from kdiv.reconcile.snapshot import PartitionRange, Snapshot, take_snapshot  # noqa: E402

DIV_HEADER_SIZE = 47
_VALUE_POOL = 1024  # distinct values cycled through: random bytes, cheap to produce
_PLAIN_BATCH = 10_000


class BenchError(RuntimeError):
    pass


@dataclass
class Bench:
    """What every stage may use."""

    args: argparse.Namespace
    bootstrap: str
    topic: str
    librdkafka: dict  # bootstrap.servers and --consumer-config
    librdkafka_tuning: dict  # --consumer-config alone
    spark: Any = None  # SparkSession, built once
    # Processes whose CPU (with their descendants': the broker, Spark's JVM and Python
    # workers) is the bench's own.
    own_pids: list[int] = field(default_factory=list)


@dataclass
class Measurement:
    records: int
    seconds: float
    others: float | None  # share of all cores spent by processes we did not start

    @property
    def per_minute(self) -> float:
        return self.records / self.seconds * 60


# -- the topic --------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name, future in admin.create_topics([NewTopic(topic, partitions, 1)]).items():
        try:
            future.result(30)
        except Exception as failure:
            raise BenchError(f"cannot create topic {name} on {bootstrap}: {failure}") from failure
    # Wait until the broker serves the topic's metadata: producing sooner may fail.
    deadline = time.monotonic() + 10
    while len(admin.list_topics(topic, timeout=5).topics[topic].partitions) != partitions:
        if time.monotonic() > deadline:
            raise BenchError(f"topic {topic} on {bootstrap} has no {partitions} partitions 10 s after creation")
        time.sleep(0.05)


def produce(bench: Bench) -> float:
    """Writes the records; returns seconds."""
    args = bench.args
    producer = Producer(
        {
            "bootstrap.servers": bench.bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    values = [os.urandom(args.value_size) for _ in range(_VALUE_POOL)]
    header: list = [("div", os.urandom(DIV_HEADER_SIZE))]
    distinct_keys = max(1, args.records // 4)
    start = time.perf_counter()
    for i in range(args.records):
        # A multiplicative hash spreads keys over partitions without a Python RNG per record.
        key = b"key-%010d" % (i * 2_654_435_761 % distinct_keys)
        while True:
            try:
                producer.produce(
                    bench.topic, value=values[i % _VALUE_POOL], key=key, partition=i % args.partitions, headers=header
                )
                break
            except BufferError:  # local queue full: let librdkafka deliver
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise BenchError(f"{len(producer)} records still undelivered to {bench.topic} after 120 s")
    return time.perf_counter() - start


def prefix_snapshot(full: Snapshot, records: int) -> Snapshot:
    """The first `records` records of a round-robin-written topic."""
    partitions = len(full.ranges)
    ranges = []
    for index, r in enumerate(full.ranges):
        wanted = records // partitions + (1 if index < records % partitions else 0)
        if r.end - r.start < wanted:
            raise BenchError(f"{r.topic}[{r.partition}] holds {r.end - r.start} records, {wanted} wanted")
        ranges.append(PartitionRange(r.topic, r.partition, r.start, r.start + wanted))
    return Snapshot(full.taken_at_ms, tuple(ranges))


# -- the stages ---------------------------------------------------------------------------------


def stage_plain(bench: Bench, snapshot: Snapshot) -> int:
    """A bare confluent-kafka read of the snapshot's ranges; returns the records read."""
    consumer = Consumer(
        {
            "bootstrap.servers": bench.bootstrap,
            "group.id": f"kdiv-bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # The data source's own settings: the comparison is then about Spark and Arrow.
            **READER_CONSUMER_DEFAULTS,
            **bench.librdkafka_tuning,
        }
    )
    read = 0
    try:
        for r in snapshot.ranges:
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
            next_offset = r.start
            while next_offset < r.end:
                # Never more than the range holds, so nothing past it is fetched into the count.
                messages = consumer.consume(num_messages=min(_PLAIN_BATCH, r.end - next_offset), timeout=5)
                if not messages:
                    raise BenchError(f"no records from {r.topic}[{r.partition}] at offset {next_offset} for 5 s")
                if messages[-1].error():
                    raise BenchError(
                        f"reading {r.topic}[{r.partition}] at offset {next_offset}: {messages[-1].error()}"
                    )
                read += len(messages)
                next_offset = messages[-1].offset() + 1  # type: ignore[operator]  # consumed: has an offset
            consumer.unassign()
    finally:
        consumer.close()
    return read


def read_latest_per_key(bench: Bench, snapshot: Snapshot, source: str) -> int:
    """The snapshot through Spark from `source`, latest record per key; returns the records counted."""
    from pyspark.sql import functions as F

    df = read_topics(
        bench.spark,
        snapshot,
        [bench.topic],
        librdkafka=bench.librdkafka,
        source=source,
        max_records_per_split=bench.args.max_records_per_split,
        batch_records=bench.args.batch_records,
    )
    latest = df.groupBy("key").agg(F.max("offset").alias("latest_offset"), F.count("*").alias("records"))
    totals = latest.agg(F.count("*"), F.sum("records")).first()
    assert totals is not None, "an aggregation without grouping has one row"
    keys, records = totals
    expected_keys = min(max(1, bench.args.records // 4), snapshot.records_planned)
    if records != snapshot.records_planned or keys > expected_keys:
        raise BenchError(
            f"{source} source counted {records} records under {keys} keys; planned {snapshot.records_planned} "
            f"records under at most {expected_keys} keys"
        )
    return records


def stage_datasource(bench: Bench, snapshot: Snapshot) -> int:
    """kdiv's data source (confluent-kafka on the executors, Arrow batches to Spark)."""
    return read_latest_per_key(bench, snapshot, "python")


def stage_sparksource(bench: Bench, snapshot: Snapshot) -> int:
    """Spark's own kafka source (the connector `kdiv fetch-jars` cached), the same offsets."""
    return read_latest_per_key(bench, snapshot, "spark")


STAGES: dict[str, Callable[[Bench, Snapshot], int]] = {
    "plain": stage_plain,
    "datasource": stage_datasource,
    "sparksource": stage_sparksource,
}
RATIOS = [("datasource", "plain"), ("sparksource", "plain"), ("sparksource", "datasource")]


# -- CPU accounting (Linux /proc) ---------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields[:8]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / _TICKS


def tree_cpu_s(roots: list[int]) -> float:
    """CPU seconds of `roots` and their descendants, reaped children included."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        ppid = int(fields[1])
        # utime, stime, cutime, cstime: a reaped child's CPU moves to its parent's c* fields.
        stats[int(entry.name)] = (ppid, sum(int(v) for v in fields[11:15]) / _TICKS)
    ours = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in stats.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                changed = True
    return sum(cpu for pid, (_, cpu) in stats.items() if pid in ours)


def measure(bench: Bench, name: str, snapshot: Snapshot) -> Measurement:
    busy_before, ours_before = machine_busy_s(), tree_cpu_s(bench.own_pids)
    start = time.perf_counter()
    records = STAGES[name](bench, snapshot)
    seconds = time.perf_counter() - start
    others_s = (machine_busy_s() - busy_before) - (tree_cpu_s(bench.own_pids) - ours_before)
    others = max(0.0, others_s) / (seconds * (os.cpu_count() or 1))
    if records != snapshot.records_planned:
        raise BenchError(f"{name} read {records} records of {snapshot.records_planned} planned")
    return Measurement(records, seconds, others)


# -- the run ------------------------------------------------------------------------------------


def build_spark(bench: Bench) -> float:
    """Starts the SparkSession; returns seconds."""
    from kdiv.reconcile.session import build_session

    start = time.perf_counter()
    bench.spark = build_session(bench.args.master, "kdiv-bench-reconcile", {"spark.ui.showConsoleProgress": "false"})
    return time.perf_counter() - start


def run(args: argparse.Namespace, bootstrap: str) -> None:
    topic = f"kdiv-bench-reconcile-{uuid.uuid4().hex[:8]}"
    tuning = dict(kv.split("=", 1) for kv in args.consumer_config)
    bench = Bench(args, bootstrap, topic, {"bootstrap.servers": bootstrap, **tuning}, tuning, own_pids=[os.getpid()])
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())} ({os.cpu_count()} cores)")

    create_topic(bootstrap, topic, args.partitions)
    seconds = produce(bench)
    print(
        f"produced {args.records:,} records to {topic} ({args.partitions} partitions) in {seconds:.1f} s "
        f"({args.records / seconds * 60:,.0f} rec/min)"
    )
    full = take_snapshot(bootstrap, [topic])
    if full.records_planned != args.records:
        raise BenchError(f"the snapshot of {topic} plans {full.records_planned} records, {args.records} were written")
    snapshots = {size: prefix_snapshot(full, size) for size in args.sizes}

    print(f"SparkSession ({args.master}) start: {build_spark(bench):.1f} s")
    if "sparksource" in args.stages:
        from kdiv.reconcile.kafka_source import SparkKafkaUnavailable, resolve_source

        try:
            resolve_source(bench.spark, "spark")
        except SparkKafkaUnavailable as missing:
            raise BenchError(str(missing)) from None
    for name in ("datasource", "sparksource"):
        if name in args.stages:
            cold = measure(bench, name, snapshots[args.sizes[0]])
            print(
                f"first {name} query of the session (cold), {cold.records:,} records: {cold.seconds:.1f} s "
                f"({cold.per_minute:,.0f} rec/min)"
            )

    results: dict[tuple[str, int], list[Measurement]] = {}
    for round_ in range(args.repeat):
        for size in args.sizes:
            for name in args.stages:
                m = measure(bench, name, snapshots[size])
                results.setdefault((name, size), []).append(m)
                print(
                    f"  round {round_ + 1} {name:10s} {size:>10,}: {m.seconds:6.2f} s "
                    f"{m.per_minute:>13,.0f} rec/min  others {m.others:4.0%}",
                    flush=True,
                )
    report(args, results)


def report(args: argparse.Namespace, results: dict[tuple[str, int], list[Measurement]]) -> None:
    def median_rate(name: str, size: int) -> float:
        return statistics.median(m.per_minute for m in results[(name, size)])

    print()
    print(f"{'stage':10s} {'records':>10s} {'median rec/min':>15s} {'best rec/min':>13s} {'rec/s':>9s} {'others':>7s}")
    for size in args.sizes:
        for name in args.stages:
            ms = results[(name, size)]
            rate = median_rate(name, size)
            print(
                f"{name:10s} {size:>10,} {rate:>15,.0f} {max(m.per_minute for m in ms):>13,.0f} "
                f"{rate / 60:>9,.0f} {statistics.median(m.others or 0.0 for m in ms):>7.0%}"
            )
    print()
    for numerator, denominator in RATIOS:
        if numerator in args.stages and denominator in args.stages:
            for size in args.sizes:
                ratio = median_rate(numerator, size) / median_rate(denominator, size)
                print(f"ratio {numerator}/{denominator} at {size:,}: {ratio:.2f}")
    if len(args.sizes) > 1:
        small, large = args.sizes[0], args.sizes[-1]
        for name in args.stages:
            scaling = median_rate(name, large) / median_rate(name, small)
            print(f"scaling {name}: rec/min at {large:,} / at {small:,} = {scaling:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated snapshot sizes (records)")
    parser.add_argument("--records", type=int, default=None, help="records written (default: the largest size)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the summary gives medians")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of: {', '.join(STAGES)}")
    parser.add_argument(
        "--batch-records",
        type=int,
        default=DEFAULT_BATCH_RECORDS,
        help="data source: records per consume() call and Arrow batch",
    )
    parser.add_argument(
        "--max-records-per-split",
        type=int,
        default=DEFAULT_MAX_RECORDS_PER_SPLIT,
        help="data source: offsets per Spark input partition",
    )
    parser.add_argument(
        "--consumer-config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka properties for both readers (e.g. fetch.max.bytes=1048576)",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KDIV_BOOTSTRAP", ""),
        help="an existing broker (default: KDIV_BOOTSTRAP, else Apache Kafka started from `kdiv fetch-jars` jars)",
    )
    args = parser.parse_args()
    try:
        args.sizes = sorted({int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--sizes {args.sizes}: expected comma-separated integers")
    if not args.sizes or min(args.sizes) < 1:
        parser.error("--sizes needs at least one positive size")
    args.records = args.records or args.sizes[-1]
    if args.records < args.sizes[-1]:
        parser.error(f"--records {args.records} is below the largest size {args.sizes[-1]}")
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stages {', '.join(unknown)}; known: {', '.join(STAGES)}")
    bad_config = [kv for kv in args.consumer_config if "=" not in kv]
    if bad_config:
        parser.error(f"--consumer-config expects KEY=VALUE, got {' '.join(bad_config)}")

    broker = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            broker = KafkaCluster(port=0).start()
            bootstrap = broker.bootstrap
        run(args, bootstrap)
    except BenchError as failure:
        sys.exit(f"bench failed: {failure}")
    except KeyboardInterrupt:
        sys.exit("interrupted")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
