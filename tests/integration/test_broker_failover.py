"""Broker failures staged on a three-node Apache Kafka under a running worker.

Each case has its own topic and worker, and leaves every node running as it found it.

- A clean failover (a replicated topic, `acks=all`, an idempotent writer) loses and doubles
  nothing, so the worker must report nothing at all: a leader killed mid-stream and its
  node started again are no incident.
- An unclean election (a stale replica elected, `unclean.leader.election.enable=true`)
  truncates records the worker had validated: one LOG_REWOUND naming exactly those offsets,
  and the records written at them afterwards validated as new; nothing else.
- An `acks=1` writer whose leader dies before its followers copied the last records: those
  records were acknowledged and are gone, and the worker never saw them (a consumer reads
  only up to the high watermark, which the followers held back). It names exactly the lost
  seqs MISSING, and the END_OF_SEGMENT whose checksum still counts them CORRUPT; the
  writer's retries after the failover double nothing.

The controller quorum lives in the same three processes, so a case never has two nodes
down or paused for longer than it takes to start the election it wants.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from kdiv.dev.broker import KafkaCluster
from kdiv.div.wire import Kind, readable_div_header
from kdiv.incident.shape import Incident
from kdiv.kafka.consume import read_snapshot
from kdiv.kafka.topics import create_topic
from kdiv.writer import DivWriter
from tests.harness.broker import exact_end_offsets, read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess, free_port

# alone: it measures how long the worker or a producer takes under a frozen or killed broker.
pytestmark = [pytest.mark.broker, pytest.mark.alone]

PARTITIONS = 2


def bootstrap_of(cluster: KafkaCluster, *node_ids: int) -> str:
    """The bootstrap address of some nodes only: clients must not wait on a dead or paused one."""
    return ",".join(f"127.0.0.1:{cluster.node(n).port}" for n in node_ids)


async def describe_partition(bootstrap: str, topic: str, partition: int) -> dict:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        # Each node applies a new topic's metadata in its own time: ask until the one
        # answering lists the partition.
        async with asyncio.timeout(30):
            while True:
                (described,) = await admin.describe_topics([topic])
                for listed in described["partitions"]:
                    if listed["partition"] == partition:
                        return listed
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    return (await describe_partition(bootstrap, topic, partition))["leader"]


async def eventually(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if await check():
                return
        except (KafkaError, aiohttp.ClientError, TimeoutError):
            pass  # a node or the worker's web server going away or coming back: ask again
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.2)


async def new_topic(bootstrap: str, topic: NewTopic) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await create_topic(admin, topic)
    finally:
        await admin.close()


def worker_for(bootstrap: str, topic: str, tmp_path, web_port: int | None = None) -> WorkerProcess:
    app_id = f"failover-{uuid.uuid4().hex[:8]}"
    # The worker's own topics are replicated too: a dead node must not take its state with it.
    return WorkerProcess(
        "w",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=app_id,
        workdir=tmp_path,
        web_port=web_port,
        env={"KDIV_REPLICATION_FACTOR": "3"},
    )


async def worker_metrics(worker: WorkerProcess) -> str:
    """The worker's /metrics, as text."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"{worker.url}/metrics") as response,
    ):
        return await response.text()


def partition_metric(text: str, name: str, topic: str, partition: int) -> int | None:
    """One partition's value of a metric in /metrics' `text` (None: not given)."""
    for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE):
        if f'topic="{topic}"' in labels and f'partition="{partition}"' in labels:
            return int(float(value))
    return None


async def records_validated(worker: WorkerProcess, topic: str, partition: int) -> int:
    """What the worker's metrics say it has validated of a partition (committed or not)."""
    return partition_metric(await worker_metrics(worker), "kdiv_records_validated_total", topic, partition) or 0


def latest(incidents: dict[bytes, list[Incident]]) -> list[Incident]:
    return sorted((versions[-1] for versions in incidents.values()), key=lambda i: (i.partition, i.offset))


async def data_seqs(bootstrap: str, topic: str, partition: int, guid: bytes) -> list[int]:
    """The seqs of `guid`'s data records the partition holds, in offset order."""
    seqs = []
    async for record in read_snapshot(bootstrap, topic, [partition]):
        header = readable_div_header(record.headers)
        if header is not None and header.guid == guid and header.kind == Kind.DATA:
            seqs.append(header.seq)
    return seqs


async def send_acked(writer: DivWriter, topic: str, partition: int, records: int, label: bytes) -> list[int]:
    """`records` data records, each awaited until acknowledged; the offsets they were acknowledged at."""
    offsets = []
    for i in range(records):
        metadata = await writer.send_and_wait(topic, b"%s-%d" % (label, i), key=b"k%d" % i, partition=partition)
        offsets.append(metadata.offset)
    return offsets


async def write_steadily(writer: DivWriter, topic: str, records: int, rate: float) -> None:
    for i in range(records):
        await writer.send(topic, b"value-%d" % i, key=b"key-%d" % i, partition=i % PARTITIONS)
        await asyncio.sleep(1 / rate)
    await writer.end_segments(topic)
    await writer.flush()  # every record acknowledged (the producer retries on the new leader meanwhile)


async def close_quietly(writer: DivWriter) -> None:
    try:
        await writer.close()
    except KafkaError:
        pass


async def resume_until_one_leads(cluster: KafkaCluster, topic: str, followers: list[int]) -> str:
    """The paused followers resumed; once one of them leads `topic`[0], their bootstrap."""
    for follower in followers:
        cluster.resume_node(follower)
    survivors = bootstrap_of(cluster, *followers)

    async def follower_leads() -> bool:
        return await leader_of(survivors, topic, 0) in followers

    await eventually(f"a follower elected leader of {topic}[0]", follower_leads)
    return survivors


async def test_a_clean_failover_with_acks_all_is_no_incident(three_nodes, tmp_path):
    cluster = three_nodes
    bootstrap = cluster.bootstrap
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    await new_topic(bootstrap, NewTopic(topic, PARTITIONS, 3, topic_configs={"min.insync.replicas": "2"}))

    worker = worker_for(bootstrap, topic, tmp_path)
    writer = await DivWriter.start(bootstrap, producer_options={"acks": "all", "enable_idempotence": True})
    try:
        worker.start()
        await worker.wait_ready()
        writing = asyncio.create_task(write_steadily(writer, topic, 600, rate=150))
        await asyncio.sleep(1.5)
        victim = await leader_of(bootstrap, topic, 0)
        cluster.kill_node(victim)
        await asyncio.sleep(3)
        cluster.start_node(victim)
        await writing

        survivors_first = ",".join(
            f"127.0.0.1:{node.port}" for node in sorted(cluster.nodes, key=lambda n: n.node_id == victim)
        )
        ends = await exact_end_offsets(survivors_first, topic)
        # 600 records, a START_OF_SEGMENT and an END_OF_SEGMENT per partition: nothing lost, nothing doubled.
        assert sum(ends.values()) == 600 + 2 * PARTITIONS, ends
        await wait_until_caught_up(survivors_first, worker.app_id, topic, workers=[worker], timeout=90)
        incidents = await read_incidents(survivors_first, worker.app_id)
        assert incidents == {}, latest(incidents)
        assert worker.alive, worker.log_tail()
    finally:
        await close_quietly(writer)
        worker.terminate()


async def test_an_unclean_election_below_validated_offsets_is_one_rewind(three_nodes, tmp_path):
    """Two replicas, on nodes `a` (the leader) and `b`; the third node only keeps the quorum.
    `b` is paused until it has left the ISR, the worker validates records only `a` holds,
    then `a` dies and `b`, stale, is elected uncleanly: its log ends where `b` stopped.

    The worker's commits may wait while `b` is paused (its producer waits for requests in
    flight to `b`), so what it validated is read from its metrics."""
    cluster = three_nodes
    a, b, c = (node.node_id for node in cluster.nodes)
    topic = f"unclean-{uuid.uuid4().hex[:8]}"
    configs = {"unclean.leader.election.enable": "true", "min.insync.replicas": "1"}
    await new_topic(cluster.bootstrap, NewTopic(topic, -1, -1, replica_assignments={0: [a, b]}, topic_configs=configs))
    worker = worker_for(cluster.bootstrap, topic, tmp_path, web_port=free_port())
    # Not idempotent: the elected replica knows none of the producer's later sequence numbers.
    writer = await DivWriter.start(cluster.bootstrap, producer_options={"acks": "all"})
    try:
        worker.start()
        await worker.wait_ready()
        assert await leader_of(cluster.bootstrap, topic, 0) == a
        await send_acked(writer, topic, 0, 100, b"both")  # on a and b: START_OF_SEGMENT, then offsets 1..100
        both_end = (await exact_end_offsets(cluster.bootstrap, topic))[0]
        await wait_until_caught_up(cluster.bootstrap, worker.app_id, topic, workers=[worker])

        cluster.pause_node(b)
        a_and_c = bootstrap_of(cluster, a, c)

        async def only_a_in_sync() -> bool:
            return (await describe_partition(a_and_c, topic, 0))["isr"] == [a]

        await eventually(f"{topic}'s ISR shrinks to node {a}", only_a_in_sync)
        only_on_a = await send_acked(writer, topic, 0, 100, b"only-a")
        assert only_on_a[0] == both_end, only_on_a

        async def all_validated() -> bool:
            return await records_validated(worker, topic, 0) == only_on_a[-1] + 1

        # Its commit may wait out its producer's request bound on `b` (KDIV_BROKER_TIMEOUT_S,
        # 20 s) more than once, each try bounded by KDIV_COMMIT_TIMEOUT_S (30 s), before it is
        # written and the next batch is validated: once it took longer than 53 s.
        await eventually("the worker validates the records only a holds", all_validated, timeout=150)

        cluster.kill_node(a)
        cluster.resume_node(b)  # with c, a quorum again: a is fenced and b elected uncleanly
        b_and_c = bootstrap_of(cluster, b, c)

        async def b_leads() -> bool:
            return await leader_of(b_and_c, topic, 0) == b

        await eventually(f"node {b} elected leader of {topic}[0]", b_leads)
        assert await exact_end_offsets(b_and_c, topic) == {0: both_end}

        # The writer goes on in b's log at once: 150 records from offset `both_end`, at
        # offsets the worker validated (holding other records then) and past them. The
        # worker finds the truncation by whichever signal sees it first: the high watermark
        # (its next fetch is out of range, it reads the partition again from its start, and
        # the leader confirms where its log ends) while the log still ends below the offsets
        # it validated, or the leader epoch (the records at its position are of b's epoch,
        # and b says the epoch it validated in ends at `both_end`) once it no longer does.
        after = await send_acked(writer, topic, 0, 150, b"after")
        assert after[0] == both_end, after
        await writer.close()
        await wait_until_caught_up(b_and_c, worker.app_id, topic, workers=[worker], timeout=60)

        (rewound,) = latest(await read_incidents(b_and_c, worker.app_id))
        assert (rewound.verdict, rewound.partition, rewound.offset) == ("LOG_REWOUND", 0, both_end), rewound
        assert f"offsets {both_end}..{only_on_a[-1]} were validated" in rewound.detail, rewound.detail
        assert "(found by high watermark)" in rewound.detail or "(found by leader epoch)" in rewound.detail, rewound
        # The producer's records from `both_end` on were judged as new, in order: skipped as
        # replays, the first record past the old end would have opened a gap (MISSING), and
        # the END_OF_SEGMENT's checksum, which counts the truncated records the worker
        # validated, would not match.
        assert worker.alive, worker.log_tail()
    finally:
        await close_quietly(writer)
        worker.terminate()


async def test_acks_1_records_lost_with_their_leader_are_exactly_the_missing_seqs(three_nodes, tmp_path):
    """Three replicas, `acks=1`. Both followers are paused (the quorum with them: the ISR
    cannot shrink and the high watermark cannot pass what they hold), the leader acknowledges
    records alone and is killed; the followers, still in the ISR, elect one of them cleanly."""
    cluster = three_nodes
    topic = f"acks1-{uuid.uuid4().hex[:8]}"
    await new_topic(cluster.bootstrap, NewTopic(topic, 1, 3))
    worker = worker_for(cluster.bootstrap, topic, tmp_path)
    writer = await DivWriter.start(cluster.bootstrap, producer_options={"acks": 1})
    try:
        worker.start()
        await worker.wait_ready()
        replicated = await send_acked(writer, topic, 0, 100, b"replicated")
        await wait_until_caught_up(cluster.bootstrap, worker.app_id, topic, workers=[worker])

        leader = await leader_of(cluster.bootstrap, topic, 0)
        followers = [node.node_id for node in cluster.nodes if node.node_id != leader]
        for follower in followers:
            cluster.pause_node(follower)
        acked_alone = await send_acked(writer, topic, 0, 50, b"leader-only")
        cluster.kill_node(leader)
        survivors = await resume_until_one_leads(cluster, topic, followers)
        # Sent while the new leader is being elected, retried by the producer until it is.
        after = await send_acked(writer, topic, 0, 50, b"after")
        await writer.close()

        assert acked_alone[0] == replicated[-1] + 1, (replicated, acked_alone)
        held = await data_seqs(survivors, topic, 0, writer.guid)
        acked = list(range(1, 201))  # the writer's seqs of segment 0 (1..200), each acknowledged
        lost = sorted(set(acked) - set(held))
        # Nothing doubled by the retries, and what is lost is a run of what only the dead
        # leader held: the records acknowledged after the pause, but for the first few when
        # a follower's fetch was already answered when it stopped (it appends them once
        # resumed, and the new leader keeps them).
        assert sorted(held) == held and len(set(held)) == len(held), held
        assert lost and lost == list(range(lost[0], 151)) and lost[0] >= 101, lost
        # Seq n is at offset n (after the START_OF_SEGMENT): the writer went on where the
        # new leader's log ended.
        assert after[0] == lost[0], (after, lost)

        await wait_until_caught_up(survivors, worker.app_id, topic, workers=[worker], timeout=60)
        incidents = latest(await read_incidents(survivors, worker.app_id))
        assert [(i.verdict, i.segment, i.seq) for i in incidents] == [
            ("MISSING", 0, lost[0]),
            ("CORRUPT", 0, len(acked) + 1),
        ], incidents
        missing, corrupt = incidents
        assert f"seq {lost[0]}..{lost[-1]}" in missing.detail or f"{lost[0]}..{lost[-1]}" in missing.detail, missing
        assert missing.offset == after[0], missing
        assert "ADHASH" in corrupt.detail, corrupt
        assert worker.alive, worker.log_tail()
    finally:
        await close_quietly(writer)
        worker.terminate()


async def _health(worker: WorkerProcess) -> tuple[str, dict]:
    """(/health's status, its whole answer)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session,
            session.get(f"{worker.url}/health") as response,
        ):
            answer = await response.json()
            return answer["status"], answer
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as failed:
        return f"unanswered: {type(failed).__name__}", {}


async def never_silent(
    worker: WorkerProcess, topic: str, acked: dict[int, list[tuple[int, float]]], seconds: float, bound_s: float
) -> list:
    """Probe every second for `seconds`: a partition whose committed validated offset
    (`kdiv_validated_offset`) has not moved for longer than `bound_s` while an acknowledged
    record past it has waited that long must be said on /health ("stalled"), as the worker's
    rule says: stalled from the later of its last progress and its oldest unvalidated record's
    arrival. (A producer may itself wait on a frozen leader for its request timeout: records it
    has not had acknowledged are not yet in the log, and no validator can be behind on them.)
    The silent moments found (empty: none): (seconds waiting, partition, validated, acked,
    status, UTC time), and /health's whole answer at the first."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    last: dict[int, int] = {}
    moved_at: dict[int, float] = {}
    silent: list = []
    while loop.time() < end:
        now = loop.time()
        status, answer = await _health(worker)
        try:
            metrics: str | None = await worker_metrics(worker)
        except (aiohttp.ClientError, TimeoutError):
            metrics = None
        for partition in range(PARTITIONS):
            if metrics is None:
                validated = last.get(partition, 0)
            else:
                validated = partition_metric(metrics, "kdiv_validated_offset", topic, partition) or 0
            if validated > last.get(partition, -1):
                moved_at[partition] = now
            last[partition] = max(validated, last.get(partition, 0))
            acks = acked.get(partition, [])
            waiting_since = next((at for acked_end, at in acks if acked_end > last[partition]), None)
            if waiting_since is None:
                continue
            since = max(waiting_since, moved_at[partition])
            if now - since > bound_s and status != "stalled":
                wall = time.strftime("%H:%M:%S", time.gmtime())
                silent.append((round(now - since), partition, last[partition], acks[-1][0], status, wall))
                if len(silent) == 1:
                    silent.append(answer)
        await asyncio.sleep(1)
    return silent


def stall_lines(log: str, partition: str) -> list[str]:
    """The words "stalled" and "resumed", in the order the worker logged them for `partition`."""
    pattern = re.compile(
        r"validation (stalled|resumed) on (.+?)(?: and \d+ more partitions)?(?: since|, stalled since)"
    )
    return [m.group(1) for m in pattern.finditer(log) if partition in m.group(2).split(", ")]


async def write_counting(
    writer: DivWriter, topic: str, acked: dict[int, list[tuple[int, float]]], rate: float, stop: asyncio.Event
) -> None:
    """Data records to every partition at `rate`, acks=all; `acked` lists per partition
    (records the partition holds, the START_OF_SEGMENT included, as the worker's validated
    count counts them; the loop time they were known acknowledged)."""
    loop = asyncio.get_running_loop()
    i = 0
    pending: list[tuple[int, asyncio.Future]] = []

    def note(partition: int, future: asyncio.Future) -> None:
        held = future.result().offset + 1
        acks = acked.setdefault(partition, [])
        if not acks or held > acks[-1][0]:
            acks.append((held, loop.time()))

    while not stop.is_set():
        partition = i % PARTITIONS
        pending.append((partition, await writer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=partition)))
        i += 1
        for partition, future in [p for p in pending if p[1].done()]:
            if future.exception() is None:
                note(partition, future)
        pending = [p for p in pending if not p[1].done()]
        await asyncio.sleep(1 / rate)
    for partition, future in pending:
        await future
        note(partition, future)


@pytest.mark.parametrize("frozen", ["leader", "follower"])
async def test_a_frozen_node_under_a_running_worker_is_said_or_ridden_out_never_silent(frozen, three_nodes, tmp_path):
    """The leader of the watched partitions, or a follower under acks=all and
    min.insync.replicas=2, frozen (SIGSTOP) for 45 s while a worker validates: at no moment
    does the worker stand still behind acknowledged records for longer than its stall bound
    without /health saying `stalled` (measured from when the records were acknowledged);
    after SIGCONT it catches up within seconds, and a
    clean, idempotent acks=all stream gives no incident."""
    cluster = three_nodes
    topic = f"frozen-{frozen}-{uuid.uuid4().hex[:8]}"
    await new_topic(cluster.bootstrap, NewTopic(topic, PARTITIONS, 3, topic_configs={"min.insync.replicas": "2"}))
    worker = worker_for(cluster.bootstrap, topic, tmp_path, web_port=free_port())
    stall_s = 15
    freeze_s = 45
    worker.extra_env.update(
        {"KDIV_STALL_S": str(stall_s), "KDIV_BROKER_TIMEOUT_S": "10", "KDIV_COMMIT_TIMEOUT_S": "15"}
    )
    writer = await DivWriter.start(cluster.bootstrap, producer_options={"acks": "all", "enable_idempotence": True})
    acked: dict[int, list[tuple[int, float]]] = {}
    stop = asyncio.Event()
    writing = None
    victim = None
    try:
        worker.start()
        await worker.wait_ready()
        writing = asyncio.create_task(write_counting(writer, topic, acked, 50, stop))
        await asyncio.sleep(5)
        leader = await leader_of(cluster.bootstrap, topic, 0)
        victim = leader if frozen == "leader" else next(n.node_id for n in cluster.nodes if n.node_id != leader)
        cluster.pause_node(victim)
        # The probes' margin over the bound: a log ends' poll (5 s) whose read may wait its
        # bound (10 s) before the backlog shows, a judgement (1 s), a probe (1 s) and load.
        silent = await never_silent(worker, topic, acked, freeze_s, stall_s + 5 + 10 + 3)
        cluster.resume_node(victim)
        victim = None
        assert silent == [], json.dumps(silent)
        stop.set()
        await writing
        await writer.end_segments(topic)
        await writer.close()

        async def caught_up() -> bool:
            ends = await exact_end_offsets(cluster.bootstrap, topic)
            validated = [await records_validated(worker, topic, p) for p in range(PARTITIONS)]
            return validated == [ends[p] for p in range(PARTITIONS)]

        await eventually("the worker validates everything after the thaw", caught_up, timeout=40)
        await wait_until_caught_up(cluster.bootstrap, worker.app_id, topic, workers=[worker], timeout=60)
        incidents = await read_incidents(cluster.bootstrap, worker.app_id)
        assert incidents == {}, latest(incidents)
        # A stall is one line when it begins and one when it ends (judged each second after
        # the commit that ends it), never a flood.

        async def each_stall_ended() -> bool:
            log = worker.log_text()
            # Partitions stalled together are one line; each partition's lines alternate.
            lines = [stall_lines(log, f"{topic}[{partition}]") for partition in range(PARTITIONS)]
            return all(each.count("stalled") == each.count("resumed") for each in lines)

        await eventually("a line for each stall that ended", each_stall_ended, timeout=15)
        log = worker.log_text()
        # A freeze may hold the worker more than once (records validated between two waits on
        # the frozen node, as when the ISR shrinks): each stall is still one line each way, so
        # per partition the lines alternate, and there are at most as many stalls as bounds
        # fit in the freeze.
        for partition in range(PARTITIONS):
            lines = stall_lines(log, f"{topic}[{partition}]")
            assert lines == ["stalled", "resumed"] * (len(lines) // 2), (partition, lines, log[-3000:])
            assert len(lines) // 2 <= 1 + freeze_s // stall_s, (partition, lines, log[-3000:])
        assert worker.alive, worker.log_tail()
    finally:
        stop.set()
        if writing is not None and not writing.done():
            writing.cancel()
        await close_quietly(writer)
        if victim is not None:
            cluster.resume_node(victim)
        worker.terminate()
