"""Validator state at scale: memory per producer-partition, and the time to load it after a takeover.

    python bench/state.py [--producer-partitions 1000000] [--partitions 8] [--max-age-ms 3600000]
    python bench/state.py --new-producers 200000 [--records-each 1] [--seq-window 8]

Builds the table entries a worker would hold for N producer-partitions (each producer a
GUID with a mid-segment ADHASH state, as many short-lived producers leave behind) spread over
K partitions of one topic, then, in this process:

1. the baseline: decoding every value with the worker's own codec (fastavro), nothing kept;
2. loading them the way a worker does when it is assigned the partitions
   (`LiveValidation.load_many` over the table's items), timed, and the resident memory it
   adds (VmRSS before and after, the entries themselves excluded) per producer-partition;
3. expiry: records whose timestamps are past KDIV_MAX_AGE_MS of every saved producer, and
   two checkpoints (the first sets the data-relative anchor): how many producer states remain.

With --new-producers N: N producers never seen before, each sending --records-each records,
validated the way the worker's batch path does (`validate_run`, 2,000 records a call), and
the memory the partitions' trackers hold per producer-partition (tracemalloc, and VmRSS
before and after), right after validation and once two checkpoints have packed them as
idle, with a breakdown of one producer's share by object. The baseline, in the same run:
the same validation with no bound on unpacked producers (`UNPACKED_MAX`), plus the dict of
per-producer marks the tracker kept beside them before (the previous layout).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kdiv.div import tracker as tracker_module  # noqa: E402
from kdiv.div.record import ConsumedRecord  # noqa: E402
from kdiv.div.segment import Segment  # noqa: E402
from kdiv.div.stamper import DivStamper  # noqa: E402
from kdiv.div.validator import DEFAULT_WINDOW, DataIntegrityValidator, PartitionValidation  # noqa: E402
from kdiv.div.wire import ChecksumType  # noqa: E402
from kdiv.state.tables import partition_key, producer_key  # noqa: E402
from kdiv.state.values import StateValues  # noqa: E402
from kdiv.worker.live import LiveValidation  # noqa: E402
from tests.harness.streams import NOW, Log  # noqa: E402

TOPIC = "orders"
SCHEMA_ID = 1


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def table_items(
    producer_partitions: int, partitions: int, values: StateValues, window: int
) -> list[tuple[bytes, bytes]]:
    rng = random.Random(7)
    items = [(partition_key(TOPIC, p), values.encode(PartitionValidation())) for p in range(partitions)]
    for i in range(producer_partitions):
        segment = Segment(rng.randrange(1 << 16), rng.randrange(1 << 31), ChecksumType.ADHASH)
        segment.started = segment.registered = True
        segment.checksum = rng.getrandbits(64)
        segment.last_offset = rng.randrange(1 << 40)
        segment.last_producer_ts = NOW - rng.randrange(86_400_000)
        if window:  # a full ring of recent CRCs, as the exact semantics keeps
            segment.recent = [rng.getrandbits(64) for _ in range(window)]
        items.append((producer_key(TOPIC, i % partitions, rng.randbytes(16)), values.encode(segment)))
    return items


def new_producer_streams(producers: int, records_each: int, partitions: int) -> dict[int, list[ConsumedRecord]]:
    """Per partition, the records of `producers` new producers (a START_OF_SEGMENT and
    `records_each` DATA records each), producer after producer."""
    rng = random.Random(11)
    streams: dict[int, list[ConsumedRecord]] = {p: [] for p in range(partitions)}
    for i in range(producers):
        partition = i % partitions
        stream = streams[partition]
        stamper = DivStamper(rng.randbytes(16))
        for n in range(records_each):
            for out in stamper.data(TOPIC, partition, b"k%d" % n, b"v", NOW):
                stream.append(ConsumedRecord(TOPIC, partition, len(stream), NOW, out.key, out.value, out.headers))
    return streams


def _object_bytes(obj: object, seen: set[int]) -> int:
    """sys.getsizeof of `obj` and of what it holds (ints, lists, bytes), each object once."""
    if id(obj) in seen or obj is None or isinstance(obj, bool) or (isinstance(obj, int) and -5 <= obj <= 256):
        return 0  # shared singletons and small ints cost nothing per producer
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, list):
        size += sum(_object_bytes(item, seen) for item in obj)
    elif hasattr(obj, "__slots__") and not isinstance(obj, (bytes, int)):
        for name in type(obj).__slots__:
            size += _object_bytes(getattr(obj, name, None), seen)
    return size


def breakdown(tracker: object) -> list[tuple[str, float]]:
    """One producer's share of its tracker's memory, by object (sys.getsizeof; allocator
    rounding not included)."""
    segments = tracker.segments  # type: ignore[attr-defined]
    n = max(len(segments), 1)
    guid, state = next(iter(segments.items()))
    rows: list[tuple[str, float]] = []
    if isinstance(state, Segment):
        rows.append(("GUID key (bytes object)", sys.getsizeof(guid)))
        seen: set[int] = set()
        rows.append(("Segment object (slots)", sys.getsizeof(state)))
        rows.append(
            (
                "  its int fields",
                sum(_object_bytes(getattr(state, f), seen) for f in Segment.__slots__ if f != "recent"),
            )
        )
        rows.append(("  the seq window (list and its ints)", _object_bytes(state.recent, seen)))
    elif isinstance(segments, dict):
        rows.append(("GUID key (bytes object)", sys.getsizeof(guid)))
        rows.append(("packed state (bytes object)", sys.getsizeof(state)))
    else:
        rows.append(("  one entry in a bucket: GUID, packed state, lengths", 1 + len(guid) + 2 + len(state)))
    active = getattr(segments, "active", None)
    if isinstance(active, dict):
        rows.append(("tracker.segments.active: dict share", sys.getsizeof(active) / n))
        buckets = segments._buckets
        if buckets:
            held = sum(sys.getsizeof(b) for b in buckets.values()) + sys.getsizeof(buckets)
            rows.append(("idle: buckets and their dict, all told", held / n))
    return rows


def _validate_new(
    streams: dict[int, list[ConsumedRecord]], window: int, unpacked_max: int
) -> tuple[DataIntegrityValidator, float]:
    validator = DataIntegrityValidator(window=window)
    start = time.perf_counter()
    with mock.patch.object(tracker_module, "UNPACKED_MAX", unpacked_max):
        for partition, stream in streams.items():
            # In fetches of 2,000, as the worker's batch path hands them over.
            for at in range(0, len(stream), 2_000):
                validator.validate_run(TOPIC, partition, stream[at : at + 2_000], 0, NOW, set(), set(), [])
    return validator, time.perf_counter() - start


def _checkpoint_twice(validator: DataIntegrityValidator, partitions: int) -> None:
    for _ in range(2):
        for partition in range(partitions):
            validator.checkpoint(TOPIC, partition)


def measure_new_producers(producers: int, records_each: int, partitions: int, window: int) -> None:
    streams = new_producer_streams(producers, records_each, partitions)
    print(
        f"{producers:,} new producers over {partitions} partitions, {records_each} DATA record(s) each, "
        f"a window of {window} recent seqs"
    )
    # VmRSS first, untraced (tracemalloc's own records would count in it), in a process that
    # has not yet freed memory its allocator would reuse.
    gc.collect()
    rss_before = resident_bytes()
    validator, validate_s = _validate_new(streams, window, tracker_module.UNPACKED_MAX)
    gc.collect()
    rss_active = resident_bytes() - rss_before
    start = time.perf_counter()
    _checkpoint_twice(validator, partitions)
    packed_s = time.perf_counter() - start
    gc.collect()
    rss_idle = resident_bytes() - rss_before
    del validator
    # The baseline, in this run: every new producer kept unpacked until a checkpoint (no
    # bound), with the dict of per-producer marks the tracker kept beside them until now.
    unbounded = 1 << 62
    # Timed with the two checkpoints that pack every producer: both layouts pack each once.
    unbounded_validator, baseline_s = _validate_new(streams, window, unbounded)
    start = time.perf_counter()
    _checkpoint_twice(unbounded_validator, partitions)
    baseline_s += time.perf_counter() - start
    del unbounded_validator
    gc.collect()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    validator, _ = _validate_new(streams, window, unbounded)
    marks = [dict.fromkeys(validator.partitions[(TOPIC, p)].tracker.segments.active, -1) for p in streams]
    gc.collect()
    baseline = tracemalloc.get_traced_memory()[0] - traced_before
    rows_baseline = breakdown(validator.partitions[(TOPIC, 0)].tracker)
    rows_baseline.append(("the previous layout's dict of marks: share", sys.getsizeof(marks[0]) / len(marks[0])))
    del validator, marks
    gc.collect()
    tracemalloc.stop()

    gc.collect()
    print(
        f"  validated and checkpointed twice in {validate_s + packed_s:.2f} s, "
        f"{(validate_s + packed_s) / baseline_s:.2f}x the unbounded baseline's {baseline_s:.2f} s"
    )

    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    validator, _ = _validate_new(streams, window, tracker_module.UNPACKED_MAX)
    gc.collect()
    active = tracemalloc.get_traced_memory()[0] - traced_before
    rows_active = breakdown(validator.partitions[(TOPIC, 0)].tracker)
    unpacked = sum(len(validator.partitions[(TOPIC, p)].tracker.segments.active) for p in streams)
    _checkpoint_twice(validator, partitions)
    gc.collect()
    idle = tracemalloc.get_traced_memory()[0] - traced_before
    rows_idle = breakdown(validator.partitions[(TOPIC, 0)].tracker)
    held = sum(len(validator.partitions[(TOPIC, p)].tracker.segments) for p in streams)
    assert held == producers, (held, producers)
    # The idle states as a dict of GUID -> packed bytes, as the tracker kept them before it
    # packed them into shared buckets.
    traced_before = tracemalloc.get_traced_memory()[0]
    as_dicts = [dict(validator.partitions[(TOPIC, p)].tracker.segments.items()) for p in streams]
    gc.collect()
    dict_baseline = tracemalloc.get_traced_memory()[0] - traced_before
    del as_dicts
    tracemalloc.stop()
    print(
        f"  baseline: all unpacked until a checkpoint: {baseline / producers:.0f} bytes per producer-partition traced"
    )
    for what, size in rows_baseline:
        print(f"      {what:<44} {size:7.1f}")
    for label, traced, rss, rows in (
        (
            f"right after validation ({unpacked:,} unpacked, at most about 2x the shared bound, UNPACKED_MAX "
            f"{tracker_module.UNPACKED_MAX} over all partitions, at least UNPACKED_MIN {tracker_module.UNPACKED_MIN} each)",
            active,
            rss_active,
            rows_active,
        ),
        ("idle, after two checkpoints", idle, rss_idle, rows_idle),
    ):
        per = traced / producers
        print(
            f"  {label}: {per:.0f} bytes per producer-partition traced ({traced / baseline:.2f}x the baseline), "
            f"{rss / producers:.0f} by VmRSS; goal <= 150: {'met' if per <= 150 else 'NOT met'}"
        )
        for what, size in rows:
            print(f"      {what:<44} {size:7.1f}")
    print(
        f"  the same idle states in a dict of GUID -> packed bytes: {dict_baseline / producers:.0f} bytes "
        f"per producer-partition; buckets take {idle / dict_baseline:.2f}x that"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producer-partitions", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--max-age-ms", type=int, default=3_600_000)
    parser.add_argument(
        "--seq-window", type=int, default=DEFAULT_WINDOW, help="recent CRCs per producer (exact semantics; 0: none)"
    )
    parser.add_argument("--new-producers", type=int, default=0, help="measure N new producers instead")
    parser.add_argument("--records-each", type=int, default=1, help="DATA records per new producer")
    args = parser.parse_args()
    if args.new_producers:
        measure_new_producers(args.new_producers, args.records_each, args.partitions, args.seq_window)
        return

    values = StateValues(SCHEMA_ID)
    items = table_items(args.producer_partitions, args.partitions, values, args.seq_window)
    wanted = {(TOPIC, p) for p in range(args.partitions)}
    print(
        f"{args.producer_partitions:,} producer-partitions over {args.partitions} partitions, "
        f"a ring of {args.seq_window} recent CRCs each, "
        f"{sum(len(k) + len(v) for k, v in items) / len(items):.0f} bytes of key and value each in the table"
    )

    start = time.perf_counter()
    for _key, value in items:
        values.decode(value)
    decode_s = time.perf_counter() - start
    print(f"baseline, decoding every value: {decode_s:.2f} s")

    gc.collect()
    before = resident_bytes()
    live = LiveValidation(DataIntegrityValidator(max_age_ms=args.max_age_ms, window=args.seq_window), values)
    start = time.perf_counter()
    live.load_many(wanted, items)
    load_s = time.perf_counter() - start
    gc.collect()
    added = resident_bytes() - before
    loaded = sum(len(live.validator.partitions[tp].tracker.segments) for tp in wanted)
    assert loaded == args.producer_partitions, (loaded, args.producer_partitions)
    print(
        f"load (LiveValidation.load_many): {load_s:.2f} s, {load_s / decode_s:.2f}x the decode alone; "
        f"goal <= 30 s at 1M: {'met' if load_s <= 30 * args.producer_partitions / 1e6 else 'NOT met'}"
    )
    per = added / args.producer_partitions
    print(
        f"resident memory added: {added / 2**20:,.0f} MiB, {per:.0f} bytes per producer-partition; "
        f"goal <= 150: {'met' if per <= 150 else 'NOT met'}"
    )

    # Expiry is data-relative: a checkpoint expires producers older than max age before the
    # newest record the previous checkpoint saw (Venice's rule). So: two rounds of a new
    # producer's records, past every saved state by max age, and a checkpoint after each.
    stamper = DivStamper(b"\xee" * 16)
    log = Log(TOPIC)
    remaining = 0
    for late in (NOW + args.max_age_ms + 1, NOW + args.max_age_ms + 2):
        for p in range(args.partitions):
            for record in log.add_outgoing(stamper.data(TOPIC, p, b"k", b"v", late), timestamp=late):
                live.process(record, late)
        remaining = sum(len(live.validator.checkpoint(topic, p).upserts) for topic, p in sorted(wanted))
    print(
        f"after records {args.max_age_ms} ms past them (KDIV_MAX_AGE_MS) and two checkpoints: "
        f"{remaining:,} producer states remain of {args.producer_partitions + args.partitions:,}"
    )


if __name__ == "__main__":
    main()
