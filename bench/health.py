"""/health while a worker validates 200,000 producers never seen before.

    python bench/health.py [--producers 200000] [--limit 20000] [--batch-max 5000] [--repeat 3]
                           [--variant NAME=APP_DIR ...] [--bootstrap HOST:PORT]

The scenario of tests/integration/test_producer_limit.py, measured instead of bounded: start
Apache Kafka (kdiv.dev.broker, unless --bootstrap or KDIV_BOOTSTRAP names one) and kdiv's
dev Schema Registry (unless --registry or KDIV_SCHEMA_REGISTRY_URL names one); per variant,
a fresh one-partition topic and a worker (`faust -A kdiv.worker.main worker`, its `kdiv`
package imported from the variant's APP_DIR, e.g. a `git archive` of the previous commit's
app/ as the baseline), KDIV_PRODUCERS_LIMIT and KDIV_BATCH_MAX as given; once it is ready,
--producers one-record producers are written (one DATA record each, in large batches, so
the worker fetches them in huge batches), and a thread GETs /health every 100 ms (and
/producers/ every 3 s, as the dashboard does) until the group has committed the end of the
topic. Per run: /health latency (median, 99th percentile, max) and the worker's RSS at start
and at its peak. --repeat rounds run the variants interleaved (a shared machine's load
varies); the summary gives per variant the slowest probe of all rounds and the medians of
the rest, and each variant's figures as ratios to the first variant's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kdiv.dev.broker import KafkaCluster  # noqa: E402
from kdiv.dev.registry.process import DevRegistryProcess  # noqa: E402
from tests.conftest import _create_topic  # noqa: E402
from tests.harness.broker import wait_until_caught_up  # noqa: E402
from tests.harness.processes import WorkerProcess, free_port  # noqa: E402
from tests.integration.test_producer_limit import (  # noqa: E402
    probe_health,
    produce_one_record_producers,
    rss_mb,
)


def package_of(app_dir: str) -> str:
    """Where a worker started with `app_dir` first on PYTHONPATH imports `kdiv` from."""
    env = {**os.environ, "PYTHONPATH": f"{app_dir}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", "import kdiv; print(kdiv.__file__)"], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


async def run_variant(
    bootstrap: str,
    registry: str,
    name: str,
    app_dir: str,
    producers: int,
    limit: int,
    batch_max: int,
    workdir: Path,
) -> dict[str, float]:
    topic = f"kdiv-bench-health-{uuid.uuid4().hex[:8]}"
    await _create_topic(bootstrap, topic, 1)
    app_id = f"health-{name}-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        name,
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=workdir,
        web_port=free_port(),
        env={
            "KDIV_PRODUCERS_LIMIT": str(limit),
            "KDIV_BATCH_MAX": str(batch_max),
            "KDIV_SCHEMA_REGISTRY_URL": registry,
            "PYTHONPATH": f"{app_dir}{os.pathsep}{ROOT}",
        },
    )
    worker.start()
    try:
        await worker.wait_ready()
        assert worker.pid is not None
        start_rss = peak = rss_mb(worker.pid)
        latencies: list[float] = []
        stop = threading.Event()
        probing = threading.Thread(target=probe_health, args=(worker.url, latencies, stop), daemon=True)
        probing.start()
        started = time.monotonic()
        await produce_one_record_producers(bootstrap, topic, range(producers))
        catching_up = asyncio.create_task(wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=600))
        while not catching_up.done():
            peak = max(peak, rss_mb(worker.pid))
            await asyncio.sleep(0.2)
        await catching_up
        elapsed = time.monotonic() - started
        stop.set()
        probing.join(timeout=30)
    finally:
        worker.terminate()
    ordered = sorted(latencies)
    return {
        "probes": len(latencies),
        "median_ms": statistics.median(latencies) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "max_ms": ordered[-1] * 1000,
        "rss_start_mb": start_rss,
        "rss_peak_mb": peak,
        "catch_up_s": elapsed,
    }


async def main_async(args: argparse.Namespace, bootstrap: str, registry: str) -> None:
    variants = [v.split("=", 1) for v in args.variant] or [["current", str(ROOT / "app")]]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory(prefix="kdiv-bench-health-") as workdir:
        for round_ in range(args.repeat):
            for name, app_dir in variants:  # interleaved: a shared machine's load varies
                if not round_:
                    print(f"{name}: kdiv from {package_of(app_dir)}", flush=True)
                figures = await run_variant(
                    bootstrap,
                    registry,
                    name,
                    app_dir,
                    args.producers,
                    args.limit,
                    args.batch_max,
                    Path(workdir) / f"round-{round_ + 1}",
                )
                runs[name].append(figures)
                print(
                    f"  {name}, round {round_ + 1}: {args.producers:,} new producers validated and committed in "
                    f"{figures['catch_up_s']:.1f} s; /health over {figures['probes']:.0f} probes: median "
                    f"{figures['median_ms']:.1f} ms, p99 {figures['p99_ms']:.0f} ms, max {figures['max_ms']:.0f} ms; "
                    f"RSS {figures['rss_start_mb']:.0f} MB at start, peak {figures['rss_peak_mb']:.0f} MB",
                    flush=True,
                )
    summary = {
        name: {
            "max_ms": max(f["max_ms"] for f in figures),  # the slowest probe of every round
            "p99_ms": statistics.median(f["p99_ms"] for f in figures),
            "median_ms": statistics.median(f["median_ms"] for f in figures),
            "catch_up_s": statistics.median(f["catch_up_s"] for f in figures),
            "rss_growth_mb": statistics.median(f["rss_peak_mb"] - f["rss_start_mb"] for f in figures),
        }
        for name, figures in runs.items()
    }
    base_name = variants[0][0]
    base = summary[base_name]
    for name, figures in summary.items():
        print(
            f"{name} over {args.repeat} round(s): slowest /health {figures['max_ms']:.0f} ms "
            f"(goal < 1000: {'met' if figures['max_ms'] < 1000 else 'NOT met'}), median p99 "
            f"{figures['p99_ms']:.0f} ms, median {figures['median_ms']:.1f} ms, catch-up {figures['catch_up_s']:.1f} s, "
            f"RSS growth {figures['rss_growth_mb']:.0f} MB"
            + (
                ""
                if name == base_name
                else f"; / {base_name}: slowest {figures['max_ms'] / base['max_ms']:.2f}x, p99 "
                f"{figures['p99_ms'] / base['p99_ms']:.2f}x, catch-up {figures['catch_up_s'] / base['catch_up_s']:.2f}x, "
                f"RSS growth {figures['rss_growth_mb'] / max(base['rss_growth_mb'], 1):.2f}x"
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=200_000)
    parser.add_argument("--limit", type=int, default=20_000, help="KDIV_PRODUCERS_LIMIT")
    parser.add_argument("--batch-max", type=int, default=5_000, help="KDIV_BATCH_MAX")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=APP_DIR",
        help="a worker importing kdiv from APP_DIR (repeatable; the first is the baseline); default: this tree",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds, the variants interleaved in each")
    parser.add_argument("--bootstrap", default=os.environ.get("KDIV_BOOTSTRAP"))
    parser.add_argument(
        "--registry", default=os.environ.get("KDIV_SCHEMA_REGISTRY_URL"), help="default: kdiv's dev registry"
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(KafkaCluster(port=0)).bootstrap
        registry = args.registry or stack.enter_context(DevRegistryProcess(bootstrap)).url
        asyncio.run(main_async(args, bootstrap, registry))


if __name__ == "__main__":
    main()
