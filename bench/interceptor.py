"""The Java interceptor's cost: Apache Kafka's ProducerPerformance with and without it.

    python bench/interceptor.py [--records N] [--record-size B] [--partitions K] [--repeat R]
                                [--bootstrap HOST:PORT] [--cpu]

One run: start Apache Kafka (kdiv.dev.broker, unless --bootstrap or KDIV_BOOTSTRAP names one),
then R rounds, each running `org.apache.kafka.tools.ProducerPerformance` (kafka-tools 4.4.0,
from `kdiv fetch-jars`) twice on fresh K-partition topics, N unkeyed records of B random
bytes at full speed (--throughput -1, acks=all, the tool's defaults otherwise): once plain
(the baseline), once with kdiv's interceptor (`interceptor.classes`, docs/java-producers.md).
The order alternates per round so neither side always runs on a warmer broker. Prints the
records/s ProducerPerformance reports for each, the medians and the ratio
interceptor/plain; absolute figures depend on the machine, the ratio is the figure to watch.

--cpu measures the interceptor's CPU cost alone, without a broker: bench/InterceptorCost.java
calls `onSend` on N records with a partition (no metadata lookup) and prints ns/record
against the baseline of building and serializing the same records, per round, in one JVM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "app"))

from kdiv.dev.broker import KafkaCluster
from kdiv.dev.demo import ensure_topic
from tests.harness.kafka_tools import PRODUCER_PERFORMANCE, interceptor_properties, run_tool, tool_command

_SUMMARY = re.compile(r"(\d+) records sent, ([\d.]+) records/sec")


def produce(bootstrap: str, records: int, record_size: int, partitions: int, interceptor: bool) -> float:
    """ProducerPerformance's records/s over a fresh topic."""
    topic = f"kdiv-bench-interceptor-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topic(bootstrap, topic, partitions))
    props = [f"bootstrap.servers={bootstrap}", "acks=all"]
    if interceptor:
        props += [f"{name}={value}" for name, value in interceptor_properties().items()]
    result = run_tool(
        PRODUCER_PERFORMANCE,
        *("--topic", topic, "--num-records", str(records), "--record-size", str(record_size)),
        *("--throughput", "-1", "--producer-props", *props),
        interceptor=interceptor,
        timeout=600,
    )
    found = _SUMMARY.findall(result.stdout)
    if not found or int(found[-1][0]) != records:
        raise SystemExit(
            f"no summary line for {records} records in ProducerPerformance's output:\n{result.stdout[-2000:]}"
        )
    return float(found[-1][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", default=os.environ.get("KDIV_BOOTSTRAP"))
    parser.add_argument("--cpu", action="store_true", help="onSend's CPU cost alone, no broker")
    args = parser.parse_args()
    if args.cpu:
        source = os.path.join(os.path.dirname(__file__), "InterceptorCost.java")
        command = tool_command(source, str(args.records), str(args.record_size), str(args.repeat))
        subprocess.run(command, check=True, timeout=600)
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
            for interceptor in order:
                rate = produce(bootstrap, args.records, args.record_size, args.partitions, interceptor)
                (stamped if interceptor else plain).append(rate)
                print(
                    f"round {round_number + 1} {'interceptor' if interceptor else 'plain':11} {rate:12,.0f} records/s"
                )
        plain_median, stamped_median = statistics.median(plain), statistics.median(stamped)
        print(
            f"median: plain {plain_median:,.0f} records/s, interceptor {stamped_median:,.0f} records/s; "
            f"ratio interceptor/plain {stamped_median / plain_median:.2f} "
            f"({args.records:,} records of {args.record_size} bytes, {args.partitions} partitions, {args.repeat} rounds)"
        )
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
