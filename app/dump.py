"""`kdiv dump`: a live topic as the JSON Lines `kdiv check` reads."""

from __future__ import annotations

from typing import TextIO

from .consume import read_snapshot
from .jsonl import record_to_line
from .security import PLAINTEXT, KafkaSecurity


async def dump_topic(bootstrap: str, topic: str, out: TextIO, partitions=None, *, security: KafkaSecurity = PLAINTEXT) -> int:
    count = 0
    async for record in read_snapshot(bootstrap, topic, partitions, security=security):
        out.write(record_to_line(record) + "\n")
        count += 1
    out.flush()
    return count
