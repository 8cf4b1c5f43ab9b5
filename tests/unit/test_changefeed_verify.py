"""Changefeed records from Kafka bytes to verdicts (`kdiv.changefeed.verify`), with the demo
source's TiCDC-shaped Avro messages and Simple-protocol JSON."""

from __future__ import annotations

import json

from kdiv.changefeed.verify import ChangefeedVerifier
from kdiv.dev.changefeed import KEY_SCHEMA, VALUE_SCHEMA, ChangefeedMessages
from kdiv.state.framing import frame
from kdiv.ticdc.checksum import ChecksumVerdict, SkipReason
from tests.unit.test_ticdc_checksum import EXAMPLE_C_MESSAGE, EXAMPLE_C_SCHEMA

KEY_ID, VALUE_ID = 11, 12
AVRO = "avro"


def avro_verifier() -> ChangefeedVerifier:
    verifier = ChangefeedVerifier(lambda topic: AVRO)
    verifier.learn_schema(KEY_ID, json.dumps(KEY_SCHEMA))
    verifier.learn_schema(VALUE_ID, json.dumps(VALUE_SCHEMA))
    return verifier


def test_planted_faults_are_exactly_the_faults_found_with_their_rows() -> None:
    messages = ChangefeedMessages(KEY_ID, VALUE_ID, seed=3, delete_rate=0.1)
    planted = {7: "mismatch", 19: "flag", 20: "mismatch", 199: "flag"}
    records = []
    for offset in range(200):
        message = messages.next(planted.get(offset))
        records.append((offset, 1_000 + offset, message.key, message.value))
    deletes = sum(1 for r in records if r[3] is None)
    assert 5 < deletes < 40

    verdicts = avro_verifier().verify_many("cdc", 0, records)

    assert len(verdicts) == 200
    faults = {(v.offset, v.result.verdict) for v in verdicts if v.result.is_fault}
    assert faults == {
        (7, ChecksumVerdict.CHECKSUM_MISMATCH),
        (19, ChecksumVerdict.CORRUPTED_FLAG),
        (20, ChecksumVerdict.CHECKSUM_MISMATCH),
        (199, ChecksumVerdict.CORRUPTED_FLAG),
    }
    by_offset = {v.offset: v for v in verdicts}
    mismatch = by_offset[7].result
    assert mismatch.table == "shop.orders" and dict(mismatch.key) == {"id": 7}
    assert mismatch.expected is not None and mismatch.computed is not None and mismatch.expected != mismatch.computed
    assert by_offset[7].timestamp_ms == 1_007
    skipped = [v for v in verdicts if v.result.verdict is ChecksumVerdict.SKIPPED]
    assert len(skipped) == deletes and {v.result.skip_reason for v in skipped} == {SkipReason.TOMBSTONE}
    assert sum(v.result.verdict is ChecksumVerdict.OK for v in verdicts) == 200 - deletes - 4


def test_schemas_not_handed_in_are_named_and_bad_bytes_are_malformed_verdicts() -> None:
    messages = ChangefeedMessages(KEY_ID, VALUE_ID)
    message = messages.next()
    verifier = ChangefeedVerifier(lambda topic: AVRO)
    assert verifier.missing_schemas([(message.key, message.value), (None, b"not framed")]) == {KEY_ID, VALUE_ID}
    verifier.learn_schema(KEY_ID, json.dumps(KEY_SCHEMA))
    verifier.learn_schema(VALUE_ID, None)  # the registry has no such id
    assert verifier.missing_schemas([(message.key, message.value)]) == set()

    unknown, unframed, truncated = verifier.verify_many(
        "cdc",
        1,
        [(5, 0, message.key, message.value), (6, 0, None, b"{}"), (7, 0, None, frame(KEY_ID, b""))],
    )
    assert (unknown.offset, unknown.result.verdict) == (5, ChecksumVerdict.MALFORMED)
    assert f"schema id {VALUE_ID} is unknown to the registry" in unknown.result.detail
    assert dict(unknown.result.key) == {"id": 0}
    assert unframed.result.verdict is ChecksumVerdict.MALFORMED
    assert "not Confluent-framed" in unframed.result.detail
    assert truncated.result.verdict is ChecksumVerdict.MALFORMED
    assert f"does not decode with schema id {KEY_ID}" in truncated.result.detail


def test_simple_dml_before_its_schema_is_verified_under_its_own_offset_or_given_up() -> None:
    verifier = ChangefeedVerifier(lambda topic: "simple")
    bootstrap = json.dumps({"version": 1, "type": "BOOTSTRAP", "buildTs": 1, "tableSchema": EXAMPLE_C_SCHEMA})
    dml = EXAMPLE_C_MESSAGE.encode()
    corrupt = dml.replace(b'"id":"7"', b'"id":"8"')

    assert verifier.verify_many("cdc", 0, [(10, 100, None, dml), (11, 110, None, corrupt)]) == []
    assert verifier.held() == 2
    released = verifier.verify_many("cdc", 0, [(12, 120, None, bootstrap.encode())])
    assert [(v.offset, v.timestamp_ms, v.result.verdict) for v in released] == [
        (10, 100, ChecksumVerdict.OK),
        (11, 110, ChecksumVerdict.CHECKSUM_MISMATCH),
    ]
    # Another partition learns its schemas from its own messages.
    assert verifier.verify_many("cdc", 1, [(3, 30, None, dml)]) == []
    (given_up,) = verifier.take_held()
    assert (given_up.partition, given_up.offset, given_up.result.skip_reason) == (1, 3, SkipReason.SCHEMA_UNKNOWN)
    assert verifier.held() == 0


def test_a_delete_names_its_table_from_the_key_record() -> None:
    message = ChangefeedMessages(KEY_ID, VALUE_ID, delete_rate=1.0).next()
    assert message.value is None
    (verdict,) = avro_verifier().verify_many("cdc", 0, [(0, 0, message.key, None)])
    assert verdict.result.skip_reason is SkipReason.TOMBSTONE
    assert (verdict.result.table, dict(verdict.result.key)) == ("shop.orders", {"id": 0})
