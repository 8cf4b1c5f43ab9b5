"""Live worker throughput: a kdiv Faust worker validating a topic, against a bare aiokafka consumer.

    python bench/worker.py [--records N] [--producers P] [--partitions K] [--value-size B]
                           [--batch-max 1000 [2000 ...]] [--profile] [--bootstrap HOST:PORT]

One run: start the embedded broker (unless --bootstrap or KDIV_BOOTSTRAP names one), create a
topic, write N DIV-stamped records from P producers (P DivWriters sharing one aiokafka
producer, keyed with Kafka's partitioner or round robin), then

1. the baseline: a bare aiokafka consumer (no group, every partition assigned, a getmany loop)
   reads every record of the topic; best of --runs;
2. for each --batch-max: a `faust -A app.main worker` subprocess with tables on, a fresh app
   id and data dir, timed until its consumer group (group id = app id) has committed the end
   offset of every partition (AIOKafkaAdminClient.list_consumer_group_offsets every --poll-s);
3. with --profile: one more worker run with py-spy attached from the moment the worker owns
   its partitions to the moment it is done; the top costs are printed.

Worker startup (imports, discovery, Faust's bootstrap, topic creation, the group join, which
Tansu holds for session_timeout/2) is not part of validation. It is measured in the same run:
the bench asks the broker (DescribeGroups) every poll for the group's state, and the worker is
"ready" when the group is Stable with a member. Figures printed per worker run:

- end-to-end: records / (process start -> all committed);
- after ready: records / (group Stable -> all committed);
- steady: the slope of the committed-offset curve between the first and the last commit
  strictly between 0 and the end. Both ends are commit ticks seen by the same poll, so
  neither startup nor the commit-interval lag of the final commit (up to
  KDIV_COMMIT_INTERVAL_S) is in it. This is the validation rate; the ratio uses it.

The figure to watch is the ratio kdiv/bare; absolute records/s depend on the machine (the
broker, the bench and the worker share its cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

from app.devbroker import DevBroker  # noqa: E402
from app.kafka_compat import detect_tansu, end_offsets  # noqa: E402
from app.writer import DivWriter  # noqa: E402

BIN = Path(sys.executable).parent


class BenchError(RuntimeError):
    pass


# -- the topic --------------------------------------------------------------------------------


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-bench-admin")
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        for name, error_code, *rest in response.topic_errors:
            if error_code:
                raise BenchError(f"cannot create topic {name}: error {error_code} {rest}")
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, args: argparse.Namespace) -> float:
    """Write args.records DIV-stamped data records from args.producers writers; returns seconds."""
    rng = random.Random(7)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        writers = [
            DivWriter(producer, max_records_per_segment=args.segment_records) for _ in range(args.producers)
        ]
        await writers[0].partitions(topic)  # metadata for the topic before the clock starts
        start = time.perf_counter()
        for i in range(args.records):
            writer = writers[i % args.producers]
            key = b"key-%08d" % rng.randrange(1 << 20) if args.keys == "random" else None
            await writer.send(topic, rng.randbytes(args.value_size), key=key)
        for writer in writers:
            await writer.close()  # END_OF_SEGMENT everywhere, then flush: all acknowledged
        return time.perf_counter() - start
    finally:
        await producer.stop()


async def topic_end_offsets(bootstrap: str, topic: str, partitions: int, tansu: bool) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        return await end_offsets(consumer, [TopicPartition(topic, p) for p in range(partitions)], tansu=tansu)
    finally:
        await asyncio.sleep(0.1)  # aiokafka: stop() right after start() may raise CancelledError
        await consumer.stop()


# -- the baseline -----------------------------------------------------------------------------


async def bare_consume(bootstrap: str, ends: dict[TopicPartition, int]) -> float:
    """Seconds for a group-less aiokafka consumer to read every record up to `ends`."""
    total = sum(ends.values())
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(list(ends))
        await consumer.seek_to_beginning(*ends)
        start = time.perf_counter()
        read = 0
        while read < total:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                read += len(records)
        return time.perf_counter() - start
    finally:
        await consumer.stop()


# -- the worker -------------------------------------------------------------------------------


@dataclass
class WorkerRun:
    batch_max: int
    app_id: str
    records: int
    spawned: float
    ready: float | None = None
    done: float | None = None
    # (seconds since spawn, committed records) at each change of the committed total
    curve: list[tuple[float, int]] = field(default_factory=list)
    incidents: int = 0
    state_writes: int = 0
    profile: Path | None = None

    @property
    def startup_s(self) -> float | None:
        return None if self.ready is None else self.ready - self.spawned

    @property
    def end_to_end_rate(self) -> float:
        return self.records / (self.done - self.spawned)

    @property
    def after_ready_rate(self) -> float | None:
        return None if self.ready is None else self.records / (self.done - self.ready)

    @property
    def steady_rate(self) -> float | None:
        inside = [(t, c) for t, c in self.curve if 0 < c < self.records]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            (t0, c0), (t1, c1) = inside[0], inside[-1]
        elif inside:
            # Too few commits inside the run: from the first commit to completion instead.
            (t0, c0), (t1, c1) = inside[0], (self.done - self.spawned, self.records)
        else:
            return None
        return (c1 - c0) / (t1 - t0)


def worker_env(args: argparse.Namespace, bootstrap: str, topic: str, app_id: str, data_dir: Path, batch_max: int):
    env = dict(os.environ)
    env.update(
        KDIV_BOOTSTRAP=bootstrap,
        KDIV_TOPICS=topic,
        KDIV_APP_ID=app_id,
        KDIV_DATA_DIR=str(data_dir),
        KDIV_WEB_ENABLED="false",
        KDIV_BATCH_MAX=str(batch_max),
        KDIV_BATCH_WITHIN_S=str(args.batch_within_s),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    if args.commit_interval_s is not None:
        env["KDIV_COMMIT_INTERVAL_S"] = str(args.commit_interval_s)
    return env


def stop_process_group(process: subprocess.Popen, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Signal the process group we started (its leader is `process`), then SIGKILL it if needed."""
    if process.poll() is not None:
        try:  # the leader is gone; children may remain
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
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
            # v0: error_code, group_id, state, protocol_type, protocol, members[, authorized ops]
            _error, gid, state, _ptype, _protocol, members, *_ = group
            if gid == group_id:
                return state, len(members)
    return "", 0


async def run_worker(
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    ends: dict[TopicPartition, int],
    batch_max: int,
    workdir: Path,
    tansu: bool,
    profile: bool = False,
) -> WorkerRun:
    app_id = f"kdiv-bench-{uuid.uuid4().hex[:8]}-b{batch_max}{'-prof' if profile else ''}"
    data_dir = workdir / app_id / "data"
    data_dir.parent.mkdir(parents=True)
    log_path = workdir / app_id / "worker.log"
    total = sum(ends.values())
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-bench-monitor")
    await admin.start()
    spy: subprocess.Popen | None = None
    spy_log = workdir / app_id / "py-spy.log"
    profile_path = workdir / app_id / "py-spy.txt"
    with open(log_path, "wb") as log:
        command = [str(BIN / "faust"), "-A", "app.main", "worker", "-l", "warn"]
        spawned = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=worker_env(args, bootstrap, topic, app_id, data_dir, batch_max),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole below
        )
    run = WorkerRun(batch_max, app_id, total, spawned)
    try:
        deadline = spawned + args.timeout
        last = -1
        while True:
            now = time.monotonic()
            if process.poll() is not None:
                raise BenchError(
                    f"the worker ({app_id}) exited with code {process.returncode} before it was done; "
                    f"its log ({log_path}) ends:\n{tail(log_path)}"
                )
            if now > deadline:
                raise BenchError(
                    f"the worker ({app_id}) had committed {max(last, 0)} of {total} records after "
                    f"{args.timeout:.0f} s (--timeout); its log ({log_path}) ends:\n{tail(log_path)}"
                )
            if run.ready is None:
                state, members = await group_state(admin, app_id)
                if state == "Stable" and members:
                    run.ready = time.monotonic()
                    if profile:
                        spy = start_py_spy(process.pid, profile_path, spy_log, args.profile_rate)
            committed = await admin.list_consumer_group_offsets(app_id, partitions=list(ends))
            positions = {tp: meta.offset for tp, meta in committed.items() if meta is not None and meta.offset >= 0}
            done = sum(positions.get(tp, 0) for tp in ends)
            if done != last:
                run.curve.append((time.monotonic() - spawned, done))
                last = done
            if all(positions.get(tp, 0) >= end for tp, end in ends.items()):
                run.done = time.monotonic()
                break
            await asyncio.sleep(args.poll_s)
        if run.ready is None:  # finished between two polls
            run.ready = run.done
        if spy is not None:
            stop_py_spy(spy, spy_log)
            run.profile = profile_path
        changelog = f"{app_id}-state-p{len(ends)}-changelog"
        counts = await own_topic_sizes(bootstrap, [f"{app_id}-incidents", changelog], tansu)
        run.incidents = counts.get(f"{app_id}-incidents", 0)
        run.state_writes = counts.get(changelog, 0)
        return run
    finally:
        if spy is not None and spy.poll() is None:
            stop_process_group(spy, sig=signal.SIGINT)
        stop_process_group(process)
        await admin.close()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


async def own_topic_sizes(bootstrap: str, topics: list[str], tansu: bool) -> dict[str, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        sizes = {}
        for topic in topics:
            partitions = consumer.partitions_for_topic(topic)
            if partitions is None:
                await consumer._client.force_metadata_update()  # noqa: SLF001
                partitions = consumer.partitions_for_topic(topic)
            if partitions:
                ends = await end_offsets(consumer, [TopicPartition(topic, p) for p in partitions], tansu=tansu)
                sizes[topic] = sum(ends.values())
        return sizes
    finally:
        await consumer.stop()


# -- profiling --------------------------------------------------------------------------------


def start_py_spy(pid: int, out: Path, log: Path, rate: int) -> subprocess.Popen:
    py_spy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if py_spy is None:
        raise BenchError("--profile needs py-spy: pip install py-spy (into this venv)")
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--threads",
             "--nonblocking", "--output", str(out)],
            stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )


def stop_py_spy(spy: subprocess.Popen, log: Path) -> None:
    """SIGINT makes py-spy stop sampling and write its output."""
    os.killpg(spy.pid, signal.SIGINT)
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        stop_process_group(spy, grace_s=0)
        raise BenchError(f"py-spy did not stop; its log ends:\n{tail(log)}") from None


# Where a sample's time goes: the deepest frame whose file matches, leaf first.
CATEGORIES = [
    ("kdiv validation core (app/div)", re.compile(r"/app/div/")),
    ("kdiv live state (app/live.py)", re.compile(r"/app/live\.py")),
    ("kdiv worker glue (app/worker.py)", re.compile(r"/app/worker\.py")),
    ("RocksDB store (faust/stores, rocksdict)", re.compile(r"faust/stores/|rocksdict")),
    ("Faust tables + changelog send (faust/tables)", re.compile(r"faust/tables/")),
    ("aiokafka producer (changelog writes)", re.compile(r"aiokafka/producer/")),
    ("aiokafka fetch + record parsing", re.compile(r"aiokafka/(consumer|record)/")),
    ("Faust consumer (offsets, acks, commit)", re.compile(r"faust/transport/consumer\.py|faust/transport/drivers/")),
    ("Faust producer / conductor / topics", re.compile(r"faust/transport/(producer|conductor)\.py|faust/topics\.py")),
    ("Faust streams, events, channels, agents", re.compile(r"faust/(streams|events|channels|agents/)")),
    ("Faust other", re.compile(r"/faust/")),
    ("aiokafka other (client, conn, protocol)", re.compile(r"aiokafka/")),
    ("mode (services, threads)", re.compile(r"/mode/")),
    ("asyncio event loop", re.compile(r"asyncio/")),
]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _frame(frame: str) -> tuple[str, str]:
    """(function, short file) of one py-spy frame "func (path:line)"."""
    match = _FRAME.match(frame)
    if not match:
        return frame, ""
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3", str(ROOT) + "/"):
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
        frames = stack.split(";")
        thread = frames[0]
        samples.append((thread, [_frame(f) for f in frames[1:]], int(count)))
    total = sum(n for *_, n in samples)
    if not total:
        return ["py-spy collected no samples"]
    by_thread: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    for thread, frames, n in samples:
        by_thread[re.sub(r"\(0x[0-9a-f]+\)|\d{3,}", "", thread).strip()] += n
        if frames:
            func, file = frames[-1]
            self_time[f"{func} ({file})"] += n
        for func, file in set(frames):
            inclusive[f"{func} ({file})"] += n
        for _func, file in reversed(frames):
            name = next((name for name, pattern in CATEGORIES if pattern.search("/" + file)), None)
            if name is not None:
                categories[name] += n
                break
        else:
            categories["other"] += n

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    out = [f"py-spy samples: {total} (non-idle, all threads)"]
    out.append("by thread:")
    out += [f"  {pct(n)}  {name}" for name, n in by_thread.most_common(6)]
    out.append("by category (the deepest frame that falls in one):")
    out += [f"  {pct(n)}  {name}" for name, n in categories.most_common()]
    out.append(f"top {top} by self time:")
    out += [f"  {pct(n)}  {name}" for name, n in self_time.most_common(top)]
    out.append(f"top {top} by inclusive time:")
    out += [f"  {pct(n)}  {name}" for name, n in inclusive.most_common(top)]
    return out


# -- main -------------------------------------------------------------------------------------


def fmt_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f} records/s"


async def bench(args: argparse.Namespace, bootstrap: str, workdir: Path) -> None:
    tansu = await detect_tansu(bootstrap)
    topic = f"kdiv-bench-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic, args.partitions)
    produce_s = await produce(bootstrap, topic, args)
    ends = await topic_end_offsets(bootstrap, topic, args.partitions, tansu)
    total = sum(ends.values())
    control = total - args.records
    print(
        f"records: {args.records} data + {control} control = {total} on {topic}, producers: {args.producers}, "
        f"partitions: {args.partitions}, value bytes: {args.value_size}, keys: {args.keys}, "
        f"broker: {'embedded Tansu' if args.embedded else bootstrap}{' (Tansu)' if tansu and not args.embedded else ''}"
    )
    print(f"produced in {produce_s:.1f} s ({args.records / produce_s:,.0f} records/s through DivWriter)")
    bare_s = min([await bare_consume(bootstrap, ends) for _ in range(args.runs)])
    bare_rate = total / bare_s
    print(f"bare aiokafka consumer (getmany, best of {args.runs}): {fmt_rate(bare_rate)}")
    print(
        "kdiv worker (faust -A app.main worker, tables on), per KDIV_BATCH_MAX: startup = spawn -> group Stable; "
        "steady = slope of committed offsets between commits inside the run (the validation rate)"
    )
    runs = []
    for batch_max in args.batch_max:
        run = await run_worker(args, bootstrap, topic, ends, batch_max, workdir, tansu)
        runs.append(run)
        steady = run.steady_rate
        print(
            f"  batch_max {batch_max:>5}: startup {run.startup_s:5.1f} s | "
            f"end-to-end {fmt_rate(run.end_to_end_rate)} | after ready {fmt_rate(run.after_ready_rate)} | "
            f"steady {fmt_rate(steady)} | ratio kdiv/bare {steady / bare_rate if steady else float('nan'):.3f} "
            f"(after ready: {run.after_ready_rate / bare_rate:.3f}) | "
            f"state writes {run.state_writes} ({run.state_writes / total:.3f}/record), incidents {run.incidents}"
        )
        if args.verbose:
            print("    committed curve (s since spawn, records):", ", ".join(f"{t:.1f}:{c}" for t, c in run.curve))
        if run.incidents:
            print(f"  WARNING: the worker reported {run.incidents} incidents: the figure measures a fault path")
    if args.profile:
        batch_max = args.batch_max[0]
        print(f"profile: py-spy on one more worker run (batch_max {batch_max}), from group Stable to all committed")
        run = await run_worker(args, bootstrap, topic, ends, batch_max, workdir, tansu, profile=True)
        print(f"  (under the profiler: steady {fmt_rate(run.steady_rate)}; raw stacks: {run.profile})")
        for line in summarize_profile(run.profile, args.top):
            print("  " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--keys", choices=("random", "none"), default="random",
                        help="random keys (Kafka's partitioner) or none (DivWriter's round robin)")
    parser.add_argument("--segment-records", type=int, default=-1, help="DivWriter max_records_per_segment")
    parser.add_argument("--runs", type=int, default=3, help="bare consumer runs (best of)")
    parser.add_argument("--batch-max", type=int, nargs="+", default=[1000], help="KDIV_BATCH_MAX values, one run each")
    parser.add_argument("--batch-within-s", type=float, default=0.1, help="KDIV_BATCH_WITHIN_S")
    parser.add_argument("--commit-interval-s", type=float, default=None,
                        help="KDIV_COMMIT_INTERVAL_S (default: the worker's)")
    parser.add_argument("--poll-s", type=float, default=0.2, help="committed-offset poll interval")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a worker run may take")
    parser.add_argument("--profile", action="store_true", help="one more worker run under py-spy")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=20, help="profile entries to print")
    parser.add_argument("--bootstrap", default=os.environ.get("KDIV_BOOTSTRAP", ""),
                        help="an existing broker (default: KDIV_BOOTSTRAP, else an embedded Tansu)")
    parser.add_argument("--keep", action="store_true", help="keep the workers' data dirs, logs and profiles")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each run's committed-offset curve")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="kdiv-bench-worker-"))
    broker = None
    try:
        args.embedded = not args.bootstrap
        if args.embedded:
            broker = DevBroker(port=0).start()
            bootstrap = broker.bootstrap
        else:
            bootstrap = args.bootstrap
        asyncio.run(bench(args, bootstrap, workdir))
    except BenchError as failure:
        sys.exit(f"bench failed: {failure}")
    except KeyboardInterrupt:
        sys.exit("interrupted")
    finally:
        if broker is not None:
            broker.stop()
        if args.keep or args.profile:
            print(f"worker logs{' and profile' if args.profile else ''}: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
