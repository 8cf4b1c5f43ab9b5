"""The building blocks of report.html: the page, its style, tables, and how a cell shows a
number, a time, a duration or a record key: plain values in, markup out, no I/O.

Everything that returns markup escapes what it is given, except `table`, whose cells are
markup already (built from these functions).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from kdiv.clock import renderable_ms

# A record key is shown as text this long at most, or as this many bytes in hex.
KEY_TEXT_CHARS = 40
KEY_HEX_BYTES = 24

# Inline, so the page stands alone: opened from a mail or an archive, it fetches nothing.
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1f2328;
 max-width:96rem;margin:1.5rem auto;padding:0 1rem;line-height:1.45}
p,pre,figure{max-width:80rem}
h1{font-size:1.5rem;padding:.6rem 1rem;border-radius:.4rem;margin:0 0 .4rem}
h1.clean{background:#dafbe1;color:#116329}
h1.discrepancies{background:#ffebe9;color:#a40e26}
h1.failed{background:#fff1e5;color:#953800}
h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
h3{font-size:1rem;margin-bottom:.2rem}
table{border-collapse:collapse;margin:.4rem 0 1rem;font-size:.85rem}
th,td{border:1px solid #d0d7de;padding:.2rem .4rem;text-align:left;vertical-align:top}
thead th{background:#f6f8fa}
.num{text-align:right;font-variant-numeric:tabular-nums}
td.num{white-space:nowrap}
tr.total td,tr.total th{font-weight:600;background:#f6f8fa}
tr.behind td{background:#ffebe9}
td.detail{min-width:18em;max-width:40rem;overflow-wrap:anywhere}
.table-box{max-width:100%;overflow-x:auto}
td.incidents{min-width:13em}
td code{overflow-wrap:anywhere}
.warning{color:#953800;background:#fff1e5;padding:.3rem .6rem;border-radius:.3rem}
.table-box>table{margin-bottom:.4rem}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85em}
pre{background:#f6f8fa;padding:.6rem;border-radius:.3rem;white-space:pre-wrap;overflow-wrap:anywhere}
figure{margin:.5rem 0 1rem}
figure svg{max-width:100%;height:auto}
.note{color:#59636e}
.swatch{display:inline-block;width:.7em;height:.7em;margin-right:.3em;border-radius:.15em}
""".strip()


def escaped(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: Sequence[str]) -> str:
    """A whole HTML document around `body` (markup lines)."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escaped(title)}</title>",
            f"<style>\n{_CSS}\n</style>",
            "</head>",
            "<body>",
            *body,
            "</body>",
            "</html>",
            "",
        ]
    )


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    table_id: str,
    column_classes: Mapping[int, str] | None = None,
    row_classes: Sequence[str] | None = None,
) -> str:
    """An HTML table of already escaped cell markup; `column_classes`: CSS class per column index."""
    column_classes = column_classes or {}

    def cell(tag: str, index: int, markup: str) -> str:
        css = column_classes.get(index)
        return f'<{tag} class="{css}">{markup}</{tag}>' if css else f"<{tag}>{markup}</{tag}>"

    lines = [
        # The box scrolls a table wider than the page instead of the page itself.
        '<div class="table-box">',
        f'<table id="{escaped(table_id)}">',
        "<thead><tr>" + "".join(cell("th", i, breakable(h)) for i, h in enumerate(header)) + "</tr></thead>",
        "<tbody>",
    ]
    for index, row in enumerate(rows):
        css = row_classes[index] if row_classes else ""
        opening = f'<tr class="{css}">' if css else "<tr>"
        lines.append(opening + "".join(cell("td", i, markup) for i, markup in enumerate(row)) + "</tr>")
    lines += ["</tbody>", "</table>", "</div>"]
    return "\n".join(lines)


def breakable(name: str) -> str:
    """Escaped `name` that may wrap after each underscore and dot: class names (SUBJECT_MISMATCH,
    ...) and topic names (a TiCDC topic's db.table_name) would otherwise make a table wider
    than the page."""
    return escaped(name).replace("_", "_<wbr>").replace(".", ".<wbr>")


def number(value: int | None) -> str:
    """A count with thousands separators; a dash for none."""
    return "—" if value is None else f"{value:,}"


def utc_time(ms: int | None) -> str:
    """Milliseconds since the epoch as a UTC time to the millisecond; a dash for none or a
    negative time, the number itself for one no date can show."""
    if ms is None or (isinstance(ms, int) and ms < 0):
        return "—"
    if not renderable_ms(ms):
        return f"{ms} ms (out of range)"
    moment = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=(ms % 1000) * 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"


def key_markup(key: bytes | bytearray | None) -> str:
    """Escaped markup for a record key: its text when it is printable UTF-8, else its bytes in hex."""
    if key is None:
        return '<span class="note">(none)</span>'
    key = bytes(key)
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        shown = text if len(text) <= KEY_TEXT_CHARS else text[:KEY_TEXT_CHARS] + "…"
        return f"<code>{escaped(shown)}</code>"
    shown = key[:KEY_HEX_BYTES].hex() + ("…" if len(key) > KEY_HEX_BYTES else "")
    return f'<code title="{len(key)} bytes, shown in hex">0x{shown}</code>'


def clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
