"""The sections of report.html for the checks beside the DIV comparison: changefeed row
checksums (summary["changefeeds"], kdiv.reconcile.changefeeds) and pipeline routes
(summary["routes"], kdiv.reconcile.routes). Each returns markup lines from the summary alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kdiv.reconcile.findings import CHECKSUM_MISMATCH, CORRUPTED_FLAG, MALFORMED
from kdiv.reconcile.markup import escaped, number, table

# Row checksum verdicts, in the order the changefeed table shows them.
CHECKSUM_VERDICTS = ("OK", CHECKSUM_MISMATCH, CORRUPTED_FLAG, "SKIPPED", MALFORMED)
# A route hop's counts (summary["routes"][route]["hops"]), in the order the routes table shows them.
ROUTE_HOP_COUNTS = ("traced_in", "traced_out", "delivered", "lost", "duplicated", "pending")


def changefeed_section(changefeeds: Mapping[str, Any]) -> list[str]:
    """Row images verified per topic and table, by verdict (summary["changefeeds"])."""
    if not changefeeds:
        return ['<p class="note">No changefeed topic was found on the cluster.</p>']
    verdicts = list(CHECKSUM_VERDICTS)
    # A verdict this module does not know is still shown, after the known ones.
    for topic_summary in changefeeds.values():
        verdicts += [v for v in topic_summary.get("rows", {}) if v not in verdicts]
    rows: list[tuple[str, ...]] = []
    row_classes: list[str] = []
    notes = []
    for topic in sorted(changefeeds):
        entry = changefeeds[topic]
        protocol = escaped(entry.get("protocol", "—"))
        for table_name, per_verdict in sorted((entry.get("tables") or {}).items()):
            rows.append(
                (
                    f"<code>{escaped(topic)}</code>",
                    f"<code>{escaped(table_name)}</code>",
                    protocol,
                    number(sum(per_verdict.values())),
                    *(number(per_verdict.get(v, 0)) for v in verdicts),
                )
            )
            row_classes.append("")
        totals = entry.get("rows") or {}
        rows.append(
            (
                f"<code>{escaped(topic)}</code>",
                "All tables",
                protocol,
                number(sum(totals.values())),
                *(number(totals.get(v, 0)) for v in verdicts),
            )
        )
        row_classes.append("total")
        skipped = entry.get("skipped") or {}
        if skipped:
            reasons = ", ".join(f"{escaped(reason)}: {number(n)}" for reason, n in sorted(skipped.items()))
            notes.append(f'<p class="note">Skipped in <code>{escaped(topic)}</code>: {reasons}.</p>')
    return [
        '<p class="note">Every row image of the changefeed topics\' snapshot, verified by its TiCDC row '
        "checksum (a Simple UPDATE has two images). SKIPPED rows were not verified, for the reasons below.</p>",
        table(
            ("Topic", "Table", "Protocol", "Rows", *verdicts),
            rows,
            table_id="changefeed-rows",
            column_classes=dict.fromkeys(range(3, len(verdicts) + 4), "num"),
            row_classes=row_classes,
        ),
        *notes,
    ]


def routes_section(routes: Mapping[str, Any]) -> list[str]:
    """Traces per route and hop, by outcome (summary["routes"])."""
    if not routes:
        return ['<p class="note">No route is configured.</p>']
    header = (
        "Route",
        "Hop",
        "From",
        "Group",
        "To",
        "Traced in",
        "Traced out",
        "Delivered",
        "Lost",
        "Duplicated",
        "Pending",
    )
    rows: list[tuple[str, ...]] = []
    row_classes: list[str] = []
    notes = []

    def names(values: Sequence[str]) -> str:
        return " | ".join(f"<code>{escaped(v)}</code>" for v in values)

    for name in sorted(routes):
        entry = routes[name]
        for hop in entry.get("hops") or ():
            rows.append(
                (
                    f"<code>{escaped(name)}</code>",
                    number(hop.get("hop")),
                    names(hop.get("from") or ()),
                    f"<code>{escaped(hop.get('group', '—'))}</code>",
                    names(hop.get("to") or ()),
                    *(number(hop.get(count)) for count in ROUTE_HOP_COUNTS),
                )
            )
            row_classes.append("")
            if not hop.get("group_known", True):
                notes.append(
                    f'<p class="note">Route <code>{escaped(name)}</code>, hop {number(hop.get("hop"))}: the cluster '
                    f"does not know group <code>{escaped(hop.get('group'))}</code>, so it has committed nothing: its "
                    "traces are pending, never lost.</p>"
                )
        rows.append(
            (
                f"<code>{escaped(name)}</code>",
                "All hops",
                "",
                "",
                "",
                number(entry.get("traced")),
                "",
                *(number(entry.get(count)) for count in ROUTE_HOP_COUNTS[2:]),
            )
        )
        row_classes.append("total")
        if entry.get("file_sinks"):
            live = (
                "the live worker judges it up to its last topic"
                if entry.get("live_hops")
                else "the live worker does not judge it (its one hop writes files)"
            )
            notes.append(
                f'<p class="note">Route <code>{escaped(name)}</code> ends in files ({names(entry["file_sinks"])}), '
                f"read as they were when the job ran; {live}.</p>"
            )
        if entry.get("unreadable_trace_headers"):
            first = entry.get("first_unreadable_trace_header") or {}
            notes.append(
                f'<p class="note">Route <code>{escaped(name)}</code>: {number(entry["unreadable_trace_headers"])} '
                f"records carry a trace header that cannot be read, and are not followed; the first on "
                f"<code>{escaped(first.get('topic'))}</code>: {escaped(first.get('detail'))}.</p>"
            )
    return [
        '<p class="note">Every traced record of the routes\' topics, followed across the hops and judged as the '
        "live audit judges it, against each group's committed offsets read before the snapshot. Traced in and "
        "out: traces seen at the hop's input and output. Pending: traces waiting on the hop (its group has not "
        "committed past them): lag, not loss.</p>",
        table(
            header,
            rows,
            table_id="route-hops",
            column_classes=dict.fromkeys(range(5, len(header)), "num"),
            row_classes=row_classes,
        ),
        *notes,
    ]
