"""report.html as an on-call engineer sees it: in a real browser (Debian's chromium) 1400 px
wide, with every finding class a run can report, changefeed findings with long details and
checksums, and live incidents beside the topics.

The page must fit: nothing wider than the window, the topic table whole inside it, a finding's
detail wide enough to read, and no number broken over two lines.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from playwright.async_api import async_playwright
from pyspark.sql import DataFrame, SparkSession

from kdiv.reconcile import report
from kdiv.reconcile.findings import (
    CHECKSUM_MISMATCH,
    CORRUPTED_FLAG,
    LOST,
    MALFORMED,
    REPORT_FIELDS,
    REPORT_SCHEMA,
    SUBJECT_MISMATCH,
    UNVALIDATED,
)
from kdiv.reconcile.summary import INCIDENTS_READ
from tests.harness.browser import chromium

WIDTH = 1400
T0 = 1_714_560_000_000
# A detail cell narrower than this many digits is a column of fragments.
DETAIL_MIN_CHARS = 20
ORDERS = "orders.eu-west-1.checkout-service.v2"
CHANGEFEED = "tidb-cdc.shop.order_items_with_a_long_name"
LONG_DETAIL = (
    "row checksum 3735928559 computed 4027432669 over columns id=18446744073709551615, "
    "sku='A-000123456789', qty=123456789012, price=99999999.99, updated_at=2024-05-01 10:40:00.123456; "
    "previous image checksum 2882400001 matches"
)


def report_row(cls: str, topic: str, offset: int, **values) -> tuple:
    row = dict.fromkeys(REPORT_FIELDS)
    row.update(
        {"class": cls, "topic": topic, "partition": 3, "offset": offset, "timestamp_ms": T0 + offset, "count": 1}
    )
    row["detail"] = values.pop("detail", "gone")
    row.update(values)
    return tuple(row[name] for name in REPORT_FIELDS)


FINDINGS = [
    report_row(LOST, ORDERS, 123_456_789, key=b"order-123456789", detail="validated at offset 123456789; key gone"),
    report_row(UNVALIDATED, ORDERS, 223_456_789, key=b"order-9", detail="never validated"),
    report_row(
        SUBJECT_MISMATCH,
        ORDERS,
        5,
        schema_id=4_294_967_295,
        expected_subject=f"{ORDERS}-store-changelog-value",
        registered_subjects=["some-other-subject-value"],
        detail="schema 4294967295 registered under some-other-subject-value",
    ),
    *(
        report_row(
            cls,
            CHANGEFEED,
            9_876_543_210 + i,
            key=b'{"id":18446744073709551615}',
            table="shop.order_items_with_a_long_name",
            row_key='{"id":18446744073709551615,"line":12345}',
            commit_ts=449_618_297_470_189_569 + i,
            expected_checksum=3_735_928_559,
            computed_checksum=4_027_432_669,
            image="current",
            detail=LONG_DETAIL,
        )
        for i, cls in enumerate((CHECKSUM_MISMATCH, CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED))
    ),
]
INCIDENTS = {
    "topic": "kdiv-incidents",
    "status": INCIDENTS_READ,
    "window": {"from_ms": T0 - 86_400_000, "to_ms": T0},
    "by_topic": {ORDERS: {"CORRUPT": 41, "MISSING": 62}},
    "held": 150,
    "outside_window": 47,
    "malformed": 0,
    "first_malformed": None,
}


@pytest.fixture(scope="module")
def layout_spark(spark: SparkSession) -> SparkSession:
    # The session's one SparkSession (tests/conftest.py): the first session a process starts
    # decides its JVM's classpath, so none is built here (one without Spark's kafka connector
    # left later modules in the same process without it).
    return spark


@pytest.fixture(scope="module")
def page_path(layout_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    findings: DataFrame = layout_spark.createDataFrame(FINDINGS, REPORT_SCHEMA)
    summary = {
        "snapshot": {"taken_at_ms": T0},
        "topics": [ORDERS, CHANGEFEED, "payments"],
        "records_read": {ORDERS: 1_234_567_890, CHANGEFEED: 98_765_432, "payments": 0},
        "finished_at_ms": T0 + 60_000,
        "duration_s": 61.5,
        "exit_code": 1,
        # Both keys: the topic table then has a column for every class a run can report.
        "changefeeds": {
            CHANGEFEED: {
                "protocol": "avro",
                "rows": {"OK": 98_765_428, CHECKSUM_MISMATCH: 2, CORRUPTED_FLAG: 1, MALFORMED: 1},
                "tables": {"shop.order_items_with_a_long_name": {"OK": 98_765_428, CHECKSUM_MISMATCH: 2}},
            }
        },
        "routes": {},
        "incidents": INCIDENTS,
    }
    return report.write_report(findings, None, summary, tmp_path_factory.mktemp("layout")).report_html


MEASURE = """() => {
    const box = el => el.getBoundingClientRect();
    const byTopic = document.getElementById('counts-by-topic');
    const detail = document.querySelector('#findings-checksum_mismatch td.detail');
    const probe = document.createElement('span');
    probe.textContent = '0'.repeat(10);
    detail.appendChild(probe);
    const digit = probe.getBoundingClientRect().width / 10;
    probe.remove();
    const brokenNumbers = [...document.querySelectorAll('td.num')].filter(cell => {
        const range = document.createRange();
        range.selectNodeContents(cell);
        return range.getClientRects().length > 1;
    }).map(cell => cell.textContent);
    return {
        scrollWidth: document.documentElement.scrollWidth,
        byTopic: {left: box(byTopic).left, right: box(byTopic).right},
        byTopicBoxScrolls: byTopic.parentElement.scrollWidth > byTopic.parentElement.clientWidth,
        detailWidth: box(detail).width,
        detailRight: box(detail).right,
        detailBoxRight: box(detail.closest('.table-box')).right,
        digit: digit,
        brokenNumbers: brokenNumbers,
        incidentsCell: [...byTopic.querySelectorAll('tbody tr')]
            .find(r => r.cells[0].textContent === '__ORDERS__').lastElementChild.innerText,
    };
}""".replace("__ORDERS__", ORDERS)


async def measured(path: Path, screenshot: Path) -> dict:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": WIDTH, "height": 900})
            await page.goto(path.as_uri())
            await page.screenshot(path=str(screenshot), full_page=True)
            return await page.evaluate(MEASURE)
        finally:
            await browser.close()


@pytest.fixture(scope="module")
def layout(page_path: Path) -> dict:
    return asyncio.run(measured(page_path, page_path.with_suffix(".png")))


def test_nothing_is_wider_than_the_window(layout: dict) -> None:
    assert layout["scrollWidth"] <= WIDTH


def test_the_topic_table_is_whole_inside_the_window(layout: dict) -> None:
    assert layout["byTopic"]["left"] >= 0
    assert layout["byTopic"]["right"] <= WIDTH
    assert not layout["byTopicBoxScrolls"]


def test_a_changefeed_detail_is_wide_enough_to_read_and_in_sight(layout: dict) -> None:
    assert layout["detailWidth"] >= DETAIL_MIN_CHARS * layout["digit"], layout
    # Its table has the most columns a finding can fill: the detail, last, still needs no scrolling.
    assert layout["detailRight"] <= min(WIDTH, layout["detailBoxRight"]), layout


def test_no_number_is_broken_over_two_lines(layout: dict) -> None:
    assert layout["brokenNumbers"] == []


def test_the_topic_row_names_its_live_incidents_and_where_to_look(layout: dict) -> None:
    lines = layout["incidentsCell"].split("\n")
    assert lines[:3] == ["103", "CORRUPT: 41", "MISSING: 62"]
    assert "".join(lines[3:]) == f"/incidents/?topic={ORDERS}&since={T0 - 86_400_000}&until={T0}"
