"""`kdiv check`, run as users run it: a subprocess reading a JSON Lines file."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kdiv.cli import main
from kdiv.div.stamper import DivStamper
from kdiv.div.wire import Kind
from kdiv.offline.jsonl import record_to_line
from tests.harness.streams import GUID_A, GUID_B, NOW, Log, corrupt_value


def run_check(path, *args, stdin: str | None = None):
    command = [sys.executable, "-m", "kdiv.cli", "check", *([str(path)] if path else []), *args]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return done.returncode, lines, done.stderr


@pytest.fixture
def faulty_file(tmp_path):
    """Writer output for two producers on two partitions, with one fault of each class injected."""
    log = Log("orders")
    a = DivStamper(GUID_A, max_records_per_segment=4)
    b = DivStamper(GUID_B)
    records = []
    for i in range(10):
        records += log.add_outgoing(a.data("orders", i % 2, b"a%d" % i, b"value-%d" % i, NOW + i))
        records += log.add_outgoing(b.data("orders", 0, b"b%d" % i, b"value-%d" % i, NOW + i))
    for p in (0, 1):
        records += log.add_outgoing(a.end_segment("orders", p, True, NOW + 100))
    records += log.add_outgoing(b.end_segment("orders", 0, True, NOW + 100))

    def pick(guid, seq, partition):
        for r in records:
            h = r.headers[-1][1]
            if (
                h[2:18] == guid
                and int.from_bytes(h[22:26], "big") == seq
                and r.partition == partition
                and h[1] == Kind.DATA
            ):
                return r
        raise LookupError

    lost = pick(GUID_B, 3, 0)
    corrupted = pick(GUID_B, 7, 0)
    duplicated = pick(GUID_A, 2, 1)
    stream = []
    for r in records:
        if r is lost:
            continue
        stream.append(corrupt_value(r) if r is corrupted else r)
        if r is duplicated:
            stream.append(r)
    path = tmp_path / "captured.jsonl"
    path.write_text("".join(record_to_line(r) + "\n" for r in stream))
    return path, stream, {"lost": lost, "corrupted": corrupted, "duplicated": duplicated}


def test_check_reports_exactly_the_injected_faults(faulty_file):
    path, stream, injected = faulty_file
    code, out, err = run_check(path)
    assert code == 1
    assert len(out) == len(stream)
    assert [(o["partition"], o["offset"]) for o in out] == [(r.partition, r.offset) for r in stream]
    faults = [(o["verdict"], o["producer"], o["seq"]) for o in out if o["verdict"] != "OK"]
    b, a = GUID_B.hex(), GUID_A.hex()
    assert faults == [
        ("DUPLICATE", a, 2),  # the re-delivered record, right after its original
        ("MISSING", b, 3),  # the gap of the lost seq 3, found by the record after it
        ("CORRUPT", b, 7),  # the altered record
        ("CORRUPT", b, 11),  # its segment's END_OF_SEGMENT: ADHASH misses seq 3 and 7
    ]
    assert not any(o["severity"] == "fatal" for o in out)
    assert "3 faults" not in err and "4 faults, 0 fatal" in err and "DUPLICATE 1" in err


def test_check_inside_a_push_marks_faults_fatal(faulty_file):
    path, _, _ = faulty_file
    code, out, _ = run_check(path, "--phase", "push")
    assert code == 1
    fatal = [(o["verdict"], o["seq"]) for o in out if o["severity"] == "fatal"]
    # Inside a push state does not move past the gap: every later record of B is MISSING, each
    # line the gap's incident as it stands (seq 3), naming the record it judges.
    assert fatal[0] == ("MISSING", 3) and all(v == "MISSING" for v, _ in fatal)
    judged = [o["record"]["seq"] for o in out if o["severity"] == "fatal"]
    assert judged == list(range(4, 4 + len(judged)))
    assert [o["verdict"] for o in out if o["severity"] == "warning"] == ["DUPLICATE"]


def test_clean_stream_exits_zero_from_stdin():
    log, st = Log(), DivStamper(GUID_A)
    records = log.add_outgoing(st.data("t", 0, b"k", b"v", NOW)) + log.add_outgoing(st.end_segment("t", 0, True, NOW))
    untracked = log.add(b"k", b"plain", ())
    text = "".join(record_to_line(r) + "\n" for r in records + [untracked])
    code, out, err = run_check(None, stdin=text)
    assert code == 0, err
    assert [o["verdict"] for o in out] == ["OK", "OK", "OK", "UNTRACKED"]
    assert out[-1]["producer"] is None and out[-1]["segment"] is None


def test_compaction_lag_option_excuses_old_gaps():
    log, st = Log(), DivStamper(GUID_A)
    records = []
    for i in range(3):
        records += log.add_outgoing(st.data("t", 0, b"k%d" % i, b"v", NOW))
    kept = [records[0], records[1], records[3]]  # seq 2 compacted away
    text = "".join(record_to_line(r) + "\n" for r in kept)
    assert run_check(None, "--now", str(NOW + 999), "--compaction-lag-ms", "1000", stdin=text)[0] == 1
    code, out, _ = run_check(None, "--now", str(NOW + 1000), "--compaction-lag-ms", "1000", stdin=text)
    assert code == 0 and {o["verdict"] for o in out} == {"OK"}


def test_compaction_lag_option_excuses_a_gap_only_where_the_dump_has_offset_holes():
    """As the worker: a seq lost before it was written has no offset, so however old the
    records, the gap is MISSING, saying why."""
    log, st = Log(), DivStamper(GUID_A)
    records = []
    for i in range(3):
        records += log.add_outgoing(st.data("t", 0, b"k%d" % i, b"v", NOW))
    lost = [records[0], records[1], replace(records[3], offset=2)]  # seq 2 never reached the log
    text = "".join(record_to_line(r) + "\n" for r in lost)
    code, out, _ = run_check(None, "--now", str(NOW + 10**9), "--compaction-lag-ms", "1000", stdin=text)
    assert code == 1 and [o["verdict"] for o in out] == ["OK", "OK", "MISSING"]
    assert "not compaction: the log has 0 offset holes" in out[-1]["detail"]


def test_max_age_option_expires_idle_producers():
    log = Log()
    old, young = DivStamper(GUID_A), DivStamper(GUID_B)
    records = log.add_outgoing(old.data("t", 0, b"k", b"v", 1_000))
    records += log.add_outgoing(young.data("t", 0, b"k", b"v", 100_000))
    records += log.add_outgoing(young.data("t", 0, b"k", b"v", 100_001))
    # GUID_A comes back after being expired, in the middle of its segment.
    records += log.add_outgoing(old.data("t", 0, b"k", b"v", 100_002))
    text = "".join(record_to_line(r) + "\n" for r in records)
    _, kept, _ = run_check(None, "--phase", "push", stdin=text)
    assert [o["verdict"] for o in kept] == ["OK"] * 6
    code, expired, _ = run_check(None, "--phase", "push", "--max-age-ms", "1000", stdin=text)
    assert code == 1 and expired[-1]["verdict"] == "UNREGISTERED_PRODUCER" and expired[-1]["severity"] == "fatal"


def test_bad_lines_are_named_with_line_number_and_the_rest_is_still_checked(tmp_path):
    log, st = Log(), DivStamper(GUID_A)
    good = [record_to_line(r) for r in log.add_outgoing(st.data("t", 0, b"k", b"v", NOW))]
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "\n".join(
            [
                good[0],
                "{not json",
                '{"topic": "t", "partition": -1, "offset": 0, "timestamp": 0}',
                '{"topic": "t", "partition": 0, "offset": 1, "timestamp": 0, "value": "@@"}',
                good[1],
            ]
        )
        + "\n"
    )
    code, out, err = run_check(path)
    assert code == 2
    assert [o["verdict"] for o in out] == ["OK", "OK"]
    assert f"{path}:2: not JSON" in err
    assert f"{path}:3: field 'partition' must be >= 0" in err
    assert f"{path}:4: value is not valid base64" in err


def test_a_line_that_is_not_utf8_is_a_bad_line_and_the_rest_is_still_checked(tmp_path):
    log, st = Log(), DivStamper(GUID_A)
    good = [record_to_line(r).encode() for r in log.add_outgoing(st.data("t", 0, b"k", b"v", NOW))]
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(good[0] + b"\n" + '{"topic": "caf\xe9"}'.encode("latin-1") + b"\n" + good[1] + b"\n")
    code, out, err = run_check(path)
    assert code == 2
    assert [o["verdict"] for o in out] == ["OK", "OK"]
    assert f"{path}:2: not UTF-8 (byte 15 of the line)" in err
    assert "Traceback" not in err


def test_malformed_header_is_a_fault_not_a_crash():
    line = json.dumps(
        {
            "topic": "t",
            "partition": 0,
            "offset": 0,
            "timestamp": 0,
            "key": None,
            "value": base64.b64encode(b"v").decode(),
            "headers": [["div", base64.b64encode(b"\x01").decode()]],
        }
    )
    code, out, _ = run_check(None, stdin=line + "\n")
    assert code == 1 and out[0]["verdict"] == "MALFORMED" and "shorter than" in out[0]["detail"]


def test_every_subcommand_has_help():
    runner = CliRunner()
    for command in ([], *([name] for name in main.commands)):
        result = runner.invoke(main, [*command, "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert "Usage:" in result.output


def test_semantics_option_gives_venices_verdicts_or_the_exact_ones(tmp_path):
    log = Log("orders")
    st = DivStamper(GUID_A)
    out = [r for i in range(4) for r in st.data("orders", 0, b"k%d" % i, b"v%d" % i, NOW)]  # SOS, seq 1..4
    out += st.end_segment("orders", 0, False, NOW)
    records = log.add_outgoing(out[:3] + [out[4], out[3]] + out[5:])  # seq 3 after seq 4
    path = tmp_path / "reordered.jsonl"
    path.write_text("".join(record_to_line(r) + "\n" for r in records))
    code, exact, _ = run_check(path)
    assert code == 1
    assert [line["verdict"] for line in exact] == ["OK", "OK", "OK", "MISSING", "LATE", "OK"]
    # The MISSING line is the gap's incident as the worker writes it: the gap's first seq, the
    # offset that found it; the record it judges (seq 4 at offset 3) beside it.
    missing = exact[3]
    assert (missing["seq"], missing["offset"], missing["record"]) == (3, 3, {"offset": 3, "seq": 4})
    assert "record" not in exact[4]  # LATE: the record's own verdict
    assert exact[4]["seq"] == 3 and exact[4]["offset"] == 4
    assert exact[4]["gap"] == {
        "segment": 0,
        "first": 3,
        "last": 3,
        "found_offset": 3,
        "judged_after": 0,
        "arrived": 1,
        "resolved": True,
    }
    code, venice, _ = run_check(path, "--semantics", "venice")
    assert code == 1
    assert [line["verdict"] for line in venice] == ["OK", "OK", "OK", "MISSING", "DUPLICATE", "CORRUPT"]
    assert all("gap" not in line for line in venice)
