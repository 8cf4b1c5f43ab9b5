"""TIMESTAMP values: from the text TiCDC sends (its server's zone) to the UTC text TiDB hashed.

TiCDC renders a TIMESTAMP in its server's zone, keeping the column's fraction digits; the
checksum covers the UTC rendering. The wall clock is read the way TiCDC's Go decoder reads it
(`time.Date`): the offset in force at the wall clock taken as a UTC instant, corrected once
when the instant so obtained falls outside that offset's period. In a repeated (DST fall-back)
hour the wall clock names two instants; both readings are offered so that the verifier can
accept either.
"""

from __future__ import annotations

import enum
import struct
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from kdiv.untrusted import preview

_ZERO_WALL_CLOCK = "0000-00-00 00:00:00"
# Zone names TiCDC resolves to its host's zone (`pkg/util/tz.go`); the verifier's setting stands in.
_HOST_ZONE_NAMES = frozenset({"", "system", "local"})
_UTC_NAMES = frozenset({"UTC", "Etc/UTC"})
# Memoised renderings per zone: TIMESTAMP values repeat (inserts of one second, batch updates).
_MEMO_LIMIT = 65_536

_pack_length = struct.Struct("<I").pack


class TimestampMode(enum.Enum):
    """What text of a TIMESTAMP the checksum covers."""

    UTC = "utc"  # TiCDC v7.1.4+, v7.5.2+, v8.0.0+: converted to UTC (tiflow #10564)
    AS_SENT = "as_sent"  # earlier releases: the text as sent, in the server's zone


def parse_timestamp_mode(mode: TimestampMode | str) -> TimestampMode:
    """The mode named by `mode`; ValueError names the accepted spellings."""
    if isinstance(mode, TimestampMode):
        return mode
    try:
        return TimestampMode(mode)
    except ValueError:
        accepted = ", ".join(m.value for m in TimestampMode)
        raise ValueError(f"timestamp_mode must be one of {accepted}, not {mode!r}") from None


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; ValueError (not zoneinfo's KeyError) when it is unknown."""
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError) as unknown:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"unknown time zone {name!r}") from unknown


def is_host_zone_name(name: str) -> bool:
    """True for the names TiCDC reads as 'this machine's zone', which a consumer cannot know."""
    return name.lower() in _HOST_ZONE_NAMES


def _wall_clock(text: str) -> datetime:
    # Strict `YYYY-MM-DD HH:MM:SS`: the form TiCDC renders, nothing TiDB's lenient parser also takes.
    if (
        len(text) != 19
        or text[4] != "-"
        or text[7] != "-"
        or text[10] != " "
        or text[13] != ":"
        or text[16] != ":"
        or not (text[:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:]).isdigit()
        or not text.isascii()
    ):
        raise ValueError(f"not a TIMESTAMP text 'YYYY-MM-DD HH:MM:SS[.fraction]': {preview(text)}")
    return datetime(
        int(text[:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]), int(text[14:16]), int(text[17:19])
    )


def _go_reading(wall: datetime, zone: ZoneInfo) -> datetime:
    as_utc = wall.replace(tzinfo=UTC)
    first_offset = as_utc.astimezone(zone).utcoffset()
    assert first_offset is not None  # an aware datetime in a ZoneInfo always has one
    second_offset = (as_utc - first_offset).astimezone(zone).utcoffset()
    assert second_offset is not None
    return (as_utc - second_offset).replace(tzinfo=None)


def _render(instant: datetime) -> str:
    # strftime's %Y does not pad years below 1000 on every platform.
    return (
        f"{instant.year:04d}-{instant.month:02d}-{instant.day:02d} "
        f"{instant.hour:02d}:{instant.minute:02d}:{instant.second:02d}"
    )


def _readings(wall: datetime, zone: ZoneInfo) -> list[datetime]:
    # Go's reading first, then the other occurrence of a repeated wall clock.
    readings = [_go_reading(wall, zone)]
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC).replace(tzinfo=None)
        # A wall clock skipped by a DST jump has no valid reading but Go's.
        round_trip = instant.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
        if round_trip == wall and instant not in readings:
            readings.append(instant)
    return readings


def utc_readings(text: str, zone: ZoneInfo) -> tuple[str, ...]:
    """The UTC renderings of TIMESTAMP `text` read in `zone`: TiCDC's reading first, then the
    other occurrence when the wall clock falls in a repeated hour. The fraction is kept as sent;
    the zero value is returned unchanged. ValueError when `text` is not a TIMESTAMP text.
    """
    wall_text, dot, fraction = text.partition(".")
    if dot and not (fraction.isdigit() and fraction.isascii()):
        raise ValueError(f"not a TIMESTAMP fraction: {preview(text)}")
    if wall_text == _ZERO_WALL_CLOCK:
        return (text,)
    wall = _wall_clock(wall_text)
    try:
        readings = _readings(wall, zone)
    except OverflowError:
        raise ValueError(f"TIMESTAMP {preview(text)} in {zone.key} is outside the representable range") from None
    suffix = dot + fraction
    return tuple(_render(instant) + suffix for instant in readings)


# A wall-clock span (a day, else an hour) is read with one offset when the zone keeps that
# offset from 3 hours (more than any DST or zone shift in the TIMESTAMP range) before its first
# reading to 3 hours after its last: then each of its wall clocks has one reading, which is
# Go's. Checked every 15 minutes, finer than any transition spacing.
_MAX_SHIFT: Final = timedelta(hours=3)
_SAMPLE_STEP_S: Final = 900
_DAY: Final = timedelta(days=1)
_HOUR: Final = timedelta(hours=1)


def _steady_offset(start: datetime, length: timedelta, zone: ZoneInfo) -> timedelta | None:
    """The offset to subtract from every wall clock in [start, start + length) to get its one
    UTC reading, or None when a zone transition is near."""
    try:
        offset = start.replace(tzinfo=UTC).astimezone(zone).utcoffset()
        assert offset is not None  # an aware datetime in a ZoneInfo always has one
        # The instants read (start - offset ...) with margins, and the wall clocks taken as UTC
        # instants (where Go's reading looks first).
        first = min(start - offset - _MAX_SHIFT, start).replace(tzinfo=UTC).timestamp()
        last = max(start + length - offset + _MAX_SHIFT, start + length).replace(tzinfo=UTC).timestamp()
        sample = first
        while True:
            if datetime.fromtimestamp(sample, zone).utcoffset() != offset:
                return None
            if sample >= last:
                return offset
            sample = min(sample + _SAMPLE_STEP_S, last)
    except (OverflowError, ValueError, OSError):  # beyond datetime's or the platform's range
        return None


_UNKNOWN_OFFSET: Final = timedelta(days=-999)
_SPAN_MEMO_LIMIT = 100_000


class UtcRenderings(dict[str, bytes]):
    """TIMESTAMP text in one zone -> its checksum bytes (length + UTC rendering), memoised.

    A dict, so that the hot path's lookup is a C-level `__getitem__`; misses are computed by
    `__missing__`: through the day's (else the hour's) one offset when no zone transition is
    near, else through `utc_readings`. Texts in a repeated hour are remembered in `ambiguous`,
    with the other reading's bytes.
    """

    __slots__ = ("ambiguous", "span_offsets", "zone")

    def __init__(self, zone: ZoneInfo) -> None:
        super().__init__()
        self.zone = zone
        self.ambiguous: dict[str, bytes] = {}
        # `YYYY-MM-DD` or `YYYY-MM-DD HH` -> the span's one offset, or None near a transition.
        self.span_offsets: dict[str, timedelta | None] = {}

    def __missing__(self, text: str) -> bytes:
        if len(self) >= _MEMO_LIMIT:
            self.clear()
            self.ambiguous.clear()
        encoded = self._through_steady_offset(text)
        if encoded is None:
            readings = [_length_prefixed(reading) for reading in utc_readings(text, self.zone)]
            encoded = readings[0]
            if len(readings) > 1:
                self.ambiguous[text] = readings[1]
        self[text] = encoded
        return encoded

    def _through_steady_offset(self, text: str) -> bytes | None:
        # None sends the text down the general path, which also names what is wrong with it.
        wall_text, dot, fraction = text.partition(".")
        if len(wall_text) != 19 or (dot and not (fraction.isdigit() and fraction.isascii())):
            return None
        try:
            wall = datetime.fromisoformat(wall_text)
            # fromisoformat also reads other forms (and zone suffixes, cut off by the length
            # test): only the canonical text round-trips.
            if wall.isoformat(" ") != wall_text:
                return None
            offset = self.span_offsets.get(wall_text[:10], _UNKNOWN_OFFSET)
            if offset is _UNKNOWN_OFFSET:
                offset = self._span_offset(wall_text[:10], wall.replace(hour=0, minute=0, second=0), _DAY)
            if offset is None:
                offset = self.span_offsets.get(wall_text[:13], _UNKNOWN_OFFSET)
                if offset is _UNKNOWN_OFFSET:
                    offset = self._span_offset(wall_text[:13], wall.replace(minute=0, second=0), _HOUR)
            if offset is None:
                return None
            return _length_prefixed((wall - offset).isoformat(" ") + dot + fraction)
        except (ValueError, OverflowError):
            return None

    def _span_offset(self, span: str, start: datetime, length: timedelta) -> timedelta | None:
        if len(self.span_offsets) >= _SPAN_MEMO_LIMIT:
            self.span_offsets.clear()
        offset = self.span_offsets[span] = _steady_offset(start, length, self.zone)
        return offset

    def other_reading(self, text: str) -> bytes | None:
        """The bytes of the other reading of `text` when it falls in a repeated hour, else None."""
        readings = utc_readings(text, self.zone)
        return _length_prefixed(readings[1]) if len(readings) > 1 else None


def _length_prefixed(text: str) -> bytes:
    data = text.encode()
    return _pack_length(len(data)) + data


def is_utc(zone: ZoneInfo) -> bool:
    """True when renderings in `zone` are the UTC text itself (nothing to convert)."""
    return zone.key in _UTC_NAMES
