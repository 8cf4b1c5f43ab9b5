"""The key ledger: what the worker keeps per key of a compacted topic for reconciliation."""

from __future__ import annotations

import io

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdiv.div.ledger import (
    KeyValidation,
    at_rest_crc,
    key_validation_of,
    ledger_key,
    pack_key_validation,
    packed_key_validation_of,
    parse_ledger_key,
    unpack_key_validation,
)
from kdiv.div.record import ConsumedRecord
from kdiv.div.validator import DataIntegrityValidator, TopicPolicy
from kdiv.div.wire import Kind
from kdiv.state.codec import (
    KEY_VALIDATION_PACKED_NAME,
    STATE_SCHEMA,
    StateDecodeError,
    decode_state,
    encode_key_validation,
)
from kdiv.state.framing import unframe
from kdiv.state.values import StateValues
from kdiv.worker.live import LiveValidation
from tests.harness.streams import GUID_A, NOW, Log, corrupt_value


def live_for(compacted: set[str]) -> LiveValidation:
    validator = DataIntegrityValidator(lambda topic: TopicPolicy(compaction_lag_ms=0 if topic in compacted else None))
    live = LiveValidation(validator, StateValues(7), ledger_topics=frozenset(compacted))
    return live


def ledger_after(live: LiveValidation, topic: str, partition: int = 0) -> dict[bytes, KeyValidation]:
    values = StateValues(7)
    out: dict[bytes, KeyValidation] = {}
    for key, value in live.take_ledger_writes(topic, partition):
        got_topic, got_partition, record_key = parse_ledger_key(key)
        assert (got_topic, got_partition) == (topic, partition)
        decoded = values.decode(value)
        assert isinstance(decoded, KeyValidation)
        out[record_key] = decoded
    return out


def test_ledger_keeps_the_last_record_per_key_of_compacted_topics_only():
    log = Log("orders")
    records = [
        log.control(Kind.START_OF_SEGMENT, 0, 0),
        log.data(0, 1, key=b"a", value=b"1"),
        log.data(0, 2, key=b"b|x", value=b"2"),
        log.data(0, 3, key=b"a", value=b"3"),
        log.add(b"b|x", None, ()),  # an unstamped tombstone
        log.add(None, b"keyless", ()),
    ]
    live = live_for({"orders"})
    live.load("orders", 0, [])
    for record in records:
        live.process(record, NOW)
    ledger = ledger_after(live, "orders")
    assert set(ledger) == {b"a", b"b|x"}  # no control record, no keyless record
    assert ledger[b"a"] == KeyValidation(3, NOW, at_rest_crc(b"a", b"3"), False, GUID_A, 0, 3)
    assert ledger[b"b|x"] == KeyValidation(4, NOW, at_rest_crc(b"b|x", None), True)
    assert live.take_ledger_writes("orders", 0) == []  # taken once

    other = Log("events")
    plain = live_for(set())
    plain.load("events", 0, [])
    plain.process(other.data(0, 1, key=b"a"), NOW)
    assert plain.take_ledger_writes("events", 0) == []


def test_the_bulk_path_writes_the_entries_one_by_one_validation_writes():
    """`process_run` packs entries from the fields validation read; `process` from the record."""
    log = Log("orders")
    records = [
        log.control(Kind.START_OF_SEGMENT, 0, 0),
        log.data(0, 1, key=b"a", value=b"1"),
        log.data(0, 2, key=b"b", value=b"2"),
        log.data(0, 3, key=b"a", value=None),  # a stamped tombstone, in order
        corrupt_value(log.data(0, 4, key=b"c", value=b"4")),  # a fault: the full path
        log.data(0, 6, key=b"d", value=b"6"),  # a gap
        log.add(b"e", b"unstamped", ()),
        log.data(0, 7, key=b"b", value=b"7"),
        log.control(Kind.END_OF_SEGMENT, 0, 8),
    ]
    one_by_one = live_for({"orders"})
    one_by_one.load("orders", 0, [])
    for record in records:
        one_by_one.process(record, NOW)

    bulk = live_for({"orders"})
    bulk.load("orders", 0, [])
    results: list = []
    assert bulk.process_run("orders", 0, records, 0, NOW, set(), results) == len(records)
    assert [r.verdict for r in results] != []  # the faults took the full path
    assert bulk.take_ledger_writes("orders", 0) == one_by_one.take_ledger_writes("orders", 0)


def test_replays_write_their_entry_again():
    """A crash can save the partition state but not the ledger's record: replays fill it in."""
    log = Log("orders")
    records = [log.control(Kind.START_OF_SEGMENT, 0, 0), log.data(0, 1, key=b"a", value=b"1")]
    first = live_for({"orders"})
    first.load("orders", 0, [])
    for record in records:
        first.process(record, NOW)
    saved = first.take_writes("orders", 0).in_order()

    restarted = live_for({"orders"})
    restarted.load("orders", 0, saved)
    assert [restarted.process(r, NOW) for r in records] == [None, None]  # replays, not judged again
    assert ledger_after(restarted, "orders")[b"a"].offset == 1


def test_ledger_values_share_the_state_schema_and_say_what_they_are():
    values = StateValues(7)
    entry = KeyValidation(5, NOW, 0xFFFFFFFF, False, GUID_A, 2**32 - 1, 2**32 - 1)
    raw = values.encode(entry)
    assert unframe(raw)[0] == 7
    assert values.decode(raw) == entry
    assert key_validation_of(Log("t").add(None, b"v", ())) is None
    with pytest.raises(StateDecodeError):
        decode_state(b"\x06garbage")
    with pytest.raises(ValueError, match="not topic"):
        parse_ledger_key(b"no-separators")
    assert parse_ledger_key(ledger_key("t", 3, b"a|b|c")) == ("t", 3, b"a|b|c")


def test_the_hand_written_packed_branch_is_what_fastavro_writes():
    entry = KeyValidation(88003, NOW, 0xFFFFFFFF, False, GUID_A, 2, 77)
    packed = pack_key_validation(entry)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, STATE_SCHEMA, (KEY_VALIDATION_PACKED_NAME, {"entry": packed}))
    assert encode_key_validation(entry) == out.getvalue()
    assert decode_state(out.getvalue()) == entry
    tombstone = KeyValidation(5, NOW, 0, True)
    assert unpack_key_validation(pack_key_validation(tombstone)) == tombstone
    with pytest.raises(ValueError, match="53 bytes"):
        unpack_key_validation(packed[:-1])


def _header(kind: int, size: int, version: int = 1) -> bytes:
    body = bytes([version, kind]) + GUID_A + (3).to_bytes(4, "big") + (9).to_bytes(4, "big")
    body += NOW.to_bytes(8, "big") + (1234).to_bytes(4, "big")
    return (body + bytes(64))[:size]


@given(
    key=st.one_of(st.none(), st.binary(max_size=20)),
    value=st.one_of(st.none(), st.binary(max_size=40)),
    headers=st.lists(
        st.one_of(
            st.tuples(st.just("div"), st.one_of(st.none(), st.binary(max_size=50))),
            st.builds(
                lambda kind, size, version: ("div", _header(kind, size, version)),
                st.integers(0, 6),
                st.sampled_from([37, 38, 39, 47]),
                st.sampled_from([1, 1, 1, 2]),
            ),
            st.tuples(st.sampled_from(["trace", "Div"]), st.binary(max_size=8)),
        ),
        max_size=3,
    ),
    offset=st.integers(0, 1 << 40),
)
def test_the_fast_packed_entry_is_the_entry_packed(key, value, headers, offset):
    record = ConsumedRecord("t", 0, offset, NOW, key, value, tuple(headers))
    entry = key_validation_of(record)
    assert packed_key_validation_of(record) == (None if entry is None else pack_key_validation(entry))
