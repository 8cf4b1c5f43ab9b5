"""Kafka's default partitioner for keyed records (murmur2, as the Java client places them), pure.

kdiv's writers choose a record's partition before sending it (a DIV sequence number is per
partition), and the worker places its trace observations; all agree with the Java client, with
aiokafka's default partitioner and with librdkafka's `murmur2_random`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_MURMUR_M = 0x5BD1E995
_WORDS: dict[int, struct.Struct] = {}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's `Utils.murmur2`, aiokafka's `murmur2`), unsigned.

    aiokafka's takes a byte at a time; this takes the key's 32-bit words in one unpack, about
    twice as fast: a writer hashes every keyed record, the worker every traced record's observation."""
    length = len(data)
    h = 0x9747B28C ^ length
    end = length & ~3
    words = _WORDS.get(end)
    if words is None:
        words = _WORDS[end] = struct.Struct(f"<{end // 4}I")
    for k in words.unpack_from(data):
        k = (k * _MURMUR_M) & 0xFFFFFFFF
        h = ((h * _MURMUR_M) & 0xFFFFFFFF) ^ (((k ^ (k >> 24)) * _MURMUR_M) & 0xFFFFFFFF)
    extra = length & 3
    if extra:
        if extra == 3:
            h ^= data[end + 2] << 16
        if extra >= 2:
            h ^= data[end + 1] << 8
        h = ((h ^ data[end]) * _MURMUR_M) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _MURMUR_M) & 0xFFFFFFFF
    return h ^ (h >> 15)


def keyed_partition(key: bytes, partitions: Sequence[int]) -> int:
    """The partition, among the topic's `partitions` (in order), that Kafka's default
    partitioner gives a record keyed `key`."""
    return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
