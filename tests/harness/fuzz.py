"""A seeded stream of broken `div` headers around one well-formed producer, for fuzz tests.

Each record is either the well-formed producer's next record, or a record whose header is
broken in a way no decoder may accept (truncated, padded to a huge length, wrong version,
unknown kind, a bad START_OF_SEGMENT or END_OF_SEGMENT tail, a null value, two headers),
with random keys and values. The stream says which is which, so tests assert exact verdicts
without asking the code under test.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from kdiv.div.stamper import DivStamper, OutgoingRecord
from kdiv.div.wire import COMMON_SIZE, DATA_VERSIONS, HEADER_NAME, Kind

WELL_FORMED_GUID = uuid.UUID("00000000-0000-4000-8000-0000000000ff").bytes
NOW = 1_700_000_000_000
MUTATIONS = ("truncated", "huge", "version", "kind", "sos-tail", "eos-tail", "null", "two-headers", "short-random")


@dataclass(frozen=True)
class FuzzRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    mutation: str | None  # None: the well-formed producer's record


def _random_bytes(rng: random.Random, most: int) -> bytes | None:
    return None if rng.random() < 0.1 else rng.randbytes(rng.randrange(most))


def _key_and_value(rng: random.Random) -> tuple[bytes | None, bytes | None]:
    """Either may be null, not both: Kafka clients refuse a record with neither."""
    key, value = _random_bytes(rng, 40), _random_bytes(rng, 200)
    return key, value if key is not None or value is not None else b""


def fuzz_stream(count: int, seed: int, topic: str = "fuzz", partition: int = 0) -> list[FuzzRecord]:
    rng = random.Random(seed)
    good = DivStamper(WELL_FORMED_GUID, max_records_per_segment=50)
    other = DivStamper(uuid.UUID(int=rng.getrandbits(128)).bytes, max_records_per_segment=7)
    out: list[FuzzRecord] = []
    pending: list[OutgoingRecord] = []
    while len(out) < count:
        if not pending and rng.random() < 0.3:
            pending = good.data(topic, partition, *_key_and_value(rng), NOW)
        if pending and rng.random() < 0.5:
            r = pending.pop(0)
            out.append(FuzzRecord(r.key, r.value, tuple(r.headers), None))
            continue
        # A header of another producer, then broken.
        (source, *_rest) = other.data(topic, partition, *_key_and_value(rng), NOW)
        raw = dict(source.headers)[HEADER_NAME]
        assert raw is not None
        mutation = rng.choice(MUTATIONS)
        headers: tuple[tuple[str, bytes | None], ...]
        if mutation == "truncated":
            headers = ((HEADER_NAME, raw[: rng.randrange(len(raw))]),)
        elif mutation == "huge":
            headers = ((HEADER_NAME, raw + rng.randbytes(rng.randrange(1, 2048))),)
        elif mutation == "version":
            # Neither 1 nor 2 (an implicit segment's DATA, which decodes).
            headers = ((HEADER_NAME, bytes([rng.choice([b for b in range(256) if b not in DATA_VERSIONS])]) + raw[1:]),)
        elif mutation == "kind":
            codes = {int(k) for k in Kind}
            headers = (
                (HEADER_NAME, raw[:1] + bytes([rng.choice([b for b in range(256) if b not in codes])]) + raw[2:]),
            )
        elif mutation == "sos-tail":  # a START_OF_SEGMENT whose checksum type is neither 0 nor 4
            sos = bytearray(raw[:COMMON_SIZE] + b"\x00")
            sos[1] = int(Kind.START_OF_SEGMENT)
            sos[COMMON_SIZE] = rng.choice([b for b in range(256) if b not in (0, 4)])
            headers = ((HEADER_NAME, bytes(sos)),)
        elif mutation == "eos-tail":  # an END_OF_SEGMENT whose final flag is neither 0 nor 1
            eos = bytearray(raw[:COMMON_SIZE] + rng.randbytes(8) + bytes([rng.randrange(2, 256)]))
            eos[1] = int(Kind.END_OF_SEGMENT)
            headers = ((HEADER_NAME, bytes(eos)),)
        elif mutation == "null":
            headers = ((HEADER_NAME, None),)
        elif mutation == "two-headers":
            headers = ((HEADER_NAME, raw), ("trace", b"x"), (HEADER_NAME, raw))
        else:  # short-random: fewer bytes than any header has
            headers = ((HEADER_NAME, rng.randbytes(rng.randrange(COMMON_SIZE))),)
        out.append(FuzzRecord(source.key, source.value, headers, mutation))
    return out
