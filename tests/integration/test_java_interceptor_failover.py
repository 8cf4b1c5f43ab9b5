"""An acks=1 loss on a three-node cluster under records Apache Kafka's console producer wrote
with kdiv's interceptor (docs/java-producers.md). The expected seqs are read from the dead
leader's segment files and the elected log, never from kdiv's answer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from aiokafka.admin import NewTopic
from aiokafka.record.memory_records import MemoryRecords
from click.testing import CliRunner

from kdiv.cli import main
from kdiv.dev.broker import KafkaNode
from kdiv.div.wire import HEADER_NAME, decode
from tests.harness.broker import read_incidents, restore, wait_until_caught_up
from tests.harness.kafka_tools import ConsoleProducerProcess
from tests.harness.processes import WorkerProcess
from tests.integration.test_broker_failover import eventually, leader_of, new_topic, resume_until_one_leads
from tests.integration.test_java_interceptor_faults import latest, seqs_by_producer, wait_for_end

# alone: it measures how long the worker or a producer takes under a frozen or killed broker.
pytestmark = [pytest.mark.broker, pytest.mark.alone]


def on_disk(node: KafkaNode, topic: str) -> dict[int, int]:
    """Offset -> seq of every record in a node's log of `topic`[0], read from its segment
    files: what the node holds, beyond the high watermark too (a consumer reads up to it
    only). A batch still being appended at the tail is left out."""
    held = {}
    for segment in sorted((node.log_dir / f"{topic}-0").glob("*.log")):
        records = MemoryRecords(segment.read_bytes())
        while (batch := records.next_batch()) is not None:
            if batch.is_control_batch:
                continue
            for record in batch:
                held[record.offset] = decode(dict(record.headers)[HEADER_NAME]).seq
    return held


async def test_acks_1_records_lost_with_their_leader_are_exactly_the_missing_seqs_of_a_java_producer(
    three_nodes, tmp_path
):
    """As test_broker_failover's acks=1 case, the records written by a console producer with
    the interceptor: both followers paused, the leader takes records alone and is killed, a
    follower is elected cleanly, the producer goes on. The loss is what the dead leader's
    segment files hold and the elected log does not; the worker and `kdiv check` name
    exactly those seqs MISSING."""
    cluster = three_nodes
    topic = f"java-acks1-{uuid.uuid4().hex[:8]}"
    await new_topic(cluster.bootstrap, NewTopic(topic, 1, 3))
    survivors = cluster.bootstrap
    worker = None
    try:
        with ConsoleProducerProcess(cluster.bootstrap, topic, acks="1", **{"enable.idempotence": "false"}) as producer:
            producer.send([f"replicated-{i}" for i in range(100)])
            await wait_for_end(cluster.bootstrap, topic, 100)  # the high watermark: all three hold them

            leader = await leader_of(cluster.bootstrap, topic, 0)
            followers = [node.node_id for node in cluster.nodes if node.node_id != leader]
            for follower in followers:
                cluster.pause_node(follower)
            producer.send([f"leader-only-{i}" for i in range(50)])
            deadline = time.monotonic() + 60
            while len(on_disk(cluster.node(leader), topic)) < 150:
                assert time.monotonic() < deadline, "the leader did not append the records it takes alone"
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # its acknowledgements reach the producer (ms on loopback)
            cluster.kill_node(leader)
            dead_leader_held = on_disk(cluster.node(leader), topic)
            survivors = await resume_until_one_leads(cluster, topic, followers)
            producer.send([f"after-{i}" for i in range(50)])
            producer.close()

        # acks=1: the new leader acknowledged the last records before its follower fetched
        # them, and a reader sees them only once the high watermark passes them.
        read: dict = {}  # the last read

        async def last_sent_readable() -> bool:
            read.clear()
            read.update(await seqs_by_producer(survivors, topic))
            return any(199 in seqs for seqs in read.values())

        await eventually(f"the records sent after the election readable on {topic}[0]", last_sent_readable)
        (guid, held), *others = read.items()
        assert others == [], others
        assert sorted(dead_leader_held) == list(range(150)), sorted(dead_leader_held)
        lost = sorted(set(dead_leader_held.values()) - set(held))
        # Nothing doubled, and what is lost is a run of what only the dead leader held (but
        # for the first few a follower's fetch may have taken before it stopped); the
        # producer went on after it, so the gap shows.
        assert sorted(held) == held and len(set(held)) == len(held), held
        assert lost and lost == list(range(lost[0], 150)) and lost[0] >= 100, lost
        assert set(held) | set(lost) == set(range(200)), held

        path = tmp_path / f"{topic}.jsonl"
        # The CLI runs its own event loop: off this test's.
        dumped = await asyncio.to_thread(
            CliRunner().invoke, main, ["dump", topic, "--bootstrap", survivors, "-o", str(path)]
        )
        assert dumped.exit_code == 0, dumped.output
        checked = await asyncio.to_thread(CliRunner().invoke, main, ["check", str(path)])
        assert checked.exit_code == 1, checked.stderr
        n = len(held)
        assert f"{n} records (OK {n - 1}, MISSING 1); 1 faults, 0 fatal" in checked.stderr, checked.stderr
        (line,) = [json.loads(s) for s in checked.stdout.splitlines() if json.loads(s)["verdict"] != "OK"]
        assert (line["verdict"], line["gap"]["first"], line["gap"]["last"]) == ("MISSING", lost[0], lost[-1]), line

        # The dead node back (it truncates to the elected log): the worker's own topics are
        # replicated three times.
        restore(cluster)
        worker = WorkerProcess(
            "w",
            bootstrap=cluster.bootstrap,
            topics=[topic],
            app_id=f"java-acks1-{uuid.uuid4().hex[:8]}",
            workdir=tmp_path,
            env={"KDIV_REPLICATION_FACTOR": "3"},
        )
        worker.start()
        await worker.wait_ready()
        await wait_until_caught_up(cluster.bootstrap, worker.app_id, topic, workers=[worker], timeout=90)
        incidents = latest(await read_incidents(cluster.bootstrap, worker.app_id))
        assert [(i.verdict, i.producer, i.segment, i.seq) for i in incidents] == [
            ("MISSING", guid.hex(), 0, lost[0])
        ], incidents
        assert f"seq {lost[0]}..{lost[-1]}" in incidents[0].detail, incidents[0]
        assert incidents[0].offset == line["offset"], incidents[0]
    finally:
        if worker is not None:
            worker.terminate()
