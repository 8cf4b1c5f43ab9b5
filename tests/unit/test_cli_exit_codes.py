"""Exit statuses the same in every command (0 clean, 1 faults, 2 bad input or unreachable
service), and `kdiv check` on input it cannot check: empty, no div header, binary, gzip."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

from kdiv.div.stamper import DivStamper
from kdiv.offline.jsonl import record_to_line
from tests.harness.streams import GUID_A, NOW, Log


def kdiv(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdiv.cli", *args], input=stdin, capture_output=True, timeout=60)


def stamped_lines() -> bytes:
    log, st = Log(), DivStamper(GUID_A)
    records = log.add_outgoing(st.data("t", 0, b"k", b"v", NOW)) + log.add_outgoing(st.end_segment("t", 0, True, NOW))
    return "".join(record_to_line(r) + "\n" for r in records).encode()


def test_an_empty_input_says_so_and_exits_2(tmp_path):
    for args, stdin in ((["check"], b""), (["check"], b"\n\n"), (["check", "--ticdc", "simple"], b"")):
        done = kdiv(*args, stdin=stdin)
        assert done.returncode == 2, done.stderr
        assert b"is empty: no records to check" in done.stderr, done.stderr
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    done = kdiv("check", str(path))
    assert done.returncode == 2 and f"{path} is empty".encode() in done.stderr


def test_records_without_div_headers_are_not_a_clean_check(tmp_path):
    log = Log()
    plain = [log.add(b"k%d" % i, b"plain", ()) for i in range(3)]
    done = kdiv("check", stdin="".join(record_to_line(r) + "\n" for r in plain).encode())
    assert done.returncode == 2
    assert b"no record has a div header, so nothing was validated" in done.stderr
    assert b"--ticdc" not in done.stderr


def test_ticdc_rows_checked_as_div_are_pointed_to_ticdc():
    log = Log()
    simple = json.dumps({"version": 1, "type": "INSERT", "database": "shop", "table": "orders", "data": {}})
    avro = log.add(b"\x00\x00\x00\x00\x07key", b"\x00\x00\x00\x00\x08" + b"\x02" * 20, ())
    rows = [log.add(b"k", simple.encode(), ()), log.add(b"k", simple.encode(), ())]
    done = kdiv("check", stdin="".join(record_to_line(r) + "\n" for r in rows).encode())
    assert done.returncode == 2
    assert b"2 of them look like a TiCDC changefeed: check them with --ticdc simple" in done.stderr, done.stderr
    done = kdiv("check", stdin=(record_to_line(avro) + "\n").encode())
    assert b"--ticdc avro" in done.stderr, done.stderr


def test_a_gzip_or_binary_file_is_one_error_not_one_per_line(tmp_path):
    zipped = tmp_path / "dump.jsonl.gz"
    zipped.write_bytes(gzip.compress(stamped_lines() * 200))
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    for path, said in ((zipped, b"is gzip-compressed"), (binary, b"is binary data")):
        for args in (["check", str(path)], ["check", "--ticdc", "simple", str(path)]):
            done = kdiv(*args)
            assert done.returncode == 2, (args, done.stderr)
            errors = [line for line in done.stderr.splitlines() if line.strip()]
            assert len(errors) == 1 and said in errors[0], (args, errors[:3])
            assert done.stdout == b""
    # From stdin too.
    done = kdiv("check", stdin=gzip.compress(stamped_lines()))
    assert done.returncode == 2 and b"<stdin> is gzip-compressed" in done.stderr, done.stderr


def test_a_clean_check_exits_0_and_a_fault_1():
    assert kdiv("check", stdin=stamped_lines()).returncode == 0
    lines = stamped_lines().splitlines()
    assert kdiv("check", stdin=lines[0] + b"\n" + lines[2] + b"\n").returncode == 1  # seq 1 lost


def test_an_unreachable_service_exits_2_in_every_command():
    """The same failure, Kafka not answering, is the same status whatever the command."""
    for args in (
        ["dump", "t", "--bootstrap", "127.0.0.1:1"],
        ["--debug", "dump", "t", "--bootstrap", "127.0.0.1:1"],
        ["schemas", "check", "t", "--bootstrap", "127.0.0.1:1"],
        ["wait-for-broker", "--bootstrap", "127.0.0.1:1", "--timeout", "0"],
    ):
        done = kdiv(*args)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert b"127.0.0.1:1" in done.stderr, (args, done.stderr[-2000:])


def test_bad_options_exit_2():
    assert kdiv("check", "--phase", "sideways", stdin=b"").returncode == 2
    assert kdiv("dump", "t", "--partition", "-1").returncode == 2
    bad_base64 = json.dumps({"topic": "t", "partition": 0, "offset": 0, "timestamp": 0, "key": "@@"})
    assert kdiv("check", stdin=bad_base64.encode() + b"\n").returncode == 2
