"""A traced source and a pair of faulty processors: the pipeline the audit tests judge."""

from __future__ import annotations

import asyncio

from kdiv.dev.processor import FaultyProcessor
from kdiv.writer import DivWriter


async def produce_traced(bootstrap: str, topic: str, stop: asyncio.Event, rate: float = 300.0) -> int:
    """Every record traced, until `stop`; returns how many were written."""
    writer = await DivWriter.start(bootstrap, tracing="*=1", max_records_per_segment=500)
    written = 0
    try:
        while not stop.is_set():
            await writer.send(topic, b"v%d" % written, b"k%d" % written)
            written += 1
            await asyncio.sleep(1 / rate)
        await writer.flush()
    finally:
        await writer.close()
    return written


def processor_pair(
    bootstrap: str, source: str, sink: str, group: str, fault: str, linger_s: float
) -> tuple[FaultyProcessor, FaultyProcessor]:
    """Two instances of one group: large batches, so a rebalance catches a buffer; every third
    batch written twice with fault "duplicate"."""
    first, second = (
        FaultyProcessor(
            bootstrap,
            source,
            sink,
            group,
            name=name,
            fault=fault,
            batch_size=10_000,
            linger_s=linger_s,
            duplicate_every=3,
        )
        for name in ("p1", "p2")
    )
    return first, second
