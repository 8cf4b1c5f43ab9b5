"""The worker's changefeed row counts (kdiv.worker.changefeeds): table names come from the
messages, so the tables counted by name, and the answer of /changefeeds/, are bounded."""

from __future__ import annotations

import json

from kdiv.changefeed.verify import RowVerdict
from kdiv.config.settings import ChangefeedSettings
from kdiv.incident.bounds import MAX_CHARS
from kdiv.ticdc.checksum import ChecksumResult, ChecksumVerdict
from kdiv.worker.changefeeds import MAX_TABLES, OTHER_TABLES, UNKNOWN_TABLE, ChangefeedChecks


def _row(table: str | None, partition: int = 0) -> RowVerdict:
    return RowVerdict("cdc", partition, 1, 5, ChecksumResult(ChecksumVerdict.OK, 1, 1, table, {}, 4))


def test_rows_are_counted_by_table_until_the_bound_then_under_other_tables():
    checks = ChangefeedChecks(ChangefeedSettings(), None)  # no registry needed
    smile = "\U0001f600"
    names = [f"{n:05}" + smile * 10_000 for n in range(MAX_TABLES + 50)]
    for name in names:
        checks._account([_row(name), _row(name)], 7)
    checks._account([_row(None), _row(names[0])], 7)
    items = checks.table_counts()
    by_table = {item["table"]: item["rows"] for item in items}
    assert len(items) == MAX_TABLES + 1  # every named table but the unknown one, and the rest
    assert by_table[OTHER_TABLES] == 2 * 50 + 1  # the 50 past the bound, and the unknown table's row
    assert UNKNOWN_TABLE not in by_table
    first = next(table for table in by_table if table.startswith("00000"))
    assert by_table[first] == 3 and first.endswith("more characters cut]")
    assert all(len(table) <= MAX_CHARS["table"] for table in by_table)
    # The answer: at most MAX_TABLES items, each of a bounded name, whatever the names were.
    assert len(json.dumps({"items": items})) <= (MAX_TABLES + 1) * (12 * MAX_CHARS["table"] + 400)
