"""`kdiv dump`: a live topic as the JSON Lines `kdiv check` reads."""

from __future__ import annotations

from typing import TextIO

from kdiv.config.security import PLAINTEXT, KafkaSecurity
from kdiv.kafka.consume import read_snapshot
from kdiv.offline.jsonl import record_to_line


async def dump_topic(
    bootstrap: str, topic: str, out: TextIO, partitions=None, *, security: KafkaSecurity = PLAINTEXT
) -> int:
    count = 0
    async for record in read_snapshot(bootstrap, topic, partitions, security=security):
        out.write(record_to_line(record) + "\n")
        count += 1
    out.flush()
    return count
