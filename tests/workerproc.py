"""A real kdiv worker in a subprocess, and what a test needs to judge it from outside.

`WorkerProcess` runs ``faust -A kdiv.worker.main worker`` exactly as an operator does (settings
from ``KDIV_*``), with its output in a log file, and can be SIGKILLed, terminated and
restarted with or without its data dir. The helpers below read the broker: committed
offsets of the worker group, exact end offsets, the incidents topic, the state table's
changelog, and the oracle (the pure validator over the final topic content).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.dev.demo import FAULTS, FaultyPipeline
from kdiv.div.segment import Segment
from kdiv.div.validator import DataIntegrityValidator, PartitionValidation
from kdiv.kafka.consume import _standalone_consumer, read_snapshot, topic_partitions
from kdiv.kafka.tansu import detect_tansu, end_offsets
from kdiv.offline.jsonl import record_to_line
from kdiv.state.codec import decode_partition, decode_segment
from kdiv.state.framing import unframe
from kdiv.state.tables import parse_key
from kdiv.worker.incidents import Incident, incident_for
from kdiv.writer import DivWriter

REPO = Path(__file__).resolve().parent.parent
FAUST = str(Path(sys.executable).with_name("faust"))

READY_LINE = "[^Worker]: Ready"
_START_MARK = "=== kdiv-test: start #"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The Schema Registry workers use unless given one; conftest sets the session's.
REGISTRY_URL: str | None = None


class WorkerProcess:
    """One `faust -A kdiv.worker.main worker` subprocess; its log accumulates across restarts."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        topics: Iterable[str],
        app_id: str,
        workdir: Path,
        web_port: int | None = None,
        session_timeout_s: float = 3.0,
        heartbeat_interval_s: float = 0.3,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.topics = tuple(topics)
        self.app_id = app_id
        self.data_dir = Path(workdir) / name / "data"
        self.log_path = Path(workdir) / f"{name}.log"
        self.web_port = web_port
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0
        self._log_offset = 0  # where the current run's output starts in the log file

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.web_port}" if self.web_port else None

    def environment(self) -> dict[str, str]:
        # Nothing KDIV_* from the caller's environment, except the broker flavour override.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KDIV_") or k == "KDIV_BROKER_FLAVOR"}
        env.update(
            PYTHONUNBUFFERED="1",
            KDIV_BOOTSTRAP=self.bootstrap,
            KDIV_TOPICS=",".join(self.topics),
            KDIV_APP_ID=self.app_id,
            KDIV_DATA_DIR=str(self.data_dir),
            KDIV_SESSION_TIMEOUT_S=str(self.session_timeout_s),
            KDIV_HEARTBEAT_INTERVAL_S=str(self.heartbeat_interval_s),
        )
        if REGISTRY_URL:
            env["KDIV_SCHEMA_REGISTRY_URL"] = REGISTRY_URL
        if self.web_port:
            env.update(KDIV_WEB_ENABLED="true", KDIV_WEB_PORT=str(self.web_port), KDIV_WEB_HOST="127.0.0.1")
        else:
            env["KDIV_WEB_ENABLED"] = "false"
        env.update(self.extra_env)
        return env

    def start(self) -> WorkerProcess:
        if self.alive:
            raise RuntimeError(f"worker {self.name} is already running (pid {self.proc.pid})")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n{_START_MARK}{self.starts} at {time.time():.3f} ===\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                [FAUST, "-A", "kdiv.worker.main", "worker", "-l", "info"],
                cwd=REPO,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def sigkill(self) -> float:
        """SIGKILL the worker and reap it; returns the monotonic time of the kill."""
        if not self.alive:
            raise AssertionError(f"worker {self.name} died before it was killed:\n{self.log_tail()}")
        killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._note(f"SIGKILL at {time.time():.3f} (ready: {self.ready})")
        return killed_at

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a clean Faust shutdown); SIGKILL if it does not end within `timeout`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def cry(self) -> None:
        """Ask the worker to log the stack of every thread and asyncio task (mode's SIGUSR1)."""
        if self.alive:
            self._note(f"SIGUSR1 at {time.time():.3f}: stacks follow")
            self.proc.send_signal(signal.SIGUSR1)

    def restart(self, keep_data: bool = True) -> WorkerProcess:
        """Start again after a kill or stop; without its data dir the state comes from the changelog."""
        if self.alive:
            raise RuntimeError(f"worker {self.name} is still running")
        if not keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self._note(f"restart {'keeping' if keep_data else 'deleting'} the data dir")
        return self.start()

    def _note(self, text: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\n=== kdiv-test: {text} ===\n")

    # -- the log -----------------------------------------------------------------------------

    def log_text(self, current_run_only: bool = False) -> str:
        try:
            with open(self.log_path, "rb") as log:
                if current_run_only:
                    log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return f"--- {self.log_path} (last {lines} lines) ---\n" + "\n".join(self.log_text().splitlines()[-lines:])

    @property
    def ready(self) -> bool:
        """The current run has logged Faust's "Worker: Ready" (recovery done, streams running)."""
        return READY_LINE in self.log_text(current_run_only=True)

    async def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds from the (re)start until the worker is ready."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if not self.alive:
                raise AssertionError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")
            await asyncio.sleep(0.05)
        return time.monotonic() - self.started_at

    def problems(self) -> list[str]:
        """Log lines that show the worker misbehaving (tracebacks, errors, crashes)."""
        return [
            line
            for line in self.log_text().splitlines()
            if "Traceback" in line or "[ERROR]" in line or "[CRITICAL]" in line
        ]


# -- the broker side -----------------------------------------------------------------------


async def exact_end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """End offsets of every partition of `topic`, exact on Tansu too (kdiv.kafka.tansu)."""
    async with _standalone_consumer(bootstrap) as consumer:
        tps = await topic_partitions(consumer, topic)
        ends = await end_offsets(consumer, tps, tansu=await detect_tansu(consumer))
    return {tp.partition: offset for tp, offset in ends.items()}


async def committed_offsets(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """The group's committed offsets on `topic` (-1: none yet).

    Partitions are named explicitly: Tansu fails an OffsetFetch for all of a group's
    partitions (the response does not decode).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="kdiv-tests-offsets")
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(
            group, partitions=[TopicPartition(topic, p) for p in partitions]
        )
    finally:
        await admin.close()
    return {p: found[TopicPartition(topic, p)].offset if TopicPartition(topic, p) in found else -1 for p in partitions}


async def record_offsets(
    bootstrap: str, group: str, topic: str, partitions: int, path: Path, every_s: float = 0.25
) -> None:
    """Append the group's committed offsets and the topic's end offsets to `path` every
    `every_s` seconds, until cancelled: a timeline for post mortems."""
    with open(path, "a") as out:
        while True:
            try:
                committed = await committed_offsets(bootstrap, group, topic, range(partitions))
                ends = await exact_end_offsets(bootstrap, topic)
                out.write(f"{time.time():.3f} committed {committed} ends {ends}\n")
            except Exception as exc:  # the timeline is a diagnostic; never fail because of it
                out.write(f"{time.time():.3f} {exc!r}\n")
            out.flush()
            await asyncio.sleep(every_s)


async def wait_until_caught_up(
    bootstrap: str,
    group: str,
    topic: str,
    *,
    timeout: float = 60.0,
    workers: Iterable[WorkerProcess] = (),
) -> float:
    """Wait until the group has committed the topic's end offset on every partition.

    Returns the seconds waited. The validator awaits its incidents and flushes its state
    before a commit, so from then on both are complete.
    """
    started = time.monotonic()
    workers = list(workers)
    ends = await exact_end_offsets(bootstrap, topic)
    committed: dict[int, int] = {}
    while True:
        committed = await committed_offsets(bootstrap, group, topic, sorted(ends))
        if committed == ends:
            return time.monotonic() - started
        for worker in workers:
            if worker.proc is not None and not worker.alive and worker.proc.returncode not in (-signal.SIGKILL,):
                raise AssertionError(f"worker {worker.name} exited with {worker.proc.returncode}:\n{worker.log_tail()}")
        if time.monotonic() - started > timeout:
            for worker in workers:
                worker.cry()
            await asyncio.sleep(2)
            tails = "\n".join(w.log_tail() for w in workers)
            raise AssertionError(
                f"group {group} did not catch up on {topic} in {timeout:.0f} s: committed {committed}, ends {ends}\n{tails}"
            )
        await asyncio.sleep(0.25)


async def read_incidents(bootstrap: str, app_id: str) -> dict[bytes, list[Incident]]:
    """Every incident on the incidents topic, all versions per key, in topic order.

    Tansu never compacts, so replays of an incident show up as repeated keys here.
    """
    found: dict[bytes, list[Incident]] = defaultdict(list)
    async for record in read_snapshot(bootstrap, f"{app_id}-incidents"):
        if record.value is not None:
            found[record.key].append(Incident.from_value(record.value))
    return dict(found)


def comparable(incident: Incident) -> tuple[str, str, int]:
    return (incident.verdict, incident.severity, incident.offset)


@dataclass
class Oracle:
    """What the pure validator reports over the topic's final content."""

    # key -> (verdict, severity, offset) of the last incident with that key: what a
    # compacted incidents topic keeps.
    incidents: dict[bytes, tuple[str, str, int]]
    # key -> every (verdict, severity, offset) reported under it; more than one when a
    # record comes twice (e.g. one record duplicated twice).
    versions: dict[bytes, set[tuple[str, str, int]]]
    partitions: dict[tuple[str, int], PartitionValidation]
    records: int

    def verdicts(self) -> Counter:
        return Counter(verdict for verdict, _severity, _offset in self.incidents.values())

    def severities(self) -> Counter:
        return Counter(severity for _verdict, severity, _offset in self.incidents.values())


async def oracle(bootstrap: str, topic: str) -> Oracle:
    """Validate the whole topic in offset order per partition, as a worker that never
    crashed would: stream phase, no compaction, no max age (the worker's defaults here)."""
    validator = DataIntegrityValidator()
    incidents: dict[bytes, tuple[str, str, int]] = {}
    versions: dict[bytes, set[tuple[str, str, int]]] = defaultdict(set)
    records = 0
    async for record in read_snapshot(bootstrap, topic):
        records += 1
        incident = incident_for(validator.validate(record, time.time_ns() // 1_000_000), 0)
        if incident is not None:
            incidents[incident.key] = comparable(incident)
            versions[incident.key].add(comparable(incident))
    return Oracle(incidents, dict(versions), dict(validator.partitions), records)


async def read_table(bootstrap: str, app_id: str, partitions: int, table: str = "state") -> dict[bytes, bytes]:
    """A table ("state" or the "keys" ledger) as its changelog says (last value per key;
    tombstones delete)."""
    name = table
    table: dict[bytes, bytes] = {}
    async for record in read_snapshot(bootstrap, f"{app_id}-{name}-p{partitions}-changelog"):
        if record.value is None:
            table.pop(record.key, None)
        else:
            table[record.key] = record.value
    return table


def saved_state(
    table: dict[bytes, bytes],
) -> tuple[dict[tuple[str, int], PartitionValidation], dict[tuple[str, int, bytes], Segment]]:
    parts: dict[tuple[str, int], PartitionValidation] = {}
    producers: dict[tuple[str, int, bytes], Segment] = {}
    for key, value in table.items():
        state_key = parse_key(key)
        if state_key.guid is None:
            parts[(state_key.topic, state_key.partition)] = decode_partition(unframe(value)[1])
        else:
            producers[(state_key.topic, state_key.partition, state_key.guid)] = decode_segment(unframe(value)[1])
    return parts, producers


def state_differences(expected: Oracle, table: dict[bytes, bytes]) -> list[str]:
    """How the worker's saved state differs from the oracle's (an empty list when it agrees)."""
    parts, producers = saved_state(table)
    problems = []
    for tp, want in sorted(expected.partitions.items()):
        got = parts.get(tp)
        if got is None:
            problems.append(f"{tp}: no partition state saved")
            continue
        for name in ("in_push", "push_failed", "last_offset", "records", "verdict_counts"):
            if getattr(got, name) != getattr(want, name):
                problems.append(f"{tp}: {name} saved {getattr(got, name)!r}, oracle {getattr(want, name)!r}")
        for guid, segment in want.tracker.segments.items():
            saved = producers.pop((tp[0], tp[1], guid), None)
            if saved is None:
                problems.append(f"{tp}: producer {guid.hex()} not saved")
            elif saved != segment:
                problems.append(f"{tp}: producer {guid.hex()} saved {saved!r}, oracle {segment!r}")
    problems += [f"{key[:2]}: producer {key[2].hex()} saved but unknown to the oracle" for key in producers]
    return problems


def latest(live: dict[bytes, list[Incident]]) -> dict[bytes, tuple[str, str, int]]:
    """What a compacted incidents topic keeps: the last version of each key."""
    return {key: comparable(versions[-1]) for key, versions in live.items()}


def incident_differences(expected: Oracle, live: dict[bytes, list[Incident]], limit: int = 25) -> list[str]:
    """Missed, false and inconsistent incidents (an empty list when they agree).

    Per key, the live topic must hold exactly the versions the oracle reports (replays
    repeat a version, never add one), and its last version must be the oracle's last.
    """
    problems = []
    for key in sorted(expected.incidents.keys() - live.keys()):
        problems.append(f"missed: {key.decode()} -> {expected.incidents[key]}")
    for key in sorted(live.keys() - expected.incidents.keys()):
        problems.append(f"false alarm: {key.decode()} -> {[comparable(i) for i in live[key]]}")
    for key in sorted(expected.incidents.keys() & live.keys()):
        seen = {comparable(i) for i in live[key]}
        last = comparable(live[key][-1])
        if seen != expected.versions[key] or last != expected.incidents[key]:
            problems.append(
                f"differs: {key.decode()} -> live {sorted(seen)} (last {last}), "
                f"oracle {sorted(expected.versions[key])} (last {expected.incidents[key]})"
            )
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more"]
    return problems


async def dump_topics(bootstrap: str, topics: Iterable[str], directory: Path) -> list[Path]:
    """Write each topic's records as `kdiv dump` JSON Lines under `directory`, for a post
    mortem (`kdiv check` reads them back); topics that cannot be read are skipped."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for topic in topics:
        path = directory / f"{topic}.jsonl"
        try:
            with open(path, "w") as out:
                async for record in read_snapshot(bootstrap, topic):
                    out.write(record_to_line(record) + "\n")
        except Exception as exc:  # a post mortem must not hide the failure it documents
            path.write_text(f"cannot read {topic}: {exc!r}\n")
        written.append(path)
    return written


# -- load with injected faults ---------------------------------------------------------------


async def produce_with_faults(
    bootstrap: str,
    topic: str,
    stop: asyncio.Event,
    *,
    rate: float = 80.0,
    fault_every: int = 20,
    faults: Iterable[str] = FAULTS,
    seed: int = 0,
    max_records_per_segment: int = 200,
) -> Counter:
    """Write DIV-stamped records at `rate` per second until `stop` is set, injecting one
    fault (kdiv.dev.demo's FaultyPipeline, in turn from `faults`) every `fault_every` records,
    at least one healthy record apart. Ends every segment on the way out. Returns how many
    records were written healthy and how many faults of each kind were injected."""
    rng = random.Random(seed)
    writer = await DivWriter.start(bootstrap, max_records_per_segment=max_records_per_segment)
    pipeline = FaultyPipeline(writer, topic)
    partitions = await writer.partitions(topic)
    kinds = itertools.cycle(tuple(faults))
    done: Counter = Counter()
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    try:
        for n in itertools.count():
            if stop.is_set():
                break
            if n % fault_every == fault_every - 1:
                fault = next(kinds)
                await pipeline.inject(fault, rng.choice(partitions))
                done[fault] += 1
            else:
                await pipeline.healthy(partitions[n % len(partitions)])
                done["healthy"] += 1
            next_at += 1 / rate
            await asyncio.sleep(max(0.0, next_at - loop.time()))
    finally:
        await writer.close()
    return done


# -- Faust's view of the assignment ----------------------------------------------------------


async def router_view(worker: WorkerProcess) -> tuple[dict, dict]:
    """(table changelog partitions, other topics' partitions) per worker URL, as Faust's
    assignor distributed them to `worker` (its /router/ endpoints): active partitions only.

    Tansu's DescribeGroups returns no member assignments, so the group is asked this way.
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(f"{worker.url}/router/") as response:
            response.raise_for_status()
            tables = await response.json()
        async with session.get(f"{worker.url}/router/topics") as response:
            response.raise_for_status()
            topics = await response.json()
    return tables, topics


def owners(distribution: dict, topic: str) -> dict[int, list[str]]:
    """partition -> URLs of the workers the distribution gives it to."""
    found: dict[int, list[str]] = defaultdict(list)
    for url, by_topic in distribution.items():
        for partition in by_topic.get(topic, ()):
            found[partition].append(url)
    return dict(found)


# -- the web views ---------------------------------------------------------------------------


async def http_json(session, method: str, url: str, headers: dict | None = None) -> tuple[int, dict | str]:
    """(status, JSON body, or text when the answer is not JSON)."""
    async with session.request(method, url, headers=headers or {}) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def wait_for_split(
    session, workers, partitions: int, headers: dict | None = None, timeout: float = 60.0
) -> dict[int, str]:
    """Partition -> owning worker URL (from /partitions/), once each worker owns one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status, body = await http_json(session, "GET", f"{workers[0].url}/partitions/", headers)
        owners = {item["partition"]: item["worker"] for item in body["items"]} if status == 200 else {}
        if len(owners) == partitions and len(set(owners.values())) == len(workers):
            return owners
        if loop.time() > deadline:
            raise AssertionError(f"partitions not split between the workers: {status} {body}")
        await asyncio.sleep(0.5)
