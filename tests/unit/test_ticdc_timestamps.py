"""TIMESTAMP columns (spec section 5): the TiCDC zone's text converted to UTC, Go's reading of
repeated and skipped wall clocks, the zero value, the fraction, and timestamp_mode.
"""

from __future__ import annotations

import datetime
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdiv.ticdc.avro import AvroChecksumVerifier
from kdiv.ticdc.checksum import ChecksumVerdict
from kdiv.ticdc.simple import SimpleChecksumVerifier
from kdiv.ticdc.timestamps import TimestampMode, UtcRenderings, load_zone, parse_timestamp_mode, utc_readings
from tests.unit.test_ticdc_checksum import col, lp, row, simple_column, u64, value_schema


@pytest.mark.parametrize(
    ("text", "zone", "readings"),
    [
        ("2024-03-01 08:00:00.500", "Asia/Shanghai", ("2024-03-01 00:00:00.500",)),
        ("2024-03-01 08:00:00.000123", "Asia/Shanghai", ("2024-03-01 00:00:00.000123",)),
        ("2024-01-01 03:00:00", "Asia/Shanghai", ("2023-12-31 19:00:00",)),  # across the year
        ("2024-07-01 20:00:00.5", "America/New_York", ("2024-07-02 00:00:00.5",)),
        ("2024-03-01 08:00:00", "UTC", ("2024-03-01 08:00:00",)),
        ("0000-00-00 00:00:00", "Asia/Shanghai", ("0000-00-00 00:00:00",)),  # the zero value, as is
        ("0000-00-00 00:00:00.000", "Asia/Shanghai", ("0000-00-00 00:00:00.000",)),
        # Repeated hour, east of UTC: Go's reading is the later occurrence (CET), then the earlier.
        ("2024-10-27 02:30:00", "Europe/Berlin", ("2024-10-27 01:30:00", "2024-10-27 00:30:00")),
        # Repeated hour, west of UTC: Go's reading is the earlier occurrence (EDT), then the later.
        ("2024-11-03 01:30:00", "America/New_York", ("2024-11-03 05:30:00", "2024-11-03 06:30:00")),
        # Offset 0 at the wall clock read as UTC: Go keeps it (GMT, the later occurrence).
        ("2024-10-27 01:30:00", "Europe/London", ("2024-10-27 01:30:00", "2024-10-27 00:30:00")),
        # Skipped wall clocks have Go's reading only.
        ("2024-03-31 02:30:00", "Europe/Berlin", ("2024-03-31 01:30:00",)),
        ("2024-03-10 02:30:00", "America/New_York", ("2024-03-10 06:30:00",)),
        ("2024-03-31 01:30:00", "Europe/London", ("2024-03-31 01:30:00",)),
    ],
)
def test_utc_readings(text: str, zone: str, readings: tuple[str, ...]) -> None:
    assert utc_readings(text, load_zone(zone)) == readings


@pytest.mark.parametrize(
    "text",
    [
        "2024-03-01T08:00:00",
        "2024-03-01 08:00",
        "2024-02-30 00:00:00",
        "2024-03-01 24:00:00",
        "2024-03-01 08:00:00.",
        "2024-03-01 08:00:00.5x",
        "２０２４-03-01 08:00:00",
        "",
    ],
)
def test_texts_that_are_not_timestamps_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        utc_readings(text, load_zone("Asia/Shanghai"))


def test_mode_and_zone_settings() -> None:
    assert parse_timestamp_mode("utc") is TimestampMode.UTC
    assert parse_timestamp_mode("as_sent") is TimestampMode.AS_SENT
    assert parse_timestamp_mode(TimestampMode.AS_SENT) is TimestampMode.AS_SENT
    with pytest.raises(ValueError, match="utc, as_sent"):
        parse_timestamp_mode("UTC+8")
    with pytest.raises(ValueError, match="unknown time zone"):
        load_zone("Nowhere/Special")


# Avro: the zone is a verifier setting ------------------------------------------------------------

TS_SCHEMA = value_schema(("id", col("int", "INT")), ("ts", col("string", "TIMESTAMP")))
TWO_TS_SCHEMA = value_schema(("a", col("string", "TIMESTAMP")), ("b", ["null", col("string", "TIMESTAMP")]))


def ts_checksum(text: str) -> int:
    return zlib.crc32(u64(1) + lp(text.encode()))


def test_avro_timestamp_is_hashed_in_utc() -> None:
    verifier = AvroChecksumVerifier(time_zone="Asia/Shanghai")
    value = row(ts_checksum("2024-03-01 00:00:00.500"), id=1, ts="2024-03-01 08:00:00.500")
    assert verifier.verify(value, TS_SCHEMA).verdict is ChecksumVerdict.OK
    # The same row with the verifier in the wrong zone (UTC, the default) is a mismatch.
    assert AvroChecksumVerifier().verify(value, TS_SCHEMA).verdict is ChecksumVerdict.CHECKSUM_MISMATCH


def test_avro_timestamp_as_sent_mode_hashes_the_text() -> None:
    verifier = AvroChecksumVerifier(time_zone="Asia/Shanghai", timestamp_mode="as_sent")
    as_sent = row(ts_checksum("2024-03-01 08:00:00.500"), id=1, ts="2024-03-01 08:00:00.500")
    assert verifier.verify(as_sent, TS_SCHEMA).verdict is ChecksumVerdict.OK
    converted = row(ts_checksum("2024-03-01 00:00:00.500"), id=1, ts="2024-03-01 08:00:00.500")
    assert verifier.verify(converted, TS_SCHEMA).verdict is ChecksumVerdict.CHECKSUM_MISMATCH


def test_avro_both_modes_agree_in_utc() -> None:
    value = row(ts_checksum("2024-03-01 08:00:00.500"), id=1, ts="2024-03-01 08:00:00.500")
    for mode in ("utc", "as_sent"):
        assert AvroChecksumVerifier(timestamp_mode=mode).verify(value, TS_SCHEMA).verdict is ChecksumVerdict.OK


def test_avro_repeated_hour_matches_under_either_reading_and_says_so() -> None:
    verifier = AvroChecksumVerifier(time_zone="Europe/Berlin")
    go_reading = verifier.verify(row(ts_checksum("2024-10-27 01:30:00"), id=1, ts="2024-10-27 02:30:00"), TS_SCHEMA)
    assert go_reading.verdict is ChecksumVerdict.OK
    assert "repeated hour" in go_reading.detail and "TiCDC's reading" in go_reading.detail
    other = verifier.verify(row(ts_checksum("2024-10-27 00:30:00"), id=1, ts="2024-10-27 02:30:00"), TS_SCHEMA)
    assert other.verdict is ChecksumVerdict.OK
    assert "other reading" in other.detail and "ts" in other.detail
    neither = verifier.verify(row(ts_checksum("2024-10-27 02:30:00"), id=1, ts="2024-10-27 02:30:00"), TS_SCHEMA)
    assert neither.verdict is ChecksumVerdict.CHECKSUM_MISMATCH


def test_avro_repeated_hour_in_two_columns_tries_the_combinations() -> None:
    verifier = AvroChecksumVerifier(time_zone="America/New_York")
    # a read as the later occurrence (EST), b as TiCDC's (EDT, the earlier).
    expected = zlib.crc32(lp(b"2024-11-03 06:15:00") + lp(b"2024-11-03 05:45:00"))
    result = verifier.verify(row(expected, a="2024-11-03 01:15:00", b="2024-11-03 01:45:00"), TWO_TS_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK
    assert "TIMESTAMP a in a repeated hour" in result.detail
    # A non-ambiguous row in the same zone has no note.
    plain = zlib.crc32(lp(b"2024-07-01 16:00:00"))
    quiet = verifier.verify(row(plain, a="2024-07-01 12:00:00", b=None), TWO_TS_SCHEMA)
    assert quiet.verdict is ChecksumVerdict.OK and quiet.detail == ""


def test_avro_unreadable_timestamp_is_malformed_outside_utc() -> None:
    verifier = AvroChecksumVerifier(time_zone="Asia/Shanghai")
    result = verifier.verify(row(123, id=1, ts="2024-13-01 00:00:00"), TS_SCHEMA)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert "'ts' (TIMESTAMP)" in result.detail and "month" in result.detail


# Simple: the zone travels with each value --------------------------------------------------------

SIMPLE_SCHEMA: dict[str, Any] = {
    "database": "test",
    "table": "t",
    "version": 5,
    "columns": [simple_column("id", "int"), simple_column("ts", "timestamp")],
    "indexes": [],
}


def simple_insert(ts: object, current: int) -> dict[str, Any]:
    return {
        "version": 1,
        "database": "test",
        "table": "t",
        "type": "INSERT",
        "commitTs": 1,
        "schemaVersion": 5,
        "checksum": {"version": 0, "corrupted": False, "current": current, "previous": 0},
        "data": {"id": "1", "ts": ts},
    }


@pytest.mark.parametrize(
    ("location", "verifier_zone", "utc_text"),
    [
        ("Europe/Berlin", "UTC", "2024-07-01 10:00:00.25"),
        ("America/New_York", "Asia/Tokyo", "2024-07-01 16:00:00.25"),
        ("UTC", "Asia/Tokyo", "2024-07-01 12:00:00.25"),
        # TiCDC's "host zone" names: the verifier's setting stands in.
        ("Local", "Asia/Tokyo", "2024-07-01 03:00:00.25"),
        ("", "Asia/Tokyo", "2024-07-01 03:00:00.25"),
    ],
)
def test_simple_timestamp_uses_its_location(location: str, verifier_zone: str, utc_text: str) -> None:
    verifier = SimpleChecksumVerifier(time_zone=verifier_zone)
    value = {"location": location, "value": "2024-07-01 12:00:00.25"}
    (result,) = verifier.verify(simple_insert(value, ts_checksum(utc_text)), SIMPLE_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK, result.detail


def test_simple_repeated_hour_matches_the_other_reading() -> None:
    value = {"location": "Europe/Berlin", "value": "2024-10-27 02:30:00"}
    (result,) = SimpleChecksumVerifier().verify(simple_insert(value, ts_checksum("2024-10-27 00:30:00")), SIMPLE_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK
    assert "other reading" in result.detail


def test_simple_timestamp_as_sent_mode() -> None:
    value = {"location": "Asia/Shanghai", "value": "2024-03-01 08:00:00"}
    verifier = SimpleChecksumVerifier(timestamp_mode="as_sent")
    (result,) = verifier.verify(simple_insert(value, ts_checksum("2024-03-01 08:00:00")), SIMPLE_SCHEMA)
    assert result.verdict is ChecksumVerdict.OK


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"location": "Mars/Base", "value": "2024-03-01 08:00:00"}, "unknown time zone 'Mars/Base'"),
        ({"location": "Asia/Shanghai", "value": "yesterday"}, "not a TIMESTAMP text"),
        ({"location": "Asia/Shanghai"}, "data.ts (timestamp)"),
        ({"location": 8, "value": "2024-03-01 08:00:00"}, "expected a TIMESTAMP {location, value}"),
        (1709280000, "expected a TIMESTAMP {location, value}"),
    ],
)
def test_simple_bad_timestamps_are_malformed(value: object, fragment: str) -> None:
    (result,) = SimpleChecksumVerifier().verify(simple_insert(value, 123), SIMPLE_SCHEMA)
    assert result.verdict is ChecksumVerdict.MALFORMED
    assert fragment in result.detail, result.detail


ZONES_WITH_TRANSITIONS = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # 30-minute DST
    "Asia/Kathmandu",  # +05:45
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Caracas",  # -04:00 -> -04:30 (2007) -> -04:00 (2016)
    "Pacific/Apia",  # skipped 2011-12-30
    "America/Sao_Paulo",  # DST at midnight until 2019
]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(ZONES_WITH_TRANSITIONS),
    st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2038, 1, 18)),
    st.sampled_from(["", ".5", ".000001"]),
)
def test_memoised_renderings_agree_with_the_general_reading(
    zone_name: str, wall: datetime.datetime, fraction: str
) -> None:
    zone = load_zone(zone_name)
    text = wall.strftime("%Y-%m-%d %H:%M:%S") + fraction
    readings = utc_readings(text, zone)
    renderings = UtcRenderings(zone)
    assert renderings[text] == lp(readings[0].encode())
    assert (renderings.other_reading(text) is not None) == (len(readings) > 1)
    # A second wall clock of the same day goes through the day's memoised offset.
    later = (wall + datetime.timedelta(minutes=7)).strftime("%Y-%m-%d %H:%M:%S")
    assert renderings[later] == lp(utc_readings(later, zone)[0].encode())


@pytest.mark.parametrize("zone_name", ZONES_WITH_TRANSITIONS)
def test_every_wall_clock_around_each_transition_reads_as_go_does(zone_name: str) -> None:
    zone = load_zone(zone_name)
    renderings = UtcRenderings(zone)
    checked = 0
    # Every 10 minutes around each day whose offset differs from the previous day's (1970-2030).
    day = datetime.datetime(1970, 1, 2)
    previous = day.replace(tzinfo=zone).utcoffset()
    while day < datetime.datetime(2030, 1, 1):
        day += datetime.timedelta(days=1)
        offset = (day + datetime.timedelta(hours=12)).replace(tzinfo=zone).utcoffset()
        if offset != previous:
            for minutes in range(-24 * 60, 48 * 60, 10):
                text = (day + datetime.timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M:%S")
                assert renderings[text] == lp(utc_readings(text, zone)[0].encode()), text
                checked += 1
        previous = offset
    assert checked > 0


def test_memoised_renderings_keep_the_zero_value_and_reject_what_is_not_a_timestamp() -> None:
    renderings = UtcRenderings(load_zone("Asia/Shanghai"))
    assert renderings["0000-00-00 00:00:00.000"] == lp(b"0000-00-00 00:00:00.000")
    assert renderings["2024-03-01 08:00:00.500"] == lp(b"2024-03-01 00:00:00.500")
    for text in ("2024-03-01T08:00:00", "20240301 080000", "2024-03-01 08:00:00+08:00", "2024-03-01 08:00:00.5x"):
        with pytest.raises(ValueError):
            renderings[text]
