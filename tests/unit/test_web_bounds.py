"""Which connection a new one takes the place of at the cap, and which client faults are
logged on their own and which as a count (kdiv.worker.web.bounds, pure)."""

from __future__ import annotations

import pytest

from kdiv.worker.web.bounds import (
    EVICTED,
    HEADER_TIMEOUT,
    MALFORMED,
    REFUSED,
    Admission,
    ConnectionTable,
    FaultTally,
    descriptor_shortage,
)


def test_under_the_cap_every_connection_is_admitted():
    table: ConnectionTable[str] = ConnectionTable(3)
    assert [table.open(c) for c in "abc"] == [Admission(True)] * 3
    assert len(table) == 3


def test_at_the_cap_a_new_connection_takes_the_place_of_the_one_longest_without_a_request():
    table: ConnectionTable[str] = ConnectionTable(3)
    for c in "abc":
        table.open(c)
    table.busy("a")  # answering: never closed for another
    assert table.open("d") == Admission(True, "b")
    assert table.open("e") == Admission(True, "c")
    # "a" is answered and waits again: now the newest waiting one, after "d" and "e".
    table.waiting("a")
    assert table.open("f") == Admission(True, "d")
    assert table.open("g") == Admission(True, "e")
    assert table.open("h") == Admission(True, "a")
    assert len(table) == 3


def test_when_every_connection_is_answering_a_new_one_is_refused():
    table: ConnectionTable[str] = ConnectionTable(2)
    for c in "ab":
        table.open(c)
        table.busy(c)
    assert table.open("c") == Admission(False)
    assert len(table) == 2 and not table.is_waiting("c")
    table.close("a")
    assert table.open("c") == Admission(True)
    assert len(table) == 2


def test_a_closed_connection_is_forgotten_whatever_its_state():
    table: ConnectionTable[str] = ConnectionTable(2)
    table.open("a")
    table.open("b")
    table.busy("b")
    table.close("a")
    table.close("b")
    table.busy("b")  # a late call for a closed connection does not bring it back
    table.waiting("b")
    assert len(table) == 0
    with pytest.raises(ValueError, match="admits none"):
        ConnectionTable(0)


def test_the_first_fault_of_each_kind_is_logged_then_the_interval_is_one_count_line():
    tally = FaultTally(60.0)
    assert tally.record(HEADER_TIMEOUT, 100.0) is True
    assert not any(tally.record(HEADER_TIMEOUT, 100.0 + n / 1000) for n in range(20_399))
    assert tally.record(MALFORMED, 120.0) is True
    assert tally.record(REFUSED, 130.0) is True
    assert tally.record(REFUSED, 131.0) is False
    assert tally.interval_ends == 160.0
    assert tally.summary(159.9) is None
    assert tally.summary(160.0) == (
        "web clients in the last 60 s: 1 malformed requests, 20,400 request heads not sent whole in time, "
        "2 connections refused at the cap"
    )
    # A new interval starts with the next fault, whose first of each kind is logged again.
    assert tally.interval_ends is None and tally.summary(500.0) is None
    assert tally.record(EVICTED, 600.0) is True
    assert tally.interval_ends == 660.0


def test_an_interval_whose_every_fault_was_logged_adds_no_count_line():
    tally = FaultTally(10.0)
    tally.record(MALFORMED, 0.0)
    tally.record(EVICTED, 1.0)
    assert tally.summary(10.0) is None
    assert tally.interval_ends is None


def test_a_cap_over_half_the_descriptor_limit_is_named():
    assert descriptor_shortage(256, 1024) is None
    assert descriptor_shortage(512, 1024) is None
    assert descriptor_shortage(256, -1) is None  # no limit
    shortage = descriptor_shortage(20_000, 20_000)
    assert shortage is not None and "KDIV_WEB_MAX_CONNECTIONS=20000" in shortage and "20000" in shortage
