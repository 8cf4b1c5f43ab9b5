"""Reading and writing the broker for the tests: offsets, committed positions, incidents, tables, faulty topics."""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import socket
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from kdiv.dev.broker import KafkaCluster
from kdiv.dev.demo import FAULTS, FaultyPipeline
from kdiv.incident.shape import Incident
from kdiv.kafka.consume import _standalone_consumer, read_snapshot, topic_partitions
from kdiv.kafka.tansu import detect_tansu, end_offsets
from kdiv.offline.jsonl import record_to_line
from kdiv.writer import DivWriter
from tests.harness.processes import WorkerProcess


def port_is_bindable(host: str, port: int) -> bool:
    """True if nothing listens on host:port (a stopped broker's TIME_WAIT leftovers aside)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


async def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


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
    ends: dict[int, int] | None = None,
) -> float:
    """Wait until the group has committed `ends` (default: the topic's end offsets) on every
    partition.

    Returns the seconds waited. The validator awaits its incidents and flushes its state
    before a commit, so from then on both are complete.
    """
    started = time.monotonic()
    workers = list(workers)
    if ends is None:
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
        if record.value is not None and record.key is not None:
            found[record.key].append(Incident.from_value(record.value))
    return dict(found)


async def read_table(bootstrap: str, app_id: str, partitions: int, table: str = "state") -> dict[bytes, bytes]:
    """A table ("state" or the "keys" ledger) as its changelog says (last value per key;
    tombstones delete)."""
    entries: dict[bytes, bytes] = {}
    async for record in read_snapshot(bootstrap, f"{app_id}-{table}-p{partitions}-changelog"):
        if record.key is None:
            continue
        if record.value is None:
            entries.pop(record.key, None)
        else:
            entries[record.key] = record.value
    return entries


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


async def produce_with_faults_for(bootstrap: str, topic: str, seconds: float, **options) -> Counter:
    """`produce_with_faults` for `seconds`, then its counts."""
    stop = asyncio.Event()
    producing = asyncio.create_task(produce_with_faults(bootstrap, topic, stop, **options))
    await asyncio.sleep(seconds)
    stop.set()
    return await producing


def restore(cluster: KafkaCluster) -> None:
    """Every node running and unpaused again, as the next test expects."""
    for node in cluster.nodes:
        if node.paused:
            cluster.resume_node(node.node_id)
    for node in cluster.nodes:
        if not node.running:
            cluster.start_node(node.node_id)
