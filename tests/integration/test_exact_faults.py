"""A reordered record, a duplicate and a divergent re-send, and a lost record inside a push, on
a real broker, under two workers: one with the exact semantics (the default), one with
Venice's. Each must report exactly its semantics' incidents."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

from aiokafka import AIOKafkaProducer

from kdiv.div.stamper import DivStamper, OutgoingRecord
from kdiv.div.wire import HEADER_NAME, Kind, decode, encode, record_crc
from tests.harness.broker import read_incidents, wait_until_caught_up
from tests.harness.processes import WorkerProcess

A, B, C, PUSHER = (uuid.UUID(int=n).bytes for n in (0xA, 0xB, 0xC, 0xD))


def restamped(record: OutgoingRecord, value: bytes) -> OutgoingRecord:
    """`record` with another value under the same producer, segment and seq (a producer bug)."""
    header = decode(dict(record.headers)[HEADER_NAME])
    header = header._replace(crc=record_crc(Kind.DATA, record.key, value))
    return replace(record, value=value, headers=((HEADER_NAME, encode(header)),))


async def produce_the_faults(bootstrap: str, topic: str) -> dict[str, int]:
    """Writes the scenarios; the offsets of the records the incidents name, by label."""
    now = int(time.time() * 1000)
    a, b, c, pusher = (DivStamper(g, max_records_per_segment=10_000) for g in (A, B, C, PUSHER))
    a_out = [r for i in range(8) for r in a.data(topic, 0, b"a%d" % i, b"va%d" % i, now)]  # SOS, seq 1..8
    a_out += a.end_segment(topic, 0, False, now)  # seq 9
    b_out = [r for i in range(3) for r in b.data(topic, 0, b"b%d" % i, b"vb%d" % i, now)]  # SOS, seq 1..3
    c_out = [r for i in range(10) for r in c.data(topic, 1, b"c%d" % i, b"vc%d" % i, now)]  # SOS, seq 1..10
    plan: list[tuple[str, OutgoingRecord]] = [
        *[("", r) for r in a_out[:6]],  # SOS, seq 1..5
        ("a7", a_out[7]),  # seq 7 before seq 6
        ("a6", a_out[6]),
        *[("", r) for r in a_out[8:9]],  # seq 8
        ("a_eos", a_out[9]),
        *[("", r) for r in b_out],
        ("b3_again", b_out[3]),  # the same bytes again
        ("b3_divergent", restamped(b_out[3], b"another value")),
        *[("", r) for r in pusher.control(topic, 1, Kind.START_OF_PUSH, now)],
        *[("", r) for r in c_out[:4]],  # SOS, seq 1..3; seq 4 lost
        *[(f"c{i}", r) for i, r in zip(range(5, 11), c_out[5:], strict=True)],
        *[("", r) for r in pusher.control(topic, 1, Kind.END_OF_PUSH, now)],
    ]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    offsets: dict[str, int] = {}
    try:
        for label, r in plan:
            sent = await producer.send_and_wait(r.topic, r.value, r.key, partition=r.partition, headers=list(r.headers))
            if label:
                offsets[label] = sent.offset
    finally:
        await producer.stop()
    return offsets


async def final_incidents(bootstrap: str, app_id: str) -> set[tuple]:
    return {
        (i.verdict, i.producer, i.seq, i.offset, i.severity, i.resolved_at_ms is not None)
        for versions in (await read_incidents(bootstrap, app_id)).values()
        for i in versions[-1:]
    }


async def test_exact_and_venice_workers_report_their_own_incidents(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    apps = {name: f"{name}-{uuid.uuid4().hex[:8]}" for name in ("exact", "venice")}
    workers = [
        WorkerProcess(
            name,
            bootstrap=bootstrap,
            topics=[topic],
            app_id=app_id,
            workdir=tmp_path / name,
            env={"KDIV_SEMANTICS": name},
        )
        for name, app_id in apps.items()
    ]
    try:
        for worker in workers:
            worker.start()
        await asyncio.gather(*(w.wait_ready() for w in workers))
        at = await produce_the_faults(bootstrap, topic)
        for worker, app_id in zip(workers, apps.values(), strict=True):
            await wait_until_caught_up(bootstrap, app_id, topic, workers=[worker], timeout=90)
        a, b, c = A.hex(), B.hex(), C.hex()

        exact = await final_incidents(bootstrap, apps["exact"])
        assert exact == {
            # The reordered record: one MISSING, resolved when seq 6 arrived LATE; the
            # segment's checksum matched (no CORRUPT).
            ("MISSING", a, 6, at["a7"], "warning", True),
            ("LATE", a, 6, at["a6"], "warning", False),
            ("DUPLICATE", b, 3, at["b3_again"], "warning", False),
            ("DIVERGENT", b, 3, at["b3_divergent"], "warning", False),
            # The lost record inside the push: one incident, found by seq 5.
            ("MISSING", c, 4, at["c5"], "fatal", False),
        }, exact
        details = {
            i.verdict + str(i.seq) + i.producer: i.detail
            for v in (await read_incidents(bootstrap, apps["exact"])).values()
            for i in v[-1:]
        }
        assert "5 later records of the producer judged after it" in details["MISSING4" + c]
        assert f"all arrived late: seq 6 at offset {at['a6']}" in details["MISSING6" + a]

        venice = await final_incidents(bootstrap, apps["venice"])
        assert venice == {
            ("MISSING", a, 7, at["a7"], "warning", False),
            ("DUPLICATE", a, 6, at["a6"], "warning", False),
            ("CORRUPT", a, 9, at["a_eos"], "warning", False),
            # Both re-sends of seq 3 are one DUPLICATE (one key), the divergent one last.
            ("DUPLICATE", b, 3, at["b3_divergent"], "warning", False),
            *{("MISSING", c, seq, at[f"c{seq}"], "fatal", False) for seq in range(5, 11)},
        }, venice
    finally:
        for worker in workers:
            worker.terminate()
