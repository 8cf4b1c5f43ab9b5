"""report.html's account of the live validator's incidents (summary["incidents"], collected by
kdiv.reconcile.incidents): a cell per topic row, and the notes that say what was counted, over
which window, and where to look. Counts that could not be read show as unknown, never zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from kdiv.reconcile.markup import escaped, number, utc_time
from kdiv.reconcile.summary import INCIDENTS_MISSING, INCIDENTS_NOT_IN_SNAPSHOT, INCIDENTS_READ


def live_incidents_cell(incidents: Mapping[str, Any], topic: str) -> str:
    """Markup for one topic's row: the incidents in the window, by class, and the view listing them."""
    if incidents.get("status") != INCIDENTS_READ:
        return '<span class="note">unknown</span>'
    per_class: Mapping[str, int] = (incidents.get("by_topic") or {}).get(topic) or {}
    total = sum(per_class.values())
    if not total:
        return number(0)
    classes = "<br>".join(f"{escaped(cls)}: {number(n)}" for cls, n in sorted(per_class.items()))
    return f"<strong>{number(total)}</strong><br>{classes}<br>{_view_path(incidents, topic)}"


def live_incidents_total(incidents: Mapping[str, Any], topics: Iterable[str]) -> str:
    """Markup for the total row: the incidents of the table's `topics` (the notes name the others)."""
    if incidents.get("status") != INCIDENTS_READ:
        return '<span class="note">unknown</span>'
    by_topic = incidents.get("by_topic") or {}
    return number(sum(sum((by_topic.get(topic) or {}).values()) for topic in topics))


def live_incidents_notes(incidents: Mapping[str, Any], by_topic: Mapping[str, Any]) -> list[str]:
    """Paragraphs before the topic table: the window of its Live incidents column, and what
    else the incidents topic held (incidents outside the window or on other topics, records
    that are not incidents) or why it could not be read."""
    topic = f"<code>{escaped(incidents.get('topic', '—'))}</code>"
    status = incidents.get("status")
    if status != INCIDENTS_READ:
        if status == INCIDENTS_MISSING:
            why = f"the incidents topic {topic} does not exist on the cluster (no worker has written to it)"
        elif status == INCIDENTS_NOT_IN_SNAPSHOT:
            why = f"this run's snapshot does not cover the incidents topic {topic} (it was saved before it did)"
        else:
            reason = escaped(incidents.get("error") or "no reason given")
            why = f"the incidents topic {topic} could not be read: {reason}"
        return [f'<p class="warning">Live incidents unknown, not zero: {why}.</p>']
    window = incidents.get("window") or {}
    since = window.get("from_ms")
    start = (
        f"from the previous run's snapshot ({escaped(utc_time(since))}, where its count ended)"
        if since is not None
        else "from the start of the topic (no earlier run in this reports directory counted them)"
    )
    lines = [
        f'<p class="note">Live incidents: the faults the workers reported in {topic}, read to its '
        "end at this run's snapshot, each counted once (its latest record), detected "
        f"{start} up to this run's snapshot ({escaped(utc_time(window.get('to_ms')))}, not included). "
        "The worker's web view <code>/incidents/?topic=…</code> (on any worker's web port) lists them; "
        "each topic's cell gives the query for its window.</p>"
    ]
    others = {
        name: sum(per_class.values())
        for name, per_class in (incidents.get("by_topic") or {}).items()
        if name not in by_topic
    }
    held_apart = []
    outside = incidents.get("outside_window") or 0
    if outside:
        held_apart.append(f"{number(outside)} incident{'' if outside == 1 else 's'} detected outside the window")
    if others:
        named = ", ".join(f"<code>{escaped(name)}</code> ({number(n)})" for name, n in sorted(others.items()))
        held_apart.append(f"incidents in the window on topics this run did not cover: {named}")
    if held_apart:
        lines.append(f'<p class="note">The incidents topic also holds {"; ".join(held_apart)}.</p>')
    malformed = incidents.get("malformed") or 0
    if malformed:
        first = incidents.get("first_malformed") or {}
        lines.append(
            f'<p class="warning">{number(malformed)} record{"" if malformed == 1 else "s"} of {topic} '
            f"{'is' if malformed == 1 else 'are'} not an incident and not counted; the first, partition "
            f"{escaped(first.get('partition', '—'))} offset {escaped(first.get('offset', '—'))}: "
            f"{escaped(first.get('error', '—'))}</p>"
        )
    return lines


def _view_path(incidents: Mapping[str, Any], topic: str) -> str:
    """The workers' /incidents/ query for `topic` in the window (since inclusive, until exclusive, as counted)."""
    window = incidents.get("window") or {}
    query = {"topic": topic}
    if window.get("from_ms") is not None:
        query["since"] = str(window["from_ms"])
    if window.get("to_ms") is not None:
        query["until"] = str(window["to_ms"])
    # May wrap before each parameter: the cell stays narrow.
    path = escaped("/incidents/?" + urlencode(query)).replace("&amp;", "<wbr>&amp;")
    return f"<code>{path}</code>"
