"""A value from outside (a record's key or value, kdiv's own topics included, a registry's
answer) is shown cut in a log line, an error or an incident's detail: a 1 MiB changelog key
is not a log line of megabytes."""

from __future__ import annotations

import json
import logging
import os
import struct
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kdiv.div.validator import DataIntegrityValidator
from kdiv.incident.shape import Incident
from kdiv.state.codec import StateDecodeError
from kdiv.state.framing import frame
from kdiv.state.tables import parse_key, partition_key
from kdiv.state.values import StateValues
from kdiv.ticdc.checksum import ChecksumVerdict
from kdiv.ticdc.simple import verify_simple
from kdiv.trace.judge import Observation
from kdiv.worker import audit
from kdiv.worker.audit import PipelineAudit, decode_observation, encode_observation
from kdiv.worker.divtopics import DivTopics
from kdiv.worker.live import LiveValidation
from kdiv.worker.unit import UnitOfWork
from tests.unit.test_audit_records import SETTINGS
from tests.unit.test_ticdc_simple import dml, table_schema

MIB = 1 << 20
# Longer than any cut value's line, far shorter than any uncut one.
LINE_BOUND = 1_000


class Table:
    data = None  # not a RocksDB store: its items are read whole

    def __init__(self, items: list[tuple[bytes, bytes]]) -> None:
        self._items = items

    def items(self):
        return iter(self._items)


def test_a_changelog_entry_with_a_huge_key_or_value_is_logged_cut(caplog):
    huge_key = b"p|orders|" + b"\xff" * MIB
    garbled = frame(7, b"\x02" + os.urandom(MIB))  # the producer branch, then noise
    table = Table([(huge_key, frame(7, b"\x00")), (partition_key("orders", 0), garbled)])
    live = LiveValidation(DataIntegrityValidator(), StateValues(7))
    div = DivTopics(
        live=live,
        unit=UnitOfWork(),
        runs=cast(Any, None),
        stats=None,
        clock=lambda: 0,
        tables={"orders": table},
        partition_counts={"orders": 1},
        rewinds=cast(Any, None),
        note_framing=lambda topic, partition, records: None,
    )
    with caplog.at_level(logging.ERROR, logger="kdiv.worker"):
        div.load([("orders", 0)])
    lines = [r.getMessage() for r in caplog.records if "unreadable state" in r.getMessage()]
    assert len(lines) == 2, lines
    assert div.load_errors_seen == 2
    for line in lines:
        assert len(line) < LINE_BOUND, line[:300]
    assert any(f"({len(huge_key):,} bytes)" in line for line in lines)  # its length is still told


def test_state_errors_name_a_huge_key_or_schema_cut():
    with pytest.raises(StateDecodeError) as bad_key:
        parse_key(b"x" * MIB)
    assert len(str(bad_key.value)) < LINE_BOUND and f"({MIB:,} bytes)" in str(bad_key.value)
    with pytest.raises(StateDecodeError) as bad_schema:  # what a registry answered, as the schema
        StateValues(7).add_writer_schema(9, json.dumps({"type": "record", "name": "x" * MIB}))
    assert len(str(bad_schema.value)) < LINE_BOUND
    with pytest.raises(StateDecodeError, match="not a usable Avro schema: .*nests 100 levels deep"):
        StateValues(7).add_writer_schema(9, "[" * 100 + "]" * 100)  # the one parser, with its bounds


def test_a_huge_trace_key_in_the_traces_table_is_logged_cut(caplog):
    pipeline = PipelineAudit(SETTINGS)
    key = struct.pack(">H", 0) + b"flow" + b"\xfe" * MIB
    with caplog.at_level(logging.ERROR, logger="kdiv.worker.audit"):
        assert pipeline.load(0, [(key, b"\x00")]) == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "unreadable trace state" in line and len(line) < LINE_BOUND, line[:300]


def test_an_observation_of_huge_names_is_judged_cut_and_not_kept(caplog):
    audit._NAMES.clear()
    observation = decode_observation(encode_observation_named("flow", "t" * MIB))
    assert observation.topic == "t" * MIB
    assert not audit._NAMES  # decoded, never kept: 1024 of them would be a gigabyte
    decode_observation(encode_observation_named("flow", "orders"))
    assert len(audit._NAMES) == 1
    pipeline = PipelineAudit(SETTINGS)
    record = SimpleNamespace(offset=3, value=encode_observation_named("flow", "t" * MIB))
    with caplog.at_level(logging.ERROR, logger="kdiv.worker.audit"):
        pipeline.receive(0, [record], now_ms=10_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(len(line) < LINE_BOUND for line in lines), [line[:300] for line in lines]


def encode_observation_named(route: str, topic: str) -> bytes:
    return encode_observation(Observation(os.urandom(16), route, 0, topic, 0, 5, 1_000, 900))


@pytest.mark.parametrize(
    ("mysql_type", "value"),
    [
        ("bigint unsigned", "9" * 10 + "x" * MIB),
        ("enum", "x" * MIB),
        ("vector", "[" + "1," * MIB),
        ("float", "z" * MIB),
    ],
)
def test_a_huge_malformed_column_value_is_an_incident_detail_cut(mysql_type, value):
    (result,) = verify_simple(dml("INSERT", current=5, data={"c": value}), table_schema(("c", mysql_type)))
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert len(result.detail) < LINE_BOUND, result.detail[:300]


def test_an_incident_with_many_huge_unknown_fields_is_refused_in_a_short_error():
    # Within the record bound (a larger record is refused unparsed), each name far over a line.
    fields = {f"{n}-" + "u" * 2_400: n for n in range(100)}
    with pytest.raises(ValueError, match=r"unknown field\(s\) .* and 95 more$") as bad:
        Incident.from_value(json.dumps({"incident_version": 2, **fields}).encode())
    assert len(str(bad.value)) < LINE_BOUND
