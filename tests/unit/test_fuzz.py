"""100 000 records with broken `div` headers around a well-formed producer: through the
validator and through `kdiv check`, no crash, every broken record MALFORMED at its offset,
and the well-formed producer judged as if it were alone."""

from __future__ import annotations

import json
import subprocess
import sys

from kdiv.div.faults import Verdict
from kdiv.div.record import ConsumedRecord
from kdiv.div.segment import as_segment
from kdiv.div.validator import DataIntegrityValidator
from kdiv.div.wire import HEADER_NAME
from kdiv.offline.jsonl import record_to_line
from tests.harness.fuzz import MUTATIONS, NOW, WELL_FORMED_GUID, FuzzRecord, fuzz_stream

COUNT = 100_000


def as_records(stream: list[FuzzRecord]) -> list[ConsumedRecord]:
    return [ConsumedRecord("fuzz", 0, offset, NOW, r.key, r.value, r.headers) for offset, r in enumerate(stream)]


def producer_state(validator: DataIntegrityValidator):
    s = as_segment(validator.partitions[("fuzz", 0)].tracker.segments[WELL_FORMED_GUID])
    return (s.segment_number, s.sequence_number, s.checksum, s.status, s.registered)


def test_broken_headers_are_malformed_at_their_offsets_and_nothing_else_moves(tmp_path):
    stream = fuzz_stream(COUNT, seed=20261125)
    # And one header of a mebibyte.
    stream.append(FuzzRecord(b"k", b"v", ((HEADER_NAME, b"\x01" * (1 << 20)),), "huge"))
    assert {r.mutation for r in stream} == {None, *MUTATIONS}
    records = as_records(stream)

    validator = DataIntegrityValidator()
    results = [validator.validate(r, NOW) for r in records]
    for fuzz, result in zip(stream, results, strict=True):
        if fuzz.mutation is None:
            assert (result.verdict, result.guid) == (Verdict.OK, WELL_FORMED_GUID), result
        else:
            assert result.verdict is Verdict.MALFORMED and result.detail, (fuzz.mutation, result)
    assert validator.partitions[("fuzz", 0)].records == len(records)

    alone = DataIntegrityValidator()
    kept = [r for r, fuzz in zip(records, stream, strict=True) if fuzz.mutation is None]
    assert {alone.validate(r, NOW).verdict for r in kept} == {Verdict.OK}
    assert producer_state(validator) == producer_state(alone)

    # kdiv check: one verdict line per record, in order, the same verdicts, exit 1 (faults).
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(record_to_line(r) for r in records) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "kdiv.cli", "check", str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["offset"], line["verdict"]) for line in lines] == [
        (r.record.offset, r.verdict.value) for r in results
    ]
    assert all(line["producer"] is None for line in lines if line["verdict"] == "MALFORMED")
    assert "Traceback" not in done.stderr
