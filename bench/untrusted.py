"""Untrusted JSON: `kdiv.untrusted.parse_json` (depth counted, then parsed) against `json.loads`
alone on the same input, for the shapes that cost the depth count most.

    python bench/untrusted.py [--sizes 4096,16384,65536,262144,1048576] [--runs 5] [--before]

Each shape is built at each size (bytes), with more than MAX_DEPTH brackets so the depth is
counted. Some are refused (deeper than MAX_DEPTH, or not JSON), where json.loads stops at the
first fault; the others are JSON within the bound, which json.loads parses whole. Times are
the best of --runs, each run repeating the call for 20 ms or more, the two parsers' runs
interleaved.

Figures: microseconds per call of each, the ratio parse_json/json.loads at each size (what
the bound costs over parsing alone), and the scaling of parse_json: its time per byte at the
largest size over its time per byte at the smallest (1.0 is linear; the count before this
one was quadratic on an unclosed run of \\", 12.7 s at 40 KB). --before also times that count
(`before_parse_json`, kept here) at the sizes up to 16 KB, as before/after.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "app"))

from kdiv.untrusted import MAX_DEPTH, UntrustedJSONError, parse_json

DEEP = b"[" * (MAX_DEPTH + 1)  # one level past the bound: refused once counted
# MAX_DEPTH levels and one more opening bracket than MAX_DEPTH, so the depth is counted:
# WITHIN, then the array holding the shape's content after two empty arrays, then CLOSE.
WITHIN = b"[" * (MAX_DEPTH - 2) + b"[[],[],"
CLOSE = b"]" * (MAX_DEPTH - 1)


_BEFORE_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BEFORE_BRACKET = re.compile(rb"[\[\]{}]")
BEFORE_MAX_SIZE = 16_384


def before_parse_json(raw: bytes) -> object:
    """parse_json as it counted the depth before: closed strings cut by a pattern that, at
    each quote of an unclosed string, reads to the end and fails."""
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        depth = deepest = 0
        for bracket in _BEFORE_BRACKET.finditer(_BEFORE_STRING.sub(b"", raw)):
            depth += 1 if bracket.group() in (b"[", b"{") else -1
            deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            raise UntrustedJSONError(f"JSON nests {deepest} levels deep")
    return json.loads(raw)


def _repeat(piece: bytes, size: int, fixed: int) -> bytes:
    return piece * max(1, (size - fixed) // len(piece))


def _ticdc_schema(size: int) -> bytes:
    """A TiCDC Simple bootstrap message: a table schema of many columns, ~180 bytes each."""
    columns: list[dict[str, object]] = []
    while len(json.dumps(columns)) < size - 300:
        n = len(columns)
        columns.append(
            {
                "name": f"column_{n}",
                "dataType": {"mysqlType": "varchar", "charset": "utf8mb4", "collate": "utf8mb4_bin", "length": 255},
                "nullable": n % 2 == 0,
                "default": None if n % 3 else f'say "{n}" [x]',
            }
        )
    message = {
        "version": 1,
        "type": "BOOTSTRAP",
        "commitTs": 1,
        "buildTs": 2,
        "tableSchema": {"database": "demo", "table": "wide", "tableID": 7, "version": 3, "columns": columns},
    }
    return json.dumps(message).encode()


# name -> (what it is, builder of about `size` bytes)
SHAPES: dict[str, tuple[str, Callable[[int], bytes]]] = {
    "escaped-quotes": (
        'refused: an unclosed run of \\" (quadratic before)',
        lambda n: DEEP + b'"' + _repeat(b'\\"', n, len(DEEP) + 1),
    ),
    "quotes": ("refused: a run of quotes, the last unclosed", lambda n: DEEP + _repeat(b'"', n, len(DEEP) + 1) + b'"'),
    "deep": ("refused: n/2 [ then n/2 ]", lambda n: b"[" * (n // 2) + b"]" * (n // 2)),
    "unclosed-brackets": (
        "refused: brackets inside an unclosed string",
        lambda n: DEEP + b'"' + _repeat(b"[{", n, len(DEEP) + 1),
    ),
    "empty-strings": (
        'JSON: ["","",...] at the bound',
        lambda n: WITHIN + _repeat(b'"",', n, 140) + b'""' + CLOSE,
    ),
    "empty-arrays": ("JSON: [[],[],...] (every byte a bracket)", lambda n: b"[" + _repeat(b"[],", n, 4) + b"[]]"),
    "long-string": (
        'JSON: one string of "a" at the bound',
        lambda n: WITHIN + b'"' + _repeat(b"a", n, 140) + b'"' + CLOSE,
    ),
    "backslashes": (
        "JSON: one string of escaped backslashes",
        lambda n: WITHIN + b'"' + _repeat(b"\\\\", n, 140) + b'"' + CLOSE,
    ),
    "brackets-in-string": (
        "JSON: one string of [{ at the bound",
        lambda n: WITHIN + b'"' + _repeat(b"[{", n, 140) + b'"' + CLOSE,
    ),
    "ticdc-schema": ("JSON: a TiCDC Simple table schema", _ticdc_schema),
}


def _call_or_fail(parse: Callable[[bytes], object], raw: bytes) -> None:
    try:
        parse(raw)
    except (ValueError, RecursionError):  # UntrustedJSONError is a ValueError
        pass


def _calls_for(parse: Callable[[bytes], object], raw: bytes) -> int:
    """How many calls take 20 ms or more."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            _call_or_fail(parse, raw)
        if time.perf_counter() - start >= 0.02:
            return calls
        calls *= 2


def best_seconds_per_call(parsers: list[Callable[[bytes], object]], raw: bytes, runs: int) -> list[float]:
    """The best time per call of each parser, their runs interleaved so that a machine busy
    with something else slows them alike."""
    calls = [_calls_for(parse, raw) for parse in parsers]
    best = [float("inf")] * len(parsers)
    for _ in range(runs):
        for index, parse in enumerate(parsers):
            gc.collect()
            start = time.perf_counter()
            for _ in range(calls[index]):
                _call_or_fail(parse, raw)
            best[index] = min(best[index], (time.perf_counter() - start) / calls[index])
    return best


def outcome(raw: bytes) -> str:
    try:
        parse_json(raw)
    except UntrustedJSONError as bad:
        return "refused: " + str(bad)[:60]
    return "parsed"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="4096,16384,65536,262144,1048576", help="input sizes in bytes")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="which shapes, comma-separated")
    parser.add_argument(
        "--before", action="store_true", help=f"also time the count before, up to {BEFORE_MAX_SIZE:,} B"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"MAX_DEPTH {MAX_DEPTH}; best of {args.runs} runs; us per call; ratio = parse_json / json.loads")
    worst_ratio = worst_scaling = 0.0
    for name in args.shapes.split(","):
        what, build = SHAPES[name]
        print(f"\n{name}: {what}")
        per_byte = []  # of the sizes whose depth is counted
        for size in sizes:
            raw = build(size)
            before = args.before and len(raw) <= BEFORE_MAX_SIZE
            parsers: list[Callable[[bytes], object]] = [parse_json, json.loads]
            if before:
                parsers.append(before_parse_json)
            ours, plain, *then = best_seconds_per_call(parsers, raw, args.runs)
            counted = raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
            if counted:
                per_byte.append(ours / len(raw))
            ratio = ours / plain
            worst_ratio = max(worst_ratio, ratio)
            print(
                f"  {len(raw):>9,} B  parse_json {ours * 1e6:>10.1f}  json.loads {plain * 1e6:>10.1f}"
                f"  ratio {ratio:>7.2f}  ({outcome(raw)}{'' if counted else '; too few brackets to count'})"
            )
            if then:
                print(f"  {'':>9}    before     {then[0] * 1e6:>10.1f}  before/after {then[0] / ours:>9.1f}")
        if len(per_byte) > 1:
            scaling = per_byte[-1] / per_byte[0]
            worst_scaling = max(worst_scaling, scaling)
            print(f"  scaling (time per byte, largest over smallest counted): {scaling:.2f}")
    print(f"\nworst scaling {worst_scaling:.2f}; worst ratio to json.loads {worst_ratio:.1f}")


if __name__ == "__main__":
    main()
