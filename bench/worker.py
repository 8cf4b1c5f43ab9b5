"""Live worker throughput: a kdiv worker validating a topic, against what else could read it.

    python bench/worker.py [--records N] [--producers P] [--partitions K] [--value-size B]
                           [--compacted] [--repeat 3] [--variants kdiv kdiv-audit faust-count]
                           [--trace-rate R] [--trace-partitions T] [--profile [VARIANT ...]]
                           [--bootstrap HOST:PORT]

One run: start Apache Kafka (kdiv.dev.broker, unless --bootstrap or KDIV_BOOTSTRAP names one), create a
topic (compacted with --compacted: the worker then keeps its key ledger too), write N
DIV-stamped records from P producers (P DivWriters sharing one aiokafka producer, keyed with
Kafka's partitioner or round robin; their END_OF_SEGMENTs at close), then, per round:

1. the limits: a bare aiokafka consumer (no group, every partition assigned, a getmany loop)
   reads every record of the topic, and so does a bare confluent-kafka (librdkafka) consumer
   (consume() in batches of 10 000); best of --runs each. Ratios are to aiokafka's, which the
   worker uses, and the summary gives kdiv's ratio to librdkafka's too;
2. each --variants entry in a subprocess with a fresh app id and data dir, timed until its
   consumer group (group id = app id) has committed the end offset of every partition
   (AIOKafkaAdminClient.list_consumer_group_offsets every --poll-s):
     kdiv         the product: `faust -A kdiv.worker.main worker`, tables on. It must report
                  no incident, or the figure measures a fault path;
     kdiv-audit   the product with the pipeline audit on (docs/pipeline-audit.md): the
                  topic is the source of a route, KDIV_ROUTES="bench=<topic>><group>><sink>",
                  and every data record carries a trace (the writers trace 100%: DivWriter's
                  tracing="*=1"; --trace-rate R traces a share R instead, the writers'
                  sampling). Each traced record is validated and is an observation, sent to
                  <app id>-trace-observations (--trace-partitions, KDIV_TRACE_PARTITIONS)
                  before its offset commits, consumed back by the same worker and judged into
                  its `traces` table. Done when the group has committed the end of the topic
                  AND of the observations topic (its ends are read once the topic is
                  committed: every observation was acknowledged before that commit). The
                  route's group is one nobody joins and its sink an empty topic, so no trace
                  resolves: every trace stays open (pending: lag, not loss) and costs no
                  incident (UNRESOLVED only after KDIV_TRACE_MAX_WAIT_S, 6 h). That is the
                  audit's worst case for the judge: every open trace is looked at on every
                  flush. It must report no incident either;
     faust-count  what a user would write instead: a plain Faust agent whose RocksDB table
                  counts records per key (`faust -A bench.worker:app`).

With kdiv-audit among the variants (or profiled) every variant reads the same traced topic,
so kdiv-audit/kdiv is the audit's cost on identical records (the trace header adds 37 bytes
to each traced record, for every variant).

--repeat rounds (default 3) interleave the variants, and the summary gives medians: on a
shared machine single runs vary by tens of percent. With --profile [VARIANT ...], one more
run per variant (default kdiv) with py-spy attached from the moment its group is Stable to
the moment it is done; the top costs are printed (pip install py-spy).

Startup (imports, discovery, Faust's bootstrap, topic creation, the group join, which Tansu
holds for session_timeout/2) is not validation. It is measured in the same run: every poll
asks the broker (DescribeGroups) for the group's state, and the worker is "ready" when the
group is Stable with a member. Figures per worker run:

- startup: process start -> group Stable;
- end-to-end: records / (process start -> all committed);
- after ready: records / (group Stable -> all committed); includes the worker's table
  recovery and the last commit's lag (up to KDIV_COMMIT_INTERVAL_S). The ratio uses it;
- commit slope: the slope of the committed-offset curve between the first and the last commit
  seen strictly between 0 and the end. Not the validation rate: a commit that takes long
  while validation goes on (seen with kdiv on the embedded broker) makes it far too high.
- kdiv-audit: observations/s = traced records judged / (group Stable -> all committed),
  its ratio to kdiv's after-ready rate (the validation rate) and to bare in the same round,
  the observations' tail (topic committed -> observations committed: the last observations'
  fetch, judge and commit; the rate before it is records / (ready -> topic committed)) and the
  `traces` table's changelog records;
- CPU: the worker's and the broker's CPU time over (ready, done) as a share of one core (a
  worker near 100% is CPU-bound: the GIL), and "others": what the machine spent on processes
  this bench did not start; well above 0 means the run shared the cores and its figure is low.

A fast worker gets through 200 000 records within a few seconds, so the fixed part of "after
ready" (recovery, the last commit) weighs: give it more --records (1 000 000). RSS is the
worker's peak resident memory (VmHWM). Workers log at info (KDIV_BENCH_LOG_LEVEL), as the docker
image runs them: at warn Faust's terminal spinner makes every debug call of aiokafka and Faust
build a LogRecord.

The figure to watch is the ratio kdiv/bare (and kdiv-audit/kdiv for the audit); absolute
records/s depend on the machine (the broker, the bench and the worker share its cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402

from kdiv.dev.broker import KafkaCluster  # noqa: E402
from kdiv.dev.demo import ensure_topic  # noqa: E402
from kdiv.dev.registry.process import DevRegistryProcess  # noqa: E402
from kdiv.kafka.consume import read_snapshot  # noqa: E402
from kdiv.kafka.tansu import detect_tansu, end_offsets  # noqa: E402
from kdiv.trace.sampling import Sampler, SamplingSpec  # noqa: E402
from kdiv.worker.incidents import Incident  # noqa: E402
from kdiv.writer import DivWriter  # noqa: E402

BIN = Path(sys.executable).parent
VARIANTS = ("kdiv", "kdiv-audit", "faust-count")
# kdiv-audit: the route whose source is the bench topic (docs/pipeline-audit.md).
AUDIT_ROUTE = "bench"


class BenchError(RuntimeError):
    pass


# -- the topic --------------------------------------------------------------------------------


async def produce(
    bootstrap: str, topic: str, args: argparse.Namespace, trace_rate: float | None = None
) -> tuple[float, int]:
    """Write args.records DIV-stamped data records from args.producers writers, a share
    `trace_rate` of them with a trace header; returns (seconds, records traced)."""
    rng = random.Random(7)
    draws = random.Random(11)
    traced = 0

    def draw() -> float:
        # The writers' sampling draw (only asked when 0 < rate < 1), counting the records traced.
        nonlocal traced
        value = draws.random()
        traced += value < (trace_rate or 0)
        return value

    sampler = None if trace_rate is None else Sampler(SamplingSpec.parse(f"*={trace_rate!r}"), draw=draw)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        writers = [
            DivWriter(producer, max_records_per_segment=args.segment_records, tracing=sampler)
            for _ in range(args.producers)
        ]
        await writers[0].partitions(topic)  # metadata for the topic before the clock starts
        start = time.perf_counter()
        for i in range(args.records):
            writer = writers[i % args.producers]
            key = b"key-%08d" % rng.randrange(1 << 20) if args.keys == "random" else None
            await writer.send(topic, rng.randbytes(args.value_size), key=key)
        for writer in writers:
            await writer.close()  # END_OF_SEGMENT everywhere, then flush: all acknowledged
        if trace_rate is not None and trace_rate >= 1:
            traced = args.records  # no draw at 100%
        return time.perf_counter() - start, traced
    finally:
        await producer.stop()


DAY_MS = 24 * 3600 * 1000


async def incident_classes(bootstrap: str, topic: str) -> dict[str, tuple[int, str]]:
    """Class -> (count, one example's detail) of the incidents on `topic`."""
    found: dict[str, tuple[int, str]] = {}
    async for record in read_snapshot(bootstrap, topic):
        if record.value is None:
            continue
        incident = Incident.from_value(record.value)
        count, example = found.get(incident.verdict, (0, ""))
        where = f"{incident.topic}[{incident.partition}]@{incident.offset}: {incident.detail}"
        found[incident.verdict] = (count + 1, example or where)
    return found


async def topic_sizes(
    bootstrap: str, topics: dict[str, int | None], tansu: bool
) -> dict[str, dict[TopicPartition, int]]:
    """Exact end offsets of each topic (partition count, or None: as the broker reports them)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = {}
        for topic, count in topics.items():
            if count is None:
                await consumer._client.force_metadata_update()
                found = consumer.partitions_for_topic(topic)
                if not found:
                    continue
                partitions = sorted(found)
            else:
                partitions = list(range(count))
            ends[topic] = await end_offsets(consumer, [TopicPartition(topic, p) for p in partitions], tansu=tansu)
        return ends
    finally:
        await asyncio.sleep(0.1)  # aiokafka: stop() right after start() may raise CancelledError
        await consumer.stop()


# -- the baseline -----------------------------------------------------------------------------


async def bare_consume(bootstrap: str, ends: dict[TopicPartition, int]) -> float:
    """Seconds for a group-less aiokafka consumer to read every partition up to `ends`.

    Done by position, not by a count of records: compaction may have removed some."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(list(ends))
        await consumer.seek_to_beginning(*ends)
        start = time.perf_counter()
        remaining = {tp for tp, end in ends.items() if end > 0}
        while remaining:
            await consumer.getmany(timeout_ms=1000)
            remaining = {tp for tp in remaining if await consumer.position(tp) < ends[tp]}
        return time.perf_counter() - start
    finally:
        await consumer.stop()


def bare_librdkafka_consume(bootstrap: str, ends: dict[TopicPartition, int]) -> float:
    """Seconds for a group-less confluent-kafka (librdkafka) consumer to read every record up
    to `ends`: the C client's limit, in batches of consume() as a fast Python reader would."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as LibrdkafkaPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kdiv-bench-bare-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([LibrdkafkaPartition(tp.topic, tp.partition, 0) for tp in ends])
        start = time.perf_counter()
        remaining = {(tp.topic, tp.partition): end for tp, end in ends.items() if end > 0}
        while remaining:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                offset = message.offset()
                # Done by offset, not by a count: compaction may have removed records.
                if (
                    not message.error()
                    and offset is not None
                    and offset + 1 >= remaining.get(key := (message.topic(), message.partition()), 0)
                ):
                    remaining.pop(key, None)
        return time.perf_counter() - start
    finally:
        consumer.close()


# -- CPU accounting ---------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set (VmHWM), Linux /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def machine_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores, from /proc/stat."""
    try:
        # user nice system idle iowait irq softirq steal (guest time is already in user/nice)
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


@dataclass
class CpuSample:
    at: float
    worker: float | None
    broker: float | None
    bench: float
    machine: tuple[int, int] | None

    @classmethod
    def take(cls, worker_pid: int | None, broker_pid: int | None) -> CpuSample:
        own = os.times()
        return cls(
            time.monotonic(), process_cpu_s(worker_pid), process_cpu_s(broker_pid), own.user + own.system, machine_cpu()
        )


def cpu_shares(start: CpuSample, end: CpuSample) -> str:
    """CPU used over (start, end) as % of one core; "others" is what this bench did not start:
    well above 0 means other work shared the machine and the figure is low."""
    wall = end.at - start.at
    if wall <= 0:
        return "n/a"
    parts = []
    used = end.bench - start.bench
    for name, a, b in (("worker", start.worker, end.worker), ("broker", start.broker, end.broker)):
        if a is not None and b is not None:
            parts.append(f"{name} {100 * (b - a) / wall:.0f}%")
            used += b - a
    if start.machine and end.machine and end.machine[1] > start.machine[1]:
        cores = os.cpu_count() or 1
        busy_s = (end.machine[0] - start.machine[0]) / (end.machine[1] - start.machine[1]) * wall * cores
        parts.append(f"others {100 * max(busy_s - used, 0) / wall:.0f}% (of {cores} cores x 100%)")
    return ", ".join(parts)


# -- the worker -------------------------------------------------------------------------------


class Batch(NamedTuple):
    """KDIV_BATCH_MAX of a run: records validated at most between two state writes."""

    max: int

    def __str__(self) -> str:
        return f"batch max {self.max}"


@dataclass
class WorkerRun:
    variant: str
    batch: Batch
    app_id: str
    records: int
    spawned: float
    ready: float | None = None
    done: float | None = None
    # (seconds since spawn, committed records) at each change of the committed total
    curve: list[tuple[float, int]] = field(default_factory=list)
    cpu: str = ""
    incidents: int = 0
    # What the incidents were: class -> (count, one detail), to tell a fault path from a bug.
    incident_classes: dict[str, tuple[int, str]] = field(default_factory=dict)
    state_writes: int = 0
    rss_bytes: int | None = None
    profile: Path | None = None
    # kdiv-audit: the observations judged (the observations topic's records), when the
    # watched topic was all committed, and the `traces` table's changelog records.
    traced: int = 0
    observations: int = 0
    source_done: float | None = None
    trace_writes: int = 0

    @property
    def ready_at(self) -> float:
        assert self.ready is not None, "the group was seen Stable"
        return self.ready

    @property
    def done_at(self) -> float:
        assert self.done is not None, "the run was done"
        return self.done

    @property
    def startup_s(self) -> float:
        return self.ready_at - self.spawned

    @property
    def end_to_end_rate(self) -> float:
        return self.records / (self.done_at - self.spawned)

    @property
    def after_ready_rate(self) -> float:
        return self.records / max(self.done_at - self.ready_at, 1e-9)

    @property
    def observation_rate(self) -> float:
        """Observations judged per second after ready (kdiv-audit)."""
        return self.observations / max(self.done_at - self.ready_at, 1e-9)

    @property
    def source_rate(self) -> float | None:
        """Records / (group Stable -> the watched topic all committed): kdiv-audit without the
        observations' tail."""
        if self.source_done is None:
            return None
        return self.records / max(self.source_done - self.ready_at, 1e-9)

    @property
    def observations_tail_s(self) -> float | None:
        """Watched topic all committed -> observations all committed (kdiv-audit)."""
        return None if self.source_done is None else self.done_at - self.source_done

    @property
    def steady_rate(self) -> float | None:
        inside = [(t, c) for t, c in self.curve if 0 < c < self.records]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            (t0, c0), (t1, c1) = inside[0], inside[-1]
        elif inside:
            # Too few commits inside the run: from the first commit to completion instead.
            (t0, c0), (t1, c1) = inside[0], (self.done_at - self.spawned, self.records)
        else:
            return None
        return (c1 - c0) / (t1 - t0)


def audit_routes(topic: str, sink: str, app_id: str) -> str:
    """KDIV_ROUTES of kdiv-audit: the bench topic is the source of a one-hop route whose group
    nobody joins (it never commits, so every trace is pending: lag, not loss) and whose sink
    is an empty topic."""
    return f"{AUDIT_ROUTE}={topic}>{app_id}-idle-processor>{sink}"


def worker_env(
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    app_id: str,
    data_dir: Path,
    batch: Batch,
    variant: str,
    sink: str | None = None,
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        KDIV_BOOTSTRAP=bootstrap,
        KDIV_TOPICS=topic,
        KDIV_APP_ID=app_id,
        KDIV_DATA_DIR=str(data_dir),
        KDIV_WEB_ENABLED="false",
        KDIV_BATCH_MAX=str(batch.max),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    for name in list(env):
        # The pipeline audit is kdiv-audit's alone, configured below.
        if name == "KDIV_ROUTES" or name.startswith("KDIV_TRACE_"):
            del env[name]
    if variant == "kdiv-audit":
        if sink is None:
            raise BenchError("kdiv-audit needs the route's sink topic")
        env["KDIV_ROUTES"] = audit_routes(topic, sink, app_id)
        env["KDIV_TRACE_PARTITIONS"] = str(args.trace_partitions)
        env["KDIV_TRACE_SAMPLING"] = f"*={args.trace_rate!r}"
    env.pop("KDIV_TOPIC_PATTERN", None)
    if args.commit_interval_s is not None:
        env["KDIV_COMMIT_INTERVAL_S"] = str(args.commit_interval_s)
    env["KDIV_BENCH_PARTITIONS"] = str(args.partitions)
    return env


def stop_process_group(process: subprocess.Popen, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Signal the process group we started (its leader is `process`), then SIGKILL what is left."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
            process.wait(grace_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
    try:  # the leader may be gone while children of its group remain
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


async def group_state(admin: AIOKafkaAdminClient, group_id: str) -> tuple[str, int]:
    """(state, member count) of a consumer group, from DescribeGroups."""
    for response in await admin.describe_consumer_groups([group_id]):
        for group in response.groups:
            # error_code, group_id, state, protocol_type, protocol, members[, authorized ops]
            _error, gid, state, _ptype, _protocol, members, *_ = group
            if gid == group_id:
                return state, len(members)
    return "", 0


async def run_worker(
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    ends: dict[TopicPartition, int],
    batch: Batch,
    workdir: Path,
    tansu: bool,
    broker_pid: int | None,
    variant: str = "kdiv",
    profile: bool = False,
    sink: str | None = None,
    traced: int = 0,
) -> WorkerRun:
    tag = re.sub(r"[^a-z0-9]+", "-", variant)
    app_id = f"kdiv-bench-{uuid.uuid4().hex[:8]}-{tag}-b{batch.max}{'-prof' if profile else ''}"
    rundir = workdir / app_id
    data_dir = rundir / "data"
    rundir.mkdir(parents=True)
    log_path = rundir / "worker.log"
    profile_path = rundir / "py-spy.txt"
    spy_log = rundir / "py-spy.log"
    total = sum(ends.values())
    app_arg = "bench.worker:app" if variant == "faust-count" else "kdiv.worker.main"
    audit = variant == "kdiv-audit"
    observations_topic = f"{app_id}-trace-observations"
    # `faust worker` sets web_enabled from its own --with-web/--without-web flag (default:
    # with), over the app's KDIV_WEB_ENABLED=false: without it every worker binds port 6066.
    # The log level is the docker image's (info). At warn or above Faust's worker keeps its
    # terminal spinner and sets the root logger to DEBUG for it, so every debug call of aiokafka
    # and Faust builds a LogRecord: a tenth of kdiv-audit's time, one per message sent.
    command = [
        str(BIN / "faust"),
        "-A",
        app_arg,
        "worker",
        "-l",
        os.environ.get("KDIV_BENCH_LOG_LEVEL", "info"),
        "--without-web",
    ]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-bench-monitor")
    await admin.start()
    process: subprocess.Popen | None = None
    spy: subprocess.Popen | None = None
    try:
        with open(log_path, "wb") as log:
            spawned = time.monotonic()
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=worker_env(args, bootstrap, topic, app_id, data_dir, batch, variant, sink),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole below
            )
        run = WorkerRun(variant, batch, app_id, total, spawned)
        if audit:
            run.traced = traced
        deadline = spawned + args.timeout
        cpu_start = None
        last = -1
        # kdiv-audit: the observations topic's end offsets, once the watched topic is committed.
        observation_ends: dict[TopicPartition, int] = {}
        while True:
            if process.poll() is not None:
                raise BenchError(
                    f"the worker ({app_id}) exited with code {process.returncode} before it was done; "
                    f"its log ({log_path}) ends:\n{tail(log_path)}"
                )
            if time.monotonic() > deadline:
                behind = ""
                if run.source_done is not None:
                    behind = f" and all of them, but not the {run.observations} observations"
                raise BenchError(
                    f"the worker ({app_id}) had committed {max(last, 0)} of {total} records{behind} "
                    f"{args.timeout:.0f} s after its start (--timeout); its log ({log_path}) ends:\n{tail(log_path)}"
                )
            if run.ready is None:
                state, members = await group_state(admin, app_id)
                if state == "Stable" and members:
                    run.ready = time.monotonic()
                    cpu_start = CpuSample.take(process.pid, broker_pid)
                    if profile:
                        spy = start_py_spy(process.pid, profile_path, spy_log, args.profile_rate)
            committed = await admin.list_consumer_group_offsets(app_id, partitions=[*ends, *observation_ends])
            positions = {tp: meta.offset for tp, meta in committed.items() if meta is not None and meta.offset >= 0}
            done = sum(min(positions.get(tp, 0), end) for tp, end in ends.items())
            if done != last:
                run.curve.append((time.monotonic() - spawned, done))
                last = done
            if done >= total and audit and run.source_done is None:
                run.source_done = time.monotonic()
                # Observations are acknowledged before their records' offsets commit: the
                # observations topic is complete now.
                found = await topic_sizes(bootstrap, {observations_topic: args.trace_partitions}, tansu)
                observation_ends = found[observations_topic]
                run.observations = sum(observation_ends.values())
                continue  # poll their committed offsets at once
            judged = all(positions.get(tp, 0) >= end for tp, end in observation_ends.items())
            if done >= total and judged:
                run.done = time.monotonic()
                break
            await asyncio.sleep(args.poll_s)
        cpu_end = CpuSample.take(process.pid, broker_pid)
        run.rss_bytes = peak_rss_bytes(process.pid)
        if run.ready is None:  # finished between two polls
            run.ready = run.done
        elif cpu_start is not None:
            run.cpu = cpu_shares(cpu_start, cpu_end)
        if spy is not None:
            stop_py_spy(spy, spy_log)
            run.profile = profile_path
        incidents = f"{app_id}-incidents"
        changelogs = [f"{app_id}-{name}-p{len(ends)}-changelog" for name in ("state", "keys")]
        if variant == "faust-count":
            changelogs = [f"{app_id}-counts-changelog"]
        traces = f"{app_id}-traces-changelog"
        sizes = await topic_sizes(bootstrap, dict.fromkeys([incidents, *changelogs, traces]), tansu)
        run.incidents = sum(sizes.get(incidents, {}).values())
        if run.incidents:
            run.incident_classes = await incident_classes(bootstrap, incidents)
        run.state_writes = sum(sum(sizes.get(changelog, {}).values()) for changelog in changelogs)
        run.trace_writes = sum(sizes.get(traces, {}).values())
        return run
    finally:
        if spy is not None and spy.poll() is None:
            stop_process_group(spy, sig=signal.SIGINT)
        if process is not None:
            stop_process_group(process)
        await admin.close()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


# -- the plain Faust agent: loaded in the worker process by `faust -A bench.worker:app` --------


def __getattr__(name: str):
    # PEP 562: only the faust-count worker subprocess asks this module for `app`.
    if name == "app":
        return counting_app()
    raise AttributeError(name)


def counting_app():
    """A plain Faust app: one agent, one RocksDB table counting records per key."""
    import faust

    topic_name = os.environ["KDIV_TOPICS"]
    app = faust.App(
        os.environ["KDIV_APP_ID"],
        broker=";".join(f"kafka://{host}" for host in os.environ["KDIV_BOOTSTRAP"].split(",")),
        store="rocksdb://",
        datadir=os.environ["KDIV_DATA_DIR"],
        broker_commit_interval=float(os.environ.get("KDIV_COMMIT_INTERVAL_S", "1.0")),
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        autodiscover=False,
    )
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes)
    counts = app.Table("counts", default=int, partitions=int(os.environ["KDIV_BENCH_PARTITIONS"]), value_type=int)

    @app.agent(topic)
    async def count(stream):
        async for key, _value in stream.items():
            counts[key] += 1

    return app


def start_py_spy(pid: int, out: Path, log: Path, rate: int) -> subprocess.Popen:
    py_spy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if py_spy is None:
        raise BenchError("--profile needs py-spy: pip install py-spy (into this venv)")
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--threads",
                # Only the thread holding the GIL: the consumer thread and the event loop
                # share one interpreter, and a thread waiting for the GIL costs nothing.
                "--gil",
                "--nonblocking",
                "--output",
                str(out),
            ],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_py_spy(spy: subprocess.Popen, log: Path) -> None:
    """SIGINT makes py-spy stop sampling and write its output."""
    os.killpg(spy.pid, signal.SIGINT)
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        stop_process_group(spy, grace_s=0)
        raise BenchError(f"py-spy did not stop; its log ends:\n{tail(log)}") from None


# Where a sample's time goes: the deepest frame (leaf first) whose file matches.
CATEGORIES = [
    ("kdiv validation core (kdiv/div)", re.compile(r"/kdiv/div/")),
    ("kdiv pipeline audit: judge, routes, headers (kdiv/trace)", re.compile(r"/kdiv/trace/")),
    ("kdiv pipeline audit: observations in and out (kdiv/worker/audit.py)", re.compile(r"/kdiv/worker/audit\.py")),
    ("kdiv live state (kdiv/worker/live.py)", re.compile(r"/kdiv/worker/live\.py")),
    ("kdiv worker glue (the rest of kdiv/worker)", re.compile(r"/kdiv/worker/")),
    ("RocksDB store (faust/stores, rocksdict)", re.compile(r"faust/stores/|rocksdict")),
    ("Faust tables (faust/tables)", re.compile(r"faust/tables/")),
    ("aiokafka producer (changelog sends)", re.compile(r"aiokafka/producer/")),
    ("aiokafka fetcher + record parsing (consumer thread)", re.compile(r"aiokafka/(consumer|record)/")),
    (
        "Faust consumer loop (drain, offsets, acks, commit)",
        re.compile(r"faust/transport/consumer\.py|faust/transport/drivers/"),
    ),
    (
        "Faust producer buffer / conductor / topics",
        re.compile(r"faust/transport/(producer|conductor)\.py|faust/topics\.py"),
    ),
    ("Faust streams, events, channels, agents", re.compile(r"faust/(streams|events|channels|agents/)")),
    ("Faust other", re.compile(r"/faust/")),
    ("mode (wait_first, events, queues, threads)", re.compile(r"/mode/")),
    ("aiokafka other (client, conn, protocol)", re.compile(r"aiokafka/")),
    ("logging (debug calls below the level)", re.compile(r"logging/")),
    ("asyncio (tasks, futures, event loop)", re.compile(r"asyncio/|selectors\.py")),
]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _frame(frame: str) -> tuple[str, str]:
    """(function, short file) of one py-spy frame "func (path:line)"."""
    match = _FRAME.match(frame)
    if not match:
        return frame, ""
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3.11/", "/lib/python3.12/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return match["func"], path


def summarize_profile(path: Path, top: int) -> list[str]:
    samples: list[tuple[str, list[tuple[str, str]], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread_name, *frame_texts = stack.split(";")
        samples.append((thread_name, [_frame(f) for f in frame_texts], int(count)))
    total = sum(n for *_, n in samples)
    if not total:
        return ["py-spy collected no samples"]
    by_thread: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    for thread, frames, n in samples:
        by_thread[re.sub(r"\(\d+\)|\(0x[0-9a-f]+\)", "", thread).strip()] += n
        if frames:
            func, file = frames[-1]
            self_time[f"{func} ({file})"] += n
        for key in {f"{func} ({file})" for func, file in frames}:
            inclusive[key] += n
        for _func, file in reversed(frames):
            name = next((name for name, pattern in CATEGORIES if pattern.search("/" + file)), None)
            if name is not None:
                categories[name] += n
                break
        else:
            categories["other"] += n

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    out = [
        f"py-spy samples: {total} (threads on CPU; py-spy cuts coroutine stacks at the task, so a"
        " frame's inclusive share undercounts its callers)"
    ]
    out.append("by thread:")
    out += [f"  {pct(n)}  {name}" for name, n in by_thread.most_common(6)]
    out.append("by category (the deepest frame of each sample that falls in one):")
    out += [f"  {pct(n)}  {name}" for name, n in categories.most_common()]
    out.append(f"top {top} by self time:")
    out += [f"  {pct(n)}  {name}" for name, n in self_time.most_common(top)]
    out.append(f"top {top} by inclusive time (the event loop's and CLI's frames left out):")
    boring = re.compile(r"\((asyncio/|click/|faust/cli/|mode/worker\.py|mode/threads\.py|faust\)|threading\.py)")
    out += [
        f"  {pct(n)}  {name}" for name, n in [(k, v) for k, v in inclusive.most_common() if not boring.search(k)][:top]
    ]
    return out


# -- main -------------------------------------------------------------------------------------


def fmt_bytes(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**20:,.0f} MiB"


def fmt_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f} records/s"


def report(run: WorkerRun, bare_rate: float, verbose: bool, kdiv_rate: float | None = None) -> None:
    rate = run.after_ready_rate
    print(f"  {run.variant} ({run.batch}): after ready {fmt_rate(rate)}, ratio to bare {rate / bare_rate:.3f}")
    if run.variant == "kdiv-audit":
        to_kdiv = "" if kdiv_rate is None else f", ratio to kdiv {run.observation_rate / kdiv_rate:.3f}"
        tail_s = run.observations_tail_s
        print(
            f"      observations {run.observations}: {run.observation_rate:,.0f} observations/s after ready{to_kdiv}, "
            f"to bare {run.observation_rate / bare_rate:.3f} | observations tail "
            f"{'n/a' if tail_s is None else f'{tail_s:.1f} s'} (before it: {fmt_rate(run.source_rate)}) | "
            f"traces table writes {run.trace_writes} "
            f"({run.trace_writes / max(run.observations, 1):.3f}/observation)"
        )
        if run.observations != run.traced:
            print(
                f"      WARNING: {run.observations} observations for {run.traced} traced records: "
                "not one observation per traced record"
            )
    print(
        f"      startup {run.startup_s:.1f} s | commit slope {fmt_rate(run.steady_rate)} | end-to-end {fmt_rate(run.end_to_end_rate)} | "
        f"state writes {run.state_writes} ({run.state_writes / run.records:.3f}/record) | "
        f"incidents {run.incidents} | CPU {run.cpu} | RSS {fmt_bytes(run.rss_bytes)}"
    )
    if verbose:
        print("      committed (s since start: records):", ", ".join(f"{t:.1f}: {c}" for t, c in run.curve))
    if run.incidents:
        print(f"      WARNING: the worker reported {run.incidents} incidents: this figure measures a fault path")
        for verdict, (count, detail) in sorted(run.incident_classes.items()):
            print(f"        {verdict}: {count}, e.g. {detail}")


async def bench(args: argparse.Namespace, bootstrap: str, workdir: Path, broker_pid: int | None) -> None:
    tansu = await detect_tansu(bootstrap)
    topic = f"kdiv-bench-{uuid.uuid4().hex[:8]}"
    # Compacted with a day's lag (the worker reads it from the topic): the key ledger is kept,
    # and the broker's cleaner leaves the records alone while the variants read them.
    config = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(DAY_MS)} if args.compacted else None
    await ensure_topic(bootstrap, topic, args.partitions, config=config)
    audit = "kdiv-audit" in args.variants or "kdiv-audit" in (args.profile or ())
    sink = None
    if audit:
        # The route's sink: it must exist (the worker waits for its route topics), and stays empty.
        sink = f"{topic}-sink"
        await ensure_topic(bootstrap, sink, args.partitions)
    produce_s, traced = await produce(bootstrap, topic, args, trace_rate=args.trace_rate if audit else None)
    ends = (await topic_sizes(bootstrap, {topic: args.partitions}, tansu))[topic]
    total = sum(ends.values())
    where = "a kdiv-started Apache Kafka" if broker_pid is not None else f"{bootstrap}{' (Tansu)' if tansu else ''}"
    print(
        f"records: {args.records} data + {total - args.records} control = {total} on {topic}, producers: "
        f"{args.producers}, partitions: {args.partitions}, value bytes: {args.value_size}, keys: {args.keys}, "
        f"broker: {where}"
    )
    tracing = f", {traced} data records traced (*={args.trace_rate!r})" if audit else ""
    print(f"produced in {produce_s:.1f} s ({args.records / produce_s:,.0f} records/s through DivWriter{tracing})")
    if audit:
        print(
            f"kdiv-audit: KDIV_ROUTES={audit_routes(topic, str(sink), '<app id>')}, "
            f"KDIV_TRACE_PARTITIONS={args.trace_partitions}; the route's group never commits: every trace pending"
        )
    configs = [("kdiv", batch) for batch in args.batch if "kdiv" in args.variants]
    configs += [(variant, args.batch[0]) for variant in args.variants if variant != "kdiv"]
    results: dict[tuple[str, Batch], list[WorkerRun]] = {config: [] for config in configs}
    bare_rates: list[float] = []
    librdkafka_rates: list[float] = []
    for round_ in range(args.repeat):
        # Rounds interleave the configurations, so a busy spell of the machine hits them alike.
        bare_s = min([await bare_consume(bootstrap, ends) for _ in range(args.runs)])
        bare_rates.append(total / bare_s)
        librdkafka_s = min([bare_librdkafka_consume(bootstrap, ends) for _ in range(args.runs)])
        librdkafka_rates.append(total / librdkafka_s)
        round_note = f", round {round_ + 1} of {args.repeat}" if args.repeat > 1 else ""
        print(
            f"bare aiokafka consumer (no group, getmany, best of {args.runs}{round_note}): {fmt_rate(bare_rates[-1])}; "
            f"bare confluent-kafka (librdkafka) consumer (consume() batches): {fmt_rate(librdkafka_rates[-1])}"
        )
        if round_ == 0:
            print(
                "worker runs (tables on). after ready: group Stable (DescribeGroups) -> all committed; startup: "
                "process start -> group Stable; commit slope: committed offsets between the first and last commit "
                "inside the run; CPU over (ready, done), % of one core:"
            )
        kdiv_rate = None  # this round's kdiv validation rate, at the batch setting kdiv-audit runs with
        for variant, batch in configs:
            run = await run_worker(
                args, bootstrap, topic, ends, batch, workdir, tansu, broker_pid, variant, sink=sink, traced=traced
            )
            results[(variant, batch)].append(run)
            if variant == "kdiv" and batch == args.batch[0]:
                kdiv_rate = run.after_ready_rate
            report(run, bare_rates[-1], args.verbose, kdiv_rate)
    bare_rate = statistics.median(bare_rates)
    librdkafka_rate = statistics.median(librdkafka_rates)

    def rate_of(run: WorkerRun) -> float:
        return run.after_ready_rate

    kdiv_results = [
        (config, statistics.median(map(rate_of, runs))) for config, runs in results.items() if config[0] == "kdiv"
    ]
    if kdiv_results:
        (_, best_batch), best_rate = max(kdiv_results, key=lambda item: item[1])
        ratio = best_rate / bare_rate
        setting = f" (best batch setting: {best_batch})" if len(kdiv_results) > 1 else ""
        goal = 0.4 if args.compacted else 0.6
        print(f"kdiv/bare ratio{setting}: {ratio:.3f}; goal >= {goal}: {'met' if ratio >= goal else 'NOT met'}")
        print(
            f"kdiv/bare confluent-kafka ratio: {best_rate / librdkafka_rate:.3f} "
            f"(librdkafka {fmt_rate(librdkafka_rate)}, aiokafka {fmt_rate(bare_rate)}: "
            f"{bare_rate / librdkafka_rate:.3f} of it)"
        )
    if len(configs) > 1 or args.repeat > 1:
        spread = f"median of {args.repeat} rounds, [min-max]; " if args.repeat > 1 else ""
        print(f"summary (bare aiokafka consumer: {fmt_rate(bare_rate)}; {spread}rate = after ready):")
        for (variant, batch), runs in results.items():
            rates = sorted(map(rate_of, runs))
            rate = statistics.median(rates)
            span = f"  [{rates[0]:,.0f}-{rates[-1]:,.0f}]" if len(rates) > 1 else ""
            writes = statistics.median(run.state_writes / run.records for run in runs)
            startup = statistics.median(run.startup_s for run in runs)
            print(
                f"  {variant + ' (' + str(batch) + ')':<36} {rate:>10,.0f} records/s  "
                f"ratio {rate / bare_rate:.3f}{span}  startup {startup:.1f} s  state writes/record {writes:.3f}"
            )
    audit_runs = results.get(("kdiv-audit", args.batch[0]), [])
    if audit_runs:
        observed = sorted(run.observation_rate for run in audit_runs)
        observed_rate = statistics.median(observed)
        span = f" [{observed[0]:,.0f}-{observed[-1]:,.0f}]" if len(observed) > 1 else ""
        tails = [run.observations_tail_s for run in audit_runs if run.observations_tail_s is not None]
        tail_text = f"; observations tail {statistics.median(tails):.1f} s" if tails else ""
        print(
            f"kdiv-audit: {observed_rate:,.0f} observations/s through the live audit{span} (median), "
            f"ratio to bare {observed_rate / bare_rate:.3f}{tail_text}"
        )
        kdiv_runs = results.get(("kdiv", args.batch[0]), [])
        if kdiv_runs:
            # Paired by round: both ran within a minute of each other, on the same records.
            kdiv_median = statistics.median(map(rate_of, kdiv_runs))
            for what, audit_rates, audit_median in (
                ("observations/s", [run.observation_rate for run in audit_runs], observed_rate),
                (
                    "records/s",
                    [run.after_ready_rate for run in audit_runs],
                    statistics.median(map(rate_of, audit_runs)),
                ),
            ):
                pairs = [rate / k.after_ready_rate for rate, k in zip(audit_rates, kdiv_runs, strict=True)]
                print(
                    f"kdiv-audit {what} / kdiv validation rate (records/s): {statistics.median(pairs):.3f} "
                    f"(median of the rounds' ratios: {', '.join(f'{r:.3f}' for r in pairs)}; "
                    f"ratio of the medians: {audit_median / kdiv_median:.3f})"
                )
    for variant in args.profile or ():
        batch = args.batch[0]
        print(
            f"profile: py-spy ({args.profile_rate} Hz) on one more {variant} run ({batch}), "
            "from group Stable to all committed"
        )
        run = await run_worker(
            args,
            bootstrap,
            topic,
            ends,
            batch,
            workdir,
            tansu,
            broker_pid,
            variant,
            profile=True,
            sink=sink,
            traced=traced,
        )
        observed_note = f" ({run.observation_rate:,.0f} observations/s)" if variant == "kdiv-audit" else ""
        print(
            f"  under the profiler: {fmt_rate(run.after_ready_rate)}{observed_note}; CPU {run.cpu}; "
            f"raw stacks: {run.profile}"
        )
        for line in summarize_profile(run.profile, args.top) if run.profile else ():
            print("  " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument(
        "--keys",
        choices=("random", "none"),
        default="random",
        help="random keys (Kafka's partitioner) or none (DivWriter's round robin)",
    )
    parser.add_argument("--segment-records", type=int, default=-1, help="DivWriter max_records_per_segment")
    parser.add_argument("--runs", type=int, default=3, help="bare consumer runs (best of)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of bare + every worker run; the summary gives medians (for a shared machine)",
    )
    parser.add_argument(
        "--batch-max",
        nargs="+",
        type=int,
        default=[100_000],
        metavar="MAX",
        help="KDIV_BATCH_MAX values, one kdiv run each; other variants and profiles use the first",
    )
    parser.add_argument(
        "--commit-interval-s", type=float, default=None, help="KDIV_COMMIT_INTERVAL_S (default: the worker's)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=VARIANTS,
        help="workers to run (see the module doc); kdiv runs once per --batch-max, the others at the first",
    )
    parser.add_argument(
        "--trace-partitions",
        type=int,
        default=4,
        help="kdiv-audit: partitions of the observations topic (KDIV_TRACE_PARTITIONS; the worker's default 4)",
    )
    parser.add_argument(
        "--trace-rate",
        type=float,
        default=1.0,
        help="kdiv-audit: the share of data records the writers trace (default 1: every record)",
    )
    parser.add_argument(
        "--compacted",
        action="store_true",
        help="a compacted topic (cleanup.policy=compact): kdiv keeps its key ledger too",
    )
    parser.add_argument("--poll-s", type=float, default=0.1, help="committed-offset poll interval")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a worker run may take")
    parser.add_argument(
        "--profile",
        nargs="*",
        metavar="VARIANT",
        help="one more worker run under py-spy per variant (none named: kdiv)",
    )
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=20, help="profile entries to print")
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KDIV_BOOTSTRAP", ""),
        help="an existing broker (default: KDIV_BOOTSTRAP, else Apache Kafka started from `kdiv fetch-jars` jars)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the workers' data dirs and logs")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each run's committed-offset curve")
    args = parser.parse_args()
    args.batch = [Batch(value) for value in args.batch_max]
    if args.profile == []:
        args.profile = ["kdiv"]
    if not 0 < args.trace_rate <= 1:
        parser.error(f"--trace-rate {args.trace_rate}: expected a share in (0, 1]")
    for variant in args.profile or ():
        if variant not in VARIANTS:
            parser.error(f"--profile {variant}: expected one of {', '.join(VARIANTS)}")

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop what we started

    signal.signal(signal.SIGTERM, on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="kdiv-bench-worker-"))
    broker = registry = None
    try:
        if args.bootstrap:
            bootstrap, broker_pid = args.bootstrap, None
        else:
            broker = KafkaCluster(port=0).start()
            bootstrap = broker.bootstrap
            (broker_pid,) = broker.pids
        if not os.environ.get("KDIV_SCHEMA_REGISTRY_URL"):
            # Workers register their state schema at start (worker_env passes the URL on).
            registry = DevRegistryProcess(bootstrap).start()
            os.environ["KDIV_SCHEMA_REGISTRY_URL"] = registry.url
        asyncio.run(bench(args, bootstrap, workdir, broker_pid))
    except BenchError as failure:
        sys.exit(f"bench failed: {failure}")
    except KeyboardInterrupt:
        sys.exit("interrupted")
    finally:
        if registry is not None:
            registry.stop()
        if broker is not None:
            broker.stop()
        if args.keep or args.profile:
            print(f"worker logs{' and profile' if args.profile else ''} kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
