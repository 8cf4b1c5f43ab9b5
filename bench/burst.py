"""A million producers on one worker: a burst of new producers, paced writes, and takeovers.

    python bench/burst.py [--partitions 1000] [--producers-per-partition 1000]
                          [--mode burst|paced|both] [--rate 20000] [--takeover|--no-takeover]
                          [--bootstrap HOST:PORT] [--broker-socket-request-max-bytes N]
                          [--stall-s 90] [--timeout 1500] [--profile-takeover] [--keep]
                          [--app-source head|tree|live] [--app-rev REV] [--max-in-flight-bytes N]

One broker (Apache Kafka from kdiv.dev.broker on a free port, unless --bootstrap names one;
--broker-socket-request-max-bytes starts it with that `socket.request.max.bytes`), kdiv's dev
Schema Registry (unless KDIV_SCHEMA_REGISTRY_URL names one) and ONE worker (`faust -A
kdiv.worker.main worker -l info`, web views on a free port). Per mode, a fresh topic of P
partitions; the worker starts on it while it is empty and, once `/health` says `ready`:

1. pass 1: G producer GUIDs on each partition each write START_OF_SEGMENT and one DATA record
   (2*P*G records, P*G producer-partitions: 10^6 by default). Records are stamped by the
   stamping core (`DivStamper`, one short-lived stamper per producer, the exact records a
   DivWriter sends) and sent in whole record batches through one plain aiokafka producer:
   `burst` sends every batch at once, `paced` at --rate records/s;
2. pass 2: every producer writes one more DATA record (seq 2 of segment 0, the header built by
   the same wire encoder): records of known producers, against pass 1's new ones.

Each pass is timed until the group's committed offsets reach the log ends (bounded: --timeout,
and --stall-s without progress is reported as a finding, with `/health` and the worker log's
tail). During it, probes in threads: `/health` and `/overview/` every 0.5 s, `/producers/` and
`/partitions/` every 5 s, each with a timeout. Per pass: worker CPU seconds per record, RSS
(VmRSS) growth over the empty-topic baseline per producer-partition, probe latencies, and the
worker's incidents (a clean stream: there must be none). Log lines counted: the worker's
heartbeat expiries, "Thread keepalive" warnings, rejoins/joins/generations, and the broker's
InvalidReceiveException / "larger than" (requests over socket.request.max.bytes).

--takeover (default): after the last mode, SIGKILL the worker and start a new one with the same
app id and data dir, then once more killed and started with a new, empty data dir (its state
comes back from the changelog alone). Per takeover: launch -> `/health` ready, launch ->
state whole (`/partitions/`: every partition not recovering and its `producers` summing to
P*G), whether `/health` said ready before that (and how many producers `/partitions/` showed
then), changelog records (the changelog's end offsets, `kdiv_restore_records_total` from
`/metrics`, Faust's "Still fetching changelog topics for recovery" lines). --profile-takeover
attaches py-spy (`pip install py-spy`) to the new worker from launch to whole.

Workers run `git archive` of HEAD's app/ by default (--app-source, --app-rev): the working
tree may change during a run, and a figure must belong to one version. The bench's producer
keeps at most --max-in-flight-bytes unacknowledged (aiokafka sends a broker every ready batch in
one request: with 1 000 partitions, over the broker's default socket.request.max.bytes).

Every figure is printed beside its goal and the load average at the time (the machine is
shared: a loaded machine's figures are low).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402

from kdiv.dev.broker import KafkaCluster  # noqa: E402
from kdiv.dev.demo import ensure_topic  # noqa: E402
from kdiv.dev.registry.process import DevRegistryProcess  # noqa: E402
from kdiv.div.stamper import DivStamper  # noqa: E402
from kdiv.div.wire import HEADER_NAME, DivHeader, Kind, encode, record_crc  # noqa: E402

# bench/worker.py's helpers (CPU, incidents, topic sizes, py-spy), loaded from its file: the
# benches are scripts, not a package, and mypy checks each once under its own name.
_spec = importlib.util.spec_from_file_location("kdiv_bench_worker", Path(__file__).with_name("worker.py"))
assert _spec is not None and _spec.loader is not None
_worker_bench: Any = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _worker_bench  # its dataclasses look their module up
_spec.loader.exec_module(_worker_bench)
incident_classes = _worker_bench.incident_classes
process_cpu_s = _worker_bench.process_cpu_s
start_py_spy = _worker_bench.start_py_spy
stop_py_spy = _worker_bench.stop_py_spy
summarize_profile = _worker_bench.summarize_profile
topic_sizes = _worker_bench.topic_sizes

BIN = Path(sys.executable).parent
GOAL_TAKEOVER_S = 30.0
GOAL_BYTES_PER_PRODUCER = 150.0
GOAL_HEALTH_P99_S = 0.100
GOAL_OVERVIEW_S = 1.0
GOAL_NEW_OVER_KNOWN = 3.0

WORKER_PATTERNS = {
    "Heartbeat session expired": re.compile(r"Heartbeat session expired", re.I),
    "Heartbeat failed": re.compile(r"Heartbeat failed", re.I),
    "Thread keepalive": re.compile(r"Thread keepalive", re.I),
    "Task timed out": re.compile(r"Task timed out", re.I),
    "Timer ... overlapping": re.compile(r"Timer \S+ is overlapping"),
    "rejoin": re.compile(r"re-?join", re.I),
    "Joined group": re.compile(r"Joined group", re.I),
    "generation": re.compile(r"generation", re.I),
}
BROKER_PATTERNS = {
    "InvalidReceive": re.compile(r"InvalidReceive"),
    "larger than": re.compile(r"larger than", re.I),
}


class BenchError(RuntimeError):
    pass


def app_snapshot(source: str, workdir: Path, rev: str = "HEAD") -> tuple[Path, str]:
    """Where the workers import `kdiv` from, and what it is. `head`: a `git archive` of `rev`'s
    app/ (HEAD's by default: committed code only); `tree`: a copy of the working tree's app/ as it is now; `live`:
    the working tree itself (a change made to it during the run reaches the workers started
    after it: the figures then mix versions)."""

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    commit = git("rev-parse", "--short", rev)
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "app").splitlines()]
    if source == "live":
        return ROOT / "app", f"the working tree, live (HEAD {head}, {len(dirty)} files changed under app/ now)"
    target = workdir / "app-snapshot"
    if source == "head":
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", commit, "app"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        return target / "app", f"{rev} = {commit} (git archive; HEAD {head}, {len(dirty)} uncommitted files under app/)"
    shutil.copytree(ROOT / "app", target / "app", ignore=shutil.ignore_patterns("__pycache__"))
    return (
        target / "app",
        f"the working tree copied at start (HEAD {head} + {len(dirty)} changed files: {', '.join(dirty)[:200]})",
    )


def load() -> str:
    try:
        return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load n/a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def mib(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**20:,.1f} MiB"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def count_lines(text: str, patterns: dict[str, re.Pattern[str]]) -> dict[str, int]:
    counts = dict.fromkeys(patterns, 0)
    for line in text.splitlines():
        for name, pattern in patterns.items():
            if pattern.search(line):
                counts[name] += 1
    return counts


def fmt_counts(counts: dict[str, int]) -> str:
    return ", ".join(f'"{name}" {n}' for name, n in counts.items())


# -- HTTP ---------------------------------------------------------------------------------------


def http_get(url: str, timeout: float) -> tuple[int | None, bytes, float]:
    """(status or None on a transport failure, body or the error's text, seconds)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
            return response.status, body, time.monotonic() - started
    except urllib.error.HTTPError as error:
        try:
            body = error.read()
        except Exception:
            body = b""
        return error.code, body, time.monotonic() - started
    except Exception as failure:
        return None, f"{type(failure).__name__}: {failure}".encode(), time.monotonic() - started


def http_json(url: str, timeout: float) -> tuple[int | None, dict | None, float]:
    status, body, seconds = http_get(url, timeout)
    try:
        return status, json.loads(body), seconds
    except ValueError:
        return status, None, seconds


class Prober(threading.Thread):
    """GETs one view every `every` seconds, each with a timeout, until stopped."""

    def __init__(self, url: str, every: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.timeout = url, every, timeout
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            status, body, seconds = http_get(self.url, self.timeout)
            self.latencies.append(seconds)
            self.statuses[str(status) if status is not None else body.decode(errors="replace")[:40]] += 1
            self.stop_event.wait(max(0.0, self.every - seconds))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(self.timeout + 5)

    def summary(self) -> str:
        if not self.latencies:
            return "no probes"
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        statuses = ", ".join(f"{k}: {v}" for k, v in self.statuses.most_common())
        return (
            f"n={len(ordered)} p50 {1000 * statistics.median(ordered):,.0f} ms, p99 {1000 * p99:,.0f} ms, "
            f"max {1000 * ordered[-1]:,.0f} ms (statuses {statuses})"
        )

    def p99(self) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def max(self) -> float | None:
        return max(self.latencies) if self.latencies else None


# -- the worker ---------------------------------------------------------------------------------


STARTED: list[Worker] = []  # every worker started, stopped at exit whatever happens


class Worker:
    """One `faust -A kdiv.worker.main worker` subprocess in its own process group."""

    def __init__(self, args: argparse.Namespace, bootstrap: str, topic: str, app_id: str, data_dir: Path, log: Path):
        self.args, self.bootstrap, self.topic, self.app_id = args, bootstrap, topic, app_id
        self.data_dir, self.log_path = data_dir, log
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.launched = 0.0

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KDIV_") or k == "KDIV_BROKER_FLAVOR"}
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.args.app_dir), str(ROOT), os.environ.get("PYTHONPATH")])),
            KDIV_BOOTSTRAP=self.bootstrap,
            KDIV_TOPICS=self.topic,
            KDIV_APP_ID=self.app_id,
            KDIV_DATA_DIR=str(self.data_dir),
            KDIV_WEB_ENABLED="true",
            KDIV_WEB_HOST="127.0.0.1",
            KDIV_WEB_PORT=str(self.port),
            KDIV_SCHEMA_REGISTRY_URL=os.environ["KDIV_SCHEMA_REGISTRY_URL"],
        )
        for item in self.args.env:
            name, _, value = item.partition("=")
            env[name] = value
        return env

    def start(self) -> Worker:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.launched = time.monotonic()
            self.launched_wall = time.time()
            self.proc = subprocess.Popen(
                [str(BIN / "faust"), "-A", "kdiv.worker.main", "worker", "-l", "info"],
                cwd=ROOT,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        STARTED.append(self)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker's process group, and reap it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join("      | " + line[:300] for line in self.log_text().splitlines()[-lines:])

    def rss(self) -> int | None:
        return status_kib(self.pid, "VmRSS")

    def hwm(self) -> int | None:
        return status_kib(self.pid, "VmHWM")

    def cpu(self) -> float:
        return process_cpu_s(self.pid) or 0.0

    def health(self, timeout: float = 5.0) -> tuple[int | None, dict | None, float]:
        return http_json(f"{self.url}/health", timeout)

    def wait_ready(self, timeout: float) -> float:
        """Seconds from launch to `/health` status ready; BenchError past `timeout`."""
        deadline = self.launched + timeout
        last = None
        while time.monotonic() < deadline:
            if not self.alive:
                raise BenchError(f"the worker exited ({self.returncode}) before ready:\n{self.log_tail(40)}")
            status, body, _ = self.health()
            last = (status, body)
            if status == 200 and body and body.get("status") == "ready":
                return time.monotonic() - self.launched
            time.sleep(0.2)
        raise BenchError(f"the worker was not ready within {timeout:.0f} s (last /health {last}):\n{self.log_tail(40)}")


# -- the records --------------------------------------------------------------------------------


def guid_of(nonce: int, partition: int, n: int) -> bytes:
    return struct.pack(">IIQ", nonce, partition, n)


def data_key(partition: int, n: int) -> bytes:
    return b"p%d-g%d" % (partition, n)


def pass1_records(topic: str, partition: int, producers: int, nonce: int, value: bytes, now_ms: int):
    """START_OF_SEGMENT and one DATA record of each producer of the partition, as a DivWriter
    would send them (the stamping core: one stamper per producer, dropped after)."""
    for n in range(producers):
        stamper = DivStamper(guid_of(nonce, partition, n))
        for record in stamper.data(topic, partition, data_key(partition, n), value, now_ms):
            yield record.key, record.value, list(record.headers)


def pass2_records(partition: int, producers: int, nonce: int, value: bytes, now_ms: int):
    """One more DATA record of each producer: seq 2 of segment 0 (START_OF_SEGMENT was seq 0)."""
    for n in range(producers):
        key = data_key(partition, n)
        header = DivHeader(Kind.DATA, guid_of(nonce, partition, n), 0, 2, now_ms, record_crc(Kind.DATA, key, value))
        yield key, value, [(HEADER_NAME, encode(header))]


def build_batches(producer: AIOKafkaProducer, per_partition, partitions: int, chunk: int):
    """Record batches of at most `chunk` records (and the producer's batch size), interleaved
    across partitions: [(partition, batch, records)]."""
    by_partition: list[list[tuple[int, object, int]]] = []
    for partition in range(partitions):
        batches = []
        batch, count = producer.create_batch(), 0
        for key, value, headers in per_partition(partition):
            if count >= chunk or batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                if count == 0:
                    raise BenchError("one record does not fit in a batch")
                batches.append((partition, batch, count))
                batch, count = producer.create_batch(), 0
                batch.append(key=key, value=value, timestamp=None, headers=headers)
            count += 1
        if count:
            batches.append((partition, batch, count))
        by_partition.append(batches)
    out: list = []
    for i in range(max(map(len, by_partition), default=0)):
        out.extend(batches[i] for batches in by_partition if i < len(batches))
    return out


async def send_batches(
    producer: AIOKafkaProducer, topic: str, batches, rate: float | None, max_in_flight_bytes: int
) -> float:
    """Send every batch (at `rate` records/s when given); seconds until all are acknowledged.

    At most `max_in_flight_bytes` of batches unacknowledged at a time: aiokafka puts every
    ready batch for a broker into one produce request, whatever their total, and a broker
    closes the connection on a request over its socket.request.max.bytes (100 MiB by default;
    1 000 partitions' batches of 2 000 records make one of 148 MB)."""
    started = time.monotonic()
    sent = 0
    pending: list[tuple[asyncio.Future, int]] = []
    in_flight = 0
    for partition, batch, count in batches:
        if rate:
            wait = started + sent / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        size = batch.size()
        while pending and in_flight + size > max_in_flight_bytes:
            future, done_size = pending.pop(0)
            await future
            in_flight -= done_size
        pending.append((await producer.send_batch(batch, topic, partition=partition), size))
        in_flight += size
        sent += count
    await asyncio.gather(*(future for future, _ in pending))
    return time.monotonic() - started


# -- waiting for the worker ---------------------------------------------------------------------


async def committed_total(admin: AIOKafkaAdminClient, app_id: str, ends: dict[TopicPartition, int]) -> int:
    committed = await admin.list_consumer_group_offsets(app_id)
    return sum(
        min(meta.offset, ends[tp])
        for tp, meta in committed.items()
        if tp in ends and meta is not None and meta.offset > 0
    )


async def wait_committed(
    admin: AIOKafkaAdminClient, worker: Worker, ends: dict[TopicPartition, int], args: argparse.Namespace
) -> tuple[float | None, str]:
    """Monotonic time at which the group had committed every end, or (None, why not)."""
    total = sum(ends.values())
    deadline = time.monotonic() + args.timeout
    last, last_change = -1, time.monotonic()
    while True:
        now = time.monotonic()
        if not worker.alive:
            return None, f"the worker exited ({worker.returncode}) at {last} of {total} committed"
        try:
            done = await committed_total(admin, worker.app_id, ends)
        except Exception as failure:
            done = last
            print(f"    (offsets poll failed: {type(failure).__name__}: {failure})")
        if done >= total:
            return time.monotonic(), ""
        if done != last:
            last, last_change = done, now
        elif now - last_change > args.stall_s:
            return None, f"STALLED: {last} of {total} committed, no progress for {args.stall_s:.0f} s"
        if now > deadline:
            return None, f"TIMEOUT: {last} of {total} committed after {args.timeout:.0f} s"
        await asyncio.sleep(1.0)


def report_stall(worker: Worker, why: str) -> None:
    status, body, seconds = worker.health(10)
    print(f"    {why} ({load()})")
    print(f"    /health: {status} in {seconds * 1000:.0f} ms: {json.dumps(body)[:600] if body else ''}")
    print("    worker log ends:")
    print(worker.log_tail(30))


def partitions_view(worker: Worker, timeout: float = 30.0) -> tuple[int | None, int, int, float]:
    """(status, producers summed over `/partitions/`, partitions recovering or without a
    count, seconds)."""
    status, body, seconds = http_json(f"{worker.url}/partitions/", timeout)
    if status != 200 or not body:
        return status, 0, -1, seconds
    items = body.get("items", [])
    producers = sum(item.get("producers") or 0 for item in items)
    pending = sum(1 for item in items if item.get("recovering") or item.get("producers") is None)
    pending += len(body.get("unavailable_workers") or [])
    return status, producers, pending, seconds


# -- one mode -----------------------------------------------------------------------------------


class Context:
    def __init__(self, args: argparse.Namespace, bootstrap: str, broker: KafkaCluster | None, workdir: Path):
        self.args, self.bootstrap, self.broker, self.workdir = args, bootstrap, broker, workdir
        self.nonce = int.from_bytes(os.urandom(4), "big")

    def broker_log(self) -> str:
        if self.broker is None:
            return ""
        return "".join(
            node.output_file.read_text(errors="replace") for node in self.broker.nodes if node.output_file.exists()
        )


async def run_pass(
    ctx: Context,
    worker: Worker,
    topic: str,
    name: str,
    records_of,
    rate: float | None,
    ends_before: dict[TopicPartition, int],
    records: int,
) -> dict | None:
    """Write one pass and time the worker through it; None when it did not finish."""
    args = ctx.args
    producer = AIOKafkaProducer(
        bootstrap_servers=ctx.bootstrap,
        acks="all",
        max_batch_size=1 << 20,
        max_request_size=args.max_request_size,
        request_timeout_ms=120_000,
    )
    await producer.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=ctx.bootstrap, client_id="kdiv-bench-burst")
    await admin.start()
    probes: list[Prober] = []
    try:
        build_started = time.monotonic()
        chunk = 2 * args.producers_per_partition
        if rate:
            chunk = max(2, min(chunk, int(rate * 0.05)))
        batches = build_batches(producer, records_of, args.partitions, chunk)
        print(
            f"  {name}: {records:,} records stamped in {len(batches):,} batches in "
            f"{time.monotonic() - build_started:.1f} s (before the clock)"
        )
        rss_before, cpu_before = worker.rss(), worker.cpu()
        worker_log_before = count_lines(worker.log_text(), WORKER_PATTERNS)
        broker_log_before = count_lines(ctx.broker_log(), BROKER_PATTERNS)
        probes = [
            Prober(f"{worker.url}/health", 0.5, args.probe_timeout),
            Prober(f"{worker.url}/overview/", 0.5, args.probe_timeout),
            Prober(f"{worker.url}/producers/?limit=100", 5.0, args.probe_timeout),
            Prober(f"{worker.url}/partitions/", 5.0, args.probe_timeout),
        ]
        for probe in probes:
            probe.start()
        spy = None
        profile = ctx.workdir / f"py-spy-{worker.log_path.stem}-{name.split()[1]}.txt"
        if args.profile_passes:
            spy = start_py_spy(worker.pid, profile, profile.with_suffix(".log"), 100)
        started = time.monotonic()
        sender = asyncio.ensure_future(send_batches(producer, topic, batches, rate, args.max_in_flight_bytes))
        write_s = await sender
        del batches
        print(
            f"    written in {write_s:.1f} s ({records / write_s:,.0f} records/s"
            f"{f', asked {rate:,.0f}' if rate else ', burst'}) ({load()})"
        )
        ends = (await topic_sizes(ctx.bootstrap, {topic: args.partitions}, False))[topic]
        if sum(ends.values()) - sum(ends_before.values()) != records:
            print(f"    WARNING: the log ends grew by {sum(ends.values()) - sum(ends_before.values())}, not {records}")
        done_at, why = await wait_committed(admin, worker, ends, args)
        if spy is not None:
            stop_py_spy(spy, profile.with_suffix(".log"))
            print(f"    py-spy (--gil, 100 Hz) first send -> all committed, raw stacks in {profile}:")
            for line in summarize_profile(profile, 12):
                print(f"      {line}")
        for probe in probes:
            probe.stop_event.set()
        cpu_after, rss_after, hwm = (
            worker.cpu() if worker.alive else None,
            worker.rss() if worker.alive else None,
            (worker.hwm() if worker.alive else None),
        )
        for probe in probes:
            probe.stop()
        health, overview, producers_probe, partitions_probe = probes
        worker_log = {k: v - worker_log_before[k] for k, v in count_lines(worker.log_text(), WORKER_PATTERNS).items()}
        broker_log = {k: v - broker_log_before[k] for k, v in count_lines(ctx.broker_log(), BROKER_PATTERNS).items()}
        print(f"    /health     {health.summary()}")
        print(f"    /overview/  {overview.summary()}")
        print(f"    /producers/ {producers_probe.summary()}")
        print(f"    /partitions/ {partitions_probe.summary()}")
        print(f"    worker log lines during the pass: {fmt_counts(worker_log)}")
        print(f"    broker log lines during the pass: {fmt_counts(broker_log) if ctx.broker else 'n/a (--bootstrap)'}")
        if done_at is None:
            report_stall(worker, why)
            return None
        elapsed = done_at - started
        cpu_s = None if cpu_after is None else cpu_after - cpu_before
        result = {
            "elapsed": elapsed,
            "cpu_s": cpu_s,
            "cpu_per_record": None if cpu_s is None else cpu_s / records,
            "rss_before": rss_before,
            "rss_after": rss_after,
            "hwm": hwm,
            "health_p99": health.p99(),
            "health_max": health.max(),
            "overview_max": overview.max(),
            "overview_p99": overview.p99(),
            "ends": ends,
            "load": load(),
        }
        print(
            f"    all committed {elapsed:.1f} s after the first send ({records / elapsed:,.0f} records/s); "
            f"worker CPU {cpu_s:.1f} s = {1e6 * result['cpu_per_record']:.1f} us/record; "
            f"RSS {mib(rss_before)} -> {mib(rss_after)} (peak {mib(hwm)}) ({result['load']})"
        )
        return result
    finally:
        for probe in probes:
            probe.stop_event.set()
        await producer.stop()
        await admin.close()


async def run_mode(ctx: Context, mode: str) -> tuple[Worker | None, dict]:
    args = ctx.args
    P, G = args.partitions, args.producers_per_partition
    topic = f"kdiv-burst-{mode}-{uuid.uuid4().hex[:8]}"
    app_id = f"kdiv-burst-{mode}-{uuid.uuid4().hex[:8]}"
    await ensure_topic(ctx.bootstrap, topic, P)
    rundir = ctx.workdir / app_id
    worker = Worker(args, ctx.bootstrap, topic, app_id, rundir / "data-0", rundir / "worker-0.log").start()
    figures: dict = {"mode": mode, "topic": topic, "app_id": app_id}
    print(
        f"{mode}: topic {topic} ({P} partitions x {G} producers), worker {app_id} on {worker.url}, log {worker.log_path}"
    )
    ready_s = worker.wait_ready(args.ready_timeout)
    joins = count_lines(worker.log_text(), WORKER_PATTERNS)
    print(f"  empty topic: /health ready {ready_s:.1f} s after launch; log so far: {fmt_counts(joins)} ({load()})")
    # The empty baseline: the worker settled on its P empty partitions.
    await asyncio.sleep(args.settle_s)
    cpu0, t0 = worker.cpu(), time.monotonic()
    await asyncio.sleep(3)
    idle_cpu = (worker.cpu() - cpu0) / (time.monotonic() - t0)
    baseline = worker.rss()
    figures["baseline"] = baseline
    print(f"  empty baseline: RSS {mib(baseline)}, idle CPU {100 * idle_cpu:.0f}% of a core")
    value = b"v" * args.value_size
    now_ms = int(time.time() * 1000)
    rate = args.rate if mode == "paced" else None
    empty = {TopicPartition(topic, p): 0 for p in range(P)}
    pass1 = await run_pass(
        ctx,
        worker,
        topic,
        "pass 1 (new producers: START_OF_SEGMENT + DATA)",
        lambda p: pass1_records(topic, p, G, ctx.nonce, value, now_ms),
        rate,
        empty,
        2 * P * G,
    )
    figures["pass1"] = pass1
    if pass1 is None:
        return worker, figures
    if pass1["rss_after"] is not None and baseline is not None:
        figures["bytes_per_producer"] = (pass1["rss_after"] - baseline) / (P * G)
    await check_incidents(ctx, app_id, figures)
    pass2 = await run_pass(
        ctx,
        worker,
        topic,
        "pass 2 (known producers: one more DATA)",
        lambda p: pass2_records(p, G, ctx.nonce, value, int(time.time() * 1000)),
        rate,
        pass1["ends"],
        P * G,
    )
    figures["pass2"] = pass2
    if pass2 is not None:
        await check_incidents(ctx, app_id, figures)
    return worker, figures


async def check_incidents(ctx: Context, app_id: str, figures: dict) -> None:
    sizes = await topic_sizes(ctx.bootstrap, {f"{app_id}-incidents": None}, False)
    incidents = sum(sizes.get(f"{app_id}-incidents", {}).values())
    figures["incidents"] = incidents
    if incidents:
        print(f"    INCIDENTS: {incidents} on the clean stream (goal 0):")
        for cls, (count, example) in sorted((await incident_classes(ctx.bootstrap, f"{app_id}-incidents")).items()):
            print(f"      {cls}: {count}, e.g. {example[:300]}")
    else:
        print("    incidents: 0 (goal 0: met)")


# -- takeover -----------------------------------------------------------------------------------


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                pass
    return total


LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
TIMELINE = {
    "joined group": re.compile(r"Joined group"),
    "RocksDB opens ('opening partition')": re.compile(r"opening partition \d+ for gen"),
    "changelog partitions started ('restore start')": re.compile(r"restore start: "),
    "Faust 'Still fetching changelog topics'": re.compile(r"Still fetching changelog topics"),
    "Faust 'Restore complete'": re.compile(r"Restore complete"),
    "'restore end' lines": re.compile(r"restore end: "),
    "Faust 'Worker]: Ready'": re.compile(r"\[\^Worker\]: Ready"),
}


def timeline(worker: Worker) -> list[str]:
    """Seconds from launch of the first and last log line of each step of a takeover."""
    spans: dict[str, list[float]] = {}
    for line in worker.log_text().splitlines():
        match = LOG_TIME.match(line)
        if not match:
            continue
        for name, pattern in TIMELINE.items():
            if pattern.search(line):
                at = time.mktime(time.strptime(match[1][:19], "%Y-%m-%d %H:%M:%S")) + int(match[1][20:]) / 1000
                spans.setdefault(name, []).append(at - worker.launched_wall)
    out = []
    for name in TIMELINE:
        times = spans.get(name)
        if times:
            span = (
                f"+{times[0]:.1f} s"
                if len(times) == 1
                else f"+{times[0]:.1f} .. +{times[-1]:.1f} s ({len(times)} lines)"
            )
            out.append(f"{name} {span}")
    return out


RECOVERY_LINE = re.compile(r"Still fetching changelog topics for recovery.*?total remaining[^0-9]*([0-9,._]+)", re.I)


async def takeover(ctx: Context, old: Worker, keep_data: bool, number: int) -> tuple[Worker, dict]:
    args = ctx.args
    expected = args.partitions * args.producers_per_partition
    rundir = old.log_path.parent
    data_dir = old.data_dir if keep_data else rundir / f"data-{number}"
    old.kill()
    killed = time.monotonic()
    if not keep_data:
        shutil.rmtree(old.data_dir, ignore_errors=True)
    new = Worker(args, ctx.bootstrap, old.topic, old.app_id, data_dir, rundir / f"worker-{number}.log").start()
    what = "data dir kept" if keep_data else "data dir removed (new, empty one)"
    print(
        f"takeover {number}: SIGKILL, new worker ({what}) launched {new.launched - killed:.2f} s later, log {new.log_path}"
    )
    spy = None
    profile = rundir / f"py-spy-{number}.txt"
    if args.profile_takeover:
        await asyncio.sleep(0.5)  # the interpreter up
        spy = start_py_spy(new.pid, profile, rundir / f"py-spy-{number}.log", 100)
    result: dict = {"keep": keep_data, "first_ready": None, "whole": None, "ready_count": None}
    deadline = new.launched + args.takeover_timeout
    last_partitions = time.monotonic() - 10
    last_seen: tuple[int | None, int, int] = (None, 0, -1)
    ready_while_partial = None
    try:
        while time.monotonic() < deadline:
            if not new.alive:
                print(f"  the new worker exited ({new.returncode}):\n{new.log_tail(30)}")
                break
            status, body, _ = new.health(5)
            ready = status == 200 and isinstance(body, dict) and body.get("status") == "ready"
            now = time.monotonic()
            if ready and result["first_ready"] is None:
                result["first_ready"] = now - new.launched
                pstatus, producers, pending, _ = partitions_view(new)
                result["ready_count"] = producers
                result["ready_pending"] = pending
                print(
                    f"  /health ready {result['first_ready']:.1f} s after launch; /partitions/ then: {producers:,} of "
                    f"{expected:,} producers, {pending} partitions recovering or without counts (status {pstatus}) ({load()})"
                )
                if producers < expected or pending:
                    ready_while_partial = (result["first_ready"], producers, pending)
                last_partitions = now
                last_seen = (pstatus, producers, pending)
                if producers >= expected and pending == 0:
                    result["whole"] = time.monotonic() - new.launched
                    break
            if now - last_partitions >= 1.0:
                last_partitions = now
                last_seen = partitions_view(new)[:3]
                pstatus, producers, pending = last_seen
                if ready and producers >= expected and pending == 0:
                    result["whole"] = time.monotonic() - new.launched
                    break
            await asyncio.sleep(0.2)
    finally:
        if spy is not None:
            stop_py_spy(spy, rundir / f"py-spy-{number}.log")
    result["ready_while_partial"] = ready_while_partial
    status, metrics, _ = http_get(f"{new.url}/metrics", 30)
    metrics_text = metrics.decode(errors="replace") if status == 200 else ""
    result["restore_records"] = metric_sum(metrics_text, "kdiv_restore_records_total")
    result["restore_last_s"] = metric_sum(metrics_text, "kdiv_restore_last_duration_seconds")
    changelogs = await topic_sizes(ctx.bootstrap, {f"{old.app_id}-state-p{args.partitions}-changelog": None}, False)
    result["changelog_records"] = sum(sum(v.values()) for v in changelogs.values())
    log = new.log_text()
    remaining = RECOVERY_LINE.findall(log)
    result["recovery_lines"] = len(remaining)
    result["recovery_first_remaining"] = remaining[0] if remaining else None
    result["log_counts"] = count_lines(log, WORKER_PATTERNS)
    result["rss"] = new.rss() if new.alive else None
    result["load"] = load()
    if result["whole"] is None:
        print(
            f"  NOT WHOLE within {args.takeover_timeout:.0f} s: last /partitions/ {last_seen}, /health {new.health(5)[:2]}"
        )
        print(new.log_tail(20))
    else:
        print(
            f"  state whole (/partitions/: {expected:,} producers, none recovering) {result['whole']:.1f} s after launch"
        )
    print(
        f"  changelog records {result['changelog_records']:,} (the state changelog's end offsets); "
        f"kdiv_restore_records_total {result['restore_records']:,.0f}, kdiv_restore_last_duration_seconds "
        f"{result['restore_last_s']:.1f}; Faust 'Still fetching changelog topics for recovery' lines "
        f"{result['recovery_lines']} (first total remaining: {result['recovery_first_remaining']}); "
        f"RSS {mib(result['rss'])}; log: {fmt_counts(result['log_counts'])} ({result['load']})"
    )
    print("  timeline from the worker log (s after launch): " + "; ".join(timeline(new)))
    if spy is not None and profile.exists():
        print(f"  py-spy (--gil, 100 Hz) launch -> whole, raw stacks in {profile}:")
        for line in summarize_profile(profile, 12):
            print("    " + line)
    return new, result


# -- main ---------------------------------------------------------------------------------------


def summary(args: argparse.Namespace, runs: list[dict], takeovers: list[dict]) -> None:
    print("summary (figure | goal | verdict):")
    for figures in runs:
        mode = figures["mode"]
        p1, p2 = figures.get("pass1"), figures.get("pass2")
        if p1 is None:
            print(f"  {mode}: pass 1 did not finish (see above)")
            continue
        bpp = figures.get("bytes_per_producer")
        print(
            f"  {mode}: RSS per producer-partition over the empty baseline: "
            f"{'n/a' if bpp is None else f'{bpp:,.0f} B'} | 150 B | "
            f"{verdict(None if bpp is None else bpp <= GOAL_BYTES_PER_PRODUCER)} ({p1['load']})"
        )
        for name, p in (("pass 1", p1), ("pass 2", p2)):
            if p is None:
                continue
            print(
                f"  {mode} {name}: /health p99 {1000 * (p['health_p99'] or 0):,.0f} ms (max {1000 * (p['health_max'] or 0):,.0f}) "
                f"| 100 ms | {verdict(p['health_p99'] is not None and p['health_p99'] <= GOAL_HEALTH_P99_S)}; "
                f"/overview/ max {1000 * (p['overview_max'] or 0):,.0f} ms (p99 {1000 * (p['overview_p99'] or 0):,.0f}) | 1 s | "
                f"{verdict(p['overview_max'] is not None and p['overview_max'] <= GOAL_OVERVIEW_S)}; "
                f"all committed in {p['elapsed']:.1f} s ({p['load']})"
            )
        if p2 is not None and p1["cpu_per_record"] and p2["cpu_per_record"]:
            ratio = p1["cpu_per_record"] / p2["cpu_per_record"]
            print(
                f"  {mode}: CPU per record, new producers {1e6 * p1['cpu_per_record']:.1f} us / known "
                f"{1e6 * p2['cpu_per_record']:.1f} us = {ratio:.2f} | 3x | {verdict(ratio <= GOAL_NEW_OVER_KNOWN)} "
                f"(per producer: {2 * ratio:.2f})"
            )
        print(f"  {mode}: incidents {figures.get('incidents', 'n/a')} | 0 | {verdict(figures.get('incidents') == 0)}")
    for result in takeovers:
        kind = "data dir kept" if result["keep"] else "data dir removed"
        whole = result["whole"]
        print(
            f"  takeover ({kind}): whole in {'never' if whole is None else f'{whole:.1f} s'} | 30 s | "
            f"{verdict(whole is not None and whole <= GOAL_TAKEOVER_S)}; /health ready at "
            f"{'never' if result['first_ready'] is None else format(result['first_ready'], '.1f') + ' s'}"
            + (
                f", BEFORE the state was whole ({result['ready_while_partial'][1]:,} producers shown, "
                f"{result['ready_while_partial'][2]} partitions pending)"
                if result["ready_while_partial"]
                else ", not before the state was whole"
            )
            + f"; changelog records {result['changelog_records']:,} ({result['load']})"
        )


async def bench(args: argparse.Namespace, bootstrap: str, broker: KafkaCluster | None, workdir: Path) -> None:
    ctx = Context(args, bootstrap, broker, workdir)
    modes = ["burst", "paced"] if args.mode == "both" else [args.mode]
    runs: list[dict] = []
    takeovers: list[dict] = []
    workers: list[Worker] = []
    try:
        last_worker = None
        for i, mode in enumerate(modes):
            worker, figures = await run_mode(ctx, mode)
            if worker is not None:
                workers.append(worker)
            runs.append(figures)
            last_worker = worker
            if i < len(modes) - 1 and worker is not None:
                worker.stop()  # one worker at a time
        if args.takeover and last_worker is not None and runs[-1].get("pass1") is not None:
            # Kept first: it takes over the whole state the run left; then removed, from the
            # changelog alone (the kept one's data dir is removed).
            new, result = await takeover(ctx, last_worker, keep_data=True, number=1)
            workers.append(new)
            takeovers.append(result)
            new2, result2 = await takeover(ctx, new, keep_data=False, number=2)
            workers.append(new2)
            takeovers.append(result2)
        broker_counts = count_lines(ctx.broker_log(), BROKER_PATTERNS)
        print(f"broker log over the whole run: {fmt_counts(broker_counts) if broker else 'n/a (--bootstrap)'}")
        if broker is not None and any(broker_counts.values()):
            for line in ctx.broker_log().splitlines():
                if BROKER_PATTERNS["InvalidReceive"].search(line) or BROKER_PATTERNS["larger than"].search(line):
                    print("  | " + line[:400])
                    break
        summary(args, runs, takeovers)
    finally:
        for worker in workers:
            if worker is not None:
                worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--producers-per-partition", type=int, default=1000)
    parser.add_argument("--mode", choices=("burst", "paced", "both"), default="burst")
    parser.add_argument("--rate", type=float, default=20_000.0, help="paced: records/s")
    parser.add_argument("--takeover", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--bootstrap", default="", help="an existing broker (default: start Apache Kafka on a free port)"
    )
    parser.add_argument(
        "--broker-socket-request-max-bytes",
        type=int,
        default=None,
        help="the started broker's socket.request.max.bytes",
    )
    parser.add_argument("--value-size", type=int, default=10)
    parser.add_argument("--max-request-size", type=int, default=1 << 20, help="the bench producer's max_request_size")
    parser.add_argument(
        "--max-in-flight-bytes", type=int, default=16 << 20, help="the bench producer's unacknowledged bytes at most"
    )
    parser.add_argument("--stall-s", type=float, default=90.0, help="no committed progress this long: a stall")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds a pass may take to be committed")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--takeover-timeout", type=float, default=600.0)
    parser.add_argument("--probe-timeout", type=float, default=10.0, help="each web probe gives up after this")
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after ready before the empty baseline")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="more worker environment")
    parser.add_argument("--profile-takeover", action="store_true", help="py-spy on each takeover's new worker")
    parser.add_argument("--profile-passes", action="store_true", help="py-spy on the worker through each pass")
    parser.add_argument(
        "--app-source",
        choices=("head", "tree", "live"),
        default="head",
        help="the workers' kdiv: HEAD's app/ (default), a copy of the working tree's, or the working tree live",
    )
    parser.add_argument("--app-rev", default="HEAD", help="--app-source head: the commit whose app/ the workers run")
    parser.add_argument("--keep", action="store_true", help="keep the workers' data dirs and logs")
    args = parser.parse_args()

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="kdiv-bench-burst-"))
    broker = registry = None
    print(f"bench/burst.py {' '.join(sys.argv[1:])} ({load()}, {os.cpu_count()} cores), work dir {workdir}")
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            settings = {}
            if args.broker_socket_request_max_bytes:
                settings["socket.request.max.bytes"] = str(args.broker_socket_request_max_bytes)
            broker = KafkaCluster(port=0, settings=settings).start()
            bootstrap = broker.bootstrap
            print(f"broker: Apache Kafka on {bootstrap} {settings or ''}, log {broker.nodes[0].output_file}")
        args.app_dir, what = app_snapshot(args.app_source, workdir, args.app_rev)
        print(f"workers import kdiv from {args.app_dir}: {what}")
        if not os.environ.get("KDIV_SCHEMA_REGISTRY_URL"):
            registry = DevRegistryProcess(bootstrap).start()
            os.environ["KDIV_SCHEMA_REGISTRY_URL"] = registry.url
        asyncio.run(bench(args, bootstrap, broker, workdir))
    except BenchError as failure:
        sys.exit(f"bench failed: {failure}")
    except KeyboardInterrupt:
        sys.exit("interrupted")
    finally:
        for worker in STARTED:
            worker.stop()
        if registry is not None:
            registry.stop()
        if broker is not None:
            if args.keep:
                keep = workdir / "broker.log"
                for node in broker.nodes:
                    if node.output_file.exists():
                        shutil.copy(node.output_file, keep)
            broker.stop()
        if args.keep:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
