"""Every producer of incidents against the one schema (kdiv/incident/schema.json): the
worker's builders, the views' rendering, `kdiv check` (DIV and --ticdc), and the log."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import jsonschema
import pytest
from click.testing import CliRunner

from kdiv.cli import main
from kdiv.div.validator import DataIntegrityValidator, Eviction, Semantics
from kdiv.div.wire import HEADER_NAME, Kind
from kdiv.incident.builders import checksum_incident, incident_for, partition_incident, schema_incident, trace_incident
from kdiv.incident.schema import incident_schema
from kdiv.incident.shape import INCIDENT_VERSION, Incident
from kdiv.offline.jsonl import record_to_line
from kdiv.trace.judge import TraceJudge, TraceOutcome
from kdiv.trace.routes import parse_routes
from kdiv.worker.incident_log import IncidentLog
from kdiv.worker.incidents import deletion_incident, eviction_incident, incidents_for, rewind_incident
from kdiv.worker.live import Rewind
from kdiv.worker.retention import Deletion
from kdiv.worker.web.shapes import incident_json
from tests.harness.streams import GUID_A, GUID_B, NOW, Log, corrupt_value
from tests.unit.test_check_ticdc import SIMPLE_FAULTS, SIMPLE_RECORDS, line

VALIDATOR = jsonschema.Draft202012Validator(incident_schema())
DETECTED = NOW + 500


def assert_valid(shown: dict) -> None:
    errors = sorted(VALIDATOR.iter_errors(shown), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    assert -1 not in shown.values() and "-" not in shown.values() and {} not in shown.values(), shown


def faulty_log() -> Log:
    """Producer A's segment in a push: seq 1 re-delivered, seq 2 corrupted, seq 3 lost (so
    every later record is MISSING); B's seq 5 without its segment start; a record without a
    header; one whose header cannot be decoded."""
    log = Log("orders")
    log.control(Kind.START_OF_SEGMENT, 0, 0)
    for seq in (1, 2, 4, 5, 6):
        record = log.data(0, seq, b"k%d" % seq, b"v%d" % seq, timestamp=NOW + seq)
        if seq == 1:
            log.redeliver(record)
        if seq == 2:
            log.records[-1] = corrupt_value(record)
    log.data(0, 5, guid=GUID_B, partition=1)
    log.add(b"plain", b"no header", ())
    log.add(b"bad", b"v", ((HEADER_NAME, b"\x01\x02"),))
    return log


def div_incidents(semantics: Semantics) -> list[Incident]:
    validator = DataIntegrityValidator(start_in_push=True, semantics=semantics)
    return [i for r in faulty_log().records for i in incidents_for(validator.validate(r, NOW), DETECTED)]


@pytest.mark.parametrize("semantics", list(Semantics))
def test_the_incidents_of_records_match_the_schema(semantics):
    incidents = div_incidents(semantics)
    verdicts = {i.verdict for i in incidents}
    assert verdicts == {"DUPLICATE", "CORRUPT", "MISSING", "UNREGISTERED_PRODUCER", "MALFORMED"}
    for incident in incidents:
        assert_valid(incident.to_json())
        assert_valid(incident_json(incident))  # what /incidents/ serves
        assert Incident.from_value(incident.value) == incident
    malformed = next(i for i in incidents if i.verdict == "MALFORMED")
    assert (malformed.producer, malformed.segment, malformed.seq) == (None, None, None)
    missing = next(i for i in incidents if i.verdict == "MISSING")
    assert (missing.producer, missing.severity, missing.record_timestamp_ms) == (GUID_A.hex(), "fatal", NOW + 4)


def test_a_gap_resolved_by_its_late_record_matches_the_schema():
    log = Log("orders")
    log.control(Kind.START_OF_SEGMENT, 0, 0)
    for seq in (1, 3, 2):
        log.data(0, seq, b"k%d" % seq)
    validator = DataIntegrityValidator(start_in_push=True, semantics=Semantics.EXACT)
    incidents = [i for r in log.records for i in incidents_for(validator.validate(r, NOW), DETECTED)]
    assert [i.verdict for i in incidents] == ["MISSING", "LATE", "MISSING"]
    assert incidents[-1].resolved_at_ms == DETECTED
    for incident in incidents:
        assert_valid(incident.to_json())


def test_the_worker_s_partition_and_schema_incidents_match_the_schema():
    made = [
        rewind_incident(Rewind("orders", 0, 10, 19, "high watermark", "log ends at 10", True), DETECTED),
        deletion_incident(Deletion("orders", 0, 11, 39, "fetch", "jumped", False), DETECTED),
        eviction_incident(Eviction("orders", 0, 2, (GUID_A,), 7, 5, 1), DETECTED),
        partition_incident("orders", 1, "LOG_REWOUND", 3, "warning", "d", DETECTED),
        schema_incident("orders", 0, 4, "value", 12, "SUBJECT_MISMATCH", "orders-value", ("x",), "d", NOW, DETECTED),
        # State found in a changelog has no record time (the worker passes -1): null, not -1.
        schema_incident("app-changelog", 0, 0, "value", 9, "SCHEMA_UNKNOWN", None, (), "d", -1, DETECTED, DETECTED),
    ]
    assert [i.severity for i in made[:3]] == ["fatal", "warning", "warning"]
    for incident in made:
        shown = incident.to_json()
        assert_valid(shown)
        assert_valid(incident_json(incident))
        assert shown["incident_version"] == INCIDENT_VERSION
        assert (shown["producer"], shown["segment"], shown["seq"]) == (None, None, None)
    assert made[0].record_timestamp_ms is None and made[5].record_timestamp_ms is None


ROUTES = parse_routes("flow=orders>enricher>enriched>router>eu|us")
ORIGIN = 9_000


def trace_verdicts():
    """A duplicate, a loss and a trace never resolved, each with the origin its header carried."""
    judge = TraceJudge(ROUTES, grace_ms=1_000, max_wait_ms=60_000)
    (flow,) = ROUTES

    def observe(trace_id: bytes, topic: str, partition: int, offset: int) -> None:
        from kdiv.trace.judge import Observation

        stage = flow.stage_of(topic)
        judge.observe(Observation(trace_id, "flow", stage, topic, partition, offset, ORIGIN + 10, ORIGIN), 0)

    dup, lost, waiting = (bytes([n]) * 16 for n in (1, 2, 3))
    observe(dup, "orders", 0, 1)
    observe(dup, "enriched", 0, 7)
    observe(dup, "enriched", 0, 8)
    observe(lost, "orders", 0, 2)
    observe(waiting, "orders", 1, 3)
    judge.committed("enricher", "orders", 0, 3)
    found = judge.judge(1) + judge.judge(2_000) + judge.judge(60_000)
    return [v for v in found if v.outcome is not TraceOutcome.DELIVERED]


def test_route_incidents_match_the_schema_and_carry_the_trace_s_origin_time():
    incidents = [trace_incident(v, DETECTED) for v in trace_verdicts()]
    assert {i.verdict for i in incidents} == {"DUPLICATED", "LOST", "UNRESOLVED"}
    for incident in incidents:
        shown = incident.to_json()
        assert_valid(shown)
        assert_valid(incident_json(incident))
        assert shown["record_timestamp_ms"] == ORIGIN and shown["row_key"] is None
        assert incident_json(incident)["record_time"] == "1970-01-01T00:00:09.000Z"
    assert {i.verdict: i.severity for i in incidents} == {
        "DUPLICATED": "warning",
        "LOST": "fatal",
        "UNRESOLVED": "warning",
    }


def test_checksum_incidents_match_the_schema_with_the_row_key_as_an_object():
    from kdiv.changefeed.verify import SIMPLE, ChangefeedVerifier
    from kdiv.offline.jsonl import parse_record

    verifier = ChangefeedVerifier(lambda topic: SIMPLE)
    rows = []
    for partition in (0, 1, 2):
        records = [parse_record(line(p, o, v), "cdc", 1) for p, o, v in SIMPLE_RECORDS if p == partition]
        rows += verifier.verify_many("cdc", partition, [(r.offset, r.timestamp, r.key, r.value) for r in records])
    incidents = [checksum_incident(row, DETECTED) for row in rows if row.result.is_fault]
    assert {(i.partition, i.offset, i.verdict, i.row_image) for i in incidents} == SIMPLE_FAULTS
    for incident in incidents:
        assert_valid(incident.to_json())
        assert_valid(incident_json(incident))
    mismatch = next(i for i in incidents if (i.partition, i.offset) == (0, 2))
    assert mismatch.to_json()["row_key"] == {"id": "2"} and mismatch.severity == "fatal"


def test_kdiv_check_prints_every_verdict_in_the_incident_shape(tmp_path):
    path = tmp_path / "orders.jsonl"
    path.write_text("".join(record_to_line(r) + "\n" for r in faulty_log().records))
    for semantics in ("venice", "exact"):
        result = CliRunner().invoke(
            main, ["check", str(path), "--phase", "push", "--semantics", semantics, "--now", str(DETECTED)]
        )
        assert result.exit_code == 1, result.stderr
        lines = [json.loads(text) for text in result.stdout.splitlines()]
        assert len(lines) == len(faulty_log().records)
        for shown in lines:
            assert_valid(shown)
            assert shown["detected_at_ms"] == DETECTED
            assert (shown["severity"] is None) == (shown["verdict"] in ("OK", "UNTRACKED")), shown
        assert any("gap" in shown for shown in lines) == (semantics == "exact")


def test_kdiv_check_ticdc_prints_faults_in_the_incident_shape(tmp_path):
    path = tmp_path / "cdc.jsonl"
    path.write_text("".join(line(p, o, v) for p, o, v in SIMPLE_RECORDS))
    result = CliRunner().invoke(main, ["check", "--ticdc", "simple", str(path)])
    assert result.exit_code == 1, result.stderr
    lines = [json.loads(text) for text in result.stdout.splitlines()]
    assert {(f["partition"], f["offset"], f["verdict"], f["row_image"]) for f in lines} == SIMPLE_FAULTS
    for shown in lines:
        assert_valid(shown)
        assert Incident.from_value(json.dumps(shown).encode()).to_json() == shown


def test_the_schema_refuses_the_old_stand_ins():
    shown = div_incidents(Semantics.VENICE)[0].to_json()
    for field, stand_in in (("record_timestamp_ms", "soon"), ("producer", "-"), ("segment", -1), ("row_key", {})):
        assert not VALIDATOR.is_valid({**shown, field: stand_in}), field
    assert not VALIDATOR.is_valid({**shown, "fatal": True})
    assert not VALIDATOR.is_valid({k: v for k, v in shown.items() if k != "incident_version"})


# -- the log --------------------------------------------------------------------------------


def logged(incidents: Iterable[Incident], caplog, enabled: bool = True) -> list[logging.LogRecord]:
    logger = logging.getLogger("kdiv.test.incidents")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        IncidentLog(logger, enabled).written(incidents)
    return list(caplog.records)


def test_each_incident_is_logged_once_at_its_severity_s_level_naming_where_and_who(caplog):
    trace = [trace_incident(v, DETECTED) for v in trace_verdicts()]
    rewind = rewind_incident(Rewind("orders", 2, 10, 19, "leader epoch", "d", True), DETECTED)
    incidents = [*trace, rewind, rewind]  # a rewrite of the same key is not logged again
    records = logged(incidents, caplog)
    assert len(records) == len(trace) + 1
    by_class = {r.getMessage().split(" ")[0]: r for r in records}
    assert by_class["LOST"].levelno == logging.ERROR
    assert by_class["DUPLICATED"].levelno == logging.WARNING
    assert by_class["LOG_REWOUND"].levelno == logging.ERROR
    assert by_class["LOG_REWOUND"].getMessage().startswith("LOG_REWOUND (fatal) at orders[2]@10 producer none")
    assert "route flow hop 0" in by_class["LOST"].getMessage()


def test_a_fatal_missing_is_an_error_and_a_run_is_one_line_and_its_length(caplog):
    incidents = div_incidents(Semantics.VENICE)
    logger = logging.getLogger("kdiv.test.runs")
    log = IncidentLog(logger)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        log.written(incidents)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    first_missing = next(i for i in incidents if i.verdict == "MISSING")
    assert (
        "ERROR",
        f"MISSING (fatal) at orders[0]@{first_missing.offset} producer {GUID_A.hex()} segment 0 seq {first_missing.seq}: "
        + first_missing.detail,
    ) in lines
    assert any(level == "ERROR" and message.startswith("CORRUPT (fatal)") for level, message in lines)
    malformed = next(i for i in incidents if i.verdict == "MALFORMED")
    assert (
        "WARNING",
        f"MALFORMED (warning) at orders[0]@{malformed.offset} producer none: {malformed.detail}",
    ) in lines
    # Every incident is in a line: its own, or the line of the run it continued.
    runs = [m for _, m in lines if " incidents at " in m]
    counted = sum(int(m.split(" ")[0]) - 1 for m in runs)
    open_runs = sum(run.count - 1 for run in log._runs.values())
    assert len(lines) - len(runs) + counted + open_runs == len({i.key for i in incidents})


def test_incident_logging_can_be_turned_off(caplog):
    assert logged(div_incidents(Semantics.VENICE), caplog, enabled=False) == []
    assert logged(div_incidents(Semantics.VENICE), caplog, enabled=True)


def test_the_setting_is_read_from_kdiv_log_incidents():
    from kdiv.config.settings import Settings

    assert Settings.from_env({"KDIV_TOPICS": "orders"}).log_incidents is True
    assert Settings.from_env({"KDIV_TOPICS": "orders", "KDIV_LOG_INCIDENTS": "false"}).log_incidents is False


def test_incident_for_an_ok_record_is_none():
    log = Log("orders")
    record = log.data(0, 0)
    assert incident_for(DataIntegrityValidator().validate(record, NOW), DETECTED) is None


def test_a_record_kafka_gives_no_timestamp_has_a_null_record_time():
    log = Log("orders")
    log.add(b"bad", b"v", ((HEADER_NAME, b"\x01\x02"),), timestamp=-1)
    (malformed,) = incidents_for(DataIntegrityValidator().validate(log.records[0], NOW), DETECTED)
    assert malformed.record_timestamp_ms is None
    assert_valid(malformed.to_json())
