"""The audit's records: observations placed and encoded as a per-record send of them was,
trace states keyed as the `traces` table holds them."""

from __future__ import annotations

import os
from types import SimpleNamespace

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from kdiv.config.settings import Settings
from kdiv.kafka.partitioner import murmur2
from kdiv.trace.header import TRACE_HEADER, TraceStamp, encode_trace
from kdiv.trace.judge import Observation, state_key
from kdiv.worker.audit import (
    PipelineAudit,
    decode_observation,
    encode_observation,
    observation_partition,
    observations_by_partition,
    table_key,
)

SETTINGS = Settings.from_env(
    {"KDIV_ROUTES": "flow=orders>enricher>enriched;fan=orders>shipper>shipped", "KDIV_TRACE_PARTITIONS": "4"}
)


@given(st.binary(max_size=80))
def test_murmur2_is_kafkas(data):
    assert murmur2(data) == aiokafka_murmur2(data)


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_an_observation_goes_where_a_keyed_send_without_partition_put_it(key, count):
    # aiokafka's producer: its partitioner (Faust's default) over the topic's partitions as
    # its metadata lists them.
    partitions = list(set(range(count)))
    assert observation_partition(key, partitions) == DefaultPartitioner()(key, partitions, partitions)


def test_observations_are_grouped_by_partition_in_their_order():
    records = [(state_key("flow", os.urandom(16)), n.to_bytes(2, "big")) for n in range(500)]
    grouped = observations_by_partition(records, [0, 1, 2, 3])
    assert sorted(r for batch in grouped.values() for r in batch) == sorted(records)
    for partition, batch in grouped.items():
        assert [r for r in records if observation_partition(r[0], [0, 1, 2, 3]) == partition] == batch


def _record(offset: int, trace_id: bytes | None, timestamp: int = 5_000):
    headers = [] if trace_id is None else [(TRACE_HEADER, encode_trace(TraceStamp(trace_id, 1_234)))]
    return SimpleNamespace(offset=offset, timestamp=timestamp, headers=headers, key=None, value=b"v")


def test_observe_writes_the_observation_of_each_route_stage_a_topic_is():
    audit = PipelineAudit(SETTINGS)
    ids = [os.urandom(16) for _ in range(3)]
    audit.observe("orders", 2, [_record(10, ids[0]), _record(11, None), _record(12, ids[1]), _record(13, ids[2])])
    expected = [
        (
            state_key(route, trace_id),
            encode_observation(Observation(trace_id, route, 0, "orders", 2, offset, 5_000, 1_234)),
        )
        for trace_id, offset in zip(ids, (10, 12, 13), strict=True)
        for route in ("flow", "fan")
    ]
    assert audit.take_observations("orders", 2) == expected
    assert audit.traced == {("flow", 0): 3, ("fan", 0): 3}
    for _, value in expected:
        observation = decode_observation(value)
        assert decode_observation(value) == observation and observation.topic == "orders"


def test_an_observation_naming_bad_utf8_is_refused_each_time():
    value = encode_observation(Observation(bytes(16), "flow", 0, "orders", 0, 1, 2, 3))
    bad = value[: -len(b"orders")] + b"\xff\xfe"
    for _ in range(2):
        try:
            decode_observation(bad)
        except UnicodeDecodeError:
            continue
        raise AssertionError("decoded a topic that is not UTF-8")


def test_take_changes_keys_the_states_as_table_key():
    audit = PipelineAudit(SETTINGS)
    ids = [os.urandom(16) for _ in range(4)]
    records = [
        SimpleNamespace(offset=n, value=encode_observation(Observation(trace_id, route, 0, "orders", 0, n, 1, 2)))
        for n, (trace_id, route) in enumerate((t, r) for t in ids for r in ("flow", "fan"))
    ]
    audit.receive(3, records, 100)
    changes = audit.take_changes(3)
    assert [key for key, _ in changes] == [table_key(3, r, t) for t in ids for r in ("flow", "fan")]
    assert all(value is not None for _, value in changes)
