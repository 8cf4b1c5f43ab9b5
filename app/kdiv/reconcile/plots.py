"""The plots of report.html, drawn by matplotlib as inline SVG.

The SVG is the same bytes for the same counts: text is drawn as paths (so the page needs no
font), ids are salted by plot rather than at random, and the date and creator are left out.
The plots draw what kdiv.reconcile.aggregates collected to the driver; they never touch a
DataFrame.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import matplotlib
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from kdiv.reconcile.aggregates import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS, Timeline
from kdiv.reconcile.legend import colour

# Topics past this many (by name) are counted in the tables but not plotted: the figure
# grows a row per topic.
TOPICS_PLOTTED = 12

# Text is drawn as paths (matplotlib's default) so the page needs no font, and is never parsed
# as mathtext: a "$" in a topic name is text. (svg_figure fixes the id salt and drops the date.)
_PLOT_RC = {"svg.fonttype": "path", "text.parse_math": False, "font.size": 9}


def svg_figure(figure: Figure, salt: str) -> str:
    """The figure as an inline <svg> element (no XML prolog or DOCTYPE, which belong to files)."""
    buffer = io.StringIO()
    # Each plot salts its ids differently: both SVGs share one HTML document and its id space.
    with matplotlib.rc_context({"svg.hashsalt": f"kdiv-reconcile-{salt}"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    # The RDF metadata only names namespaces by URL; the page is plainer without it.
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", text[text.index("<svg") :], flags=re.DOTALL).strip()
    return f"<figure>\n{svg}\n</figure>"


def plot_by_partition(partition_counts: list[tuple[str, int, str, int]], classes: Sequence[str]) -> str:
    """Findings per partition, classes stacked, one row per topic: a <figure>, and a note when
    some topics are left out."""
    topics = sorted({topic for topic, _, _, _ in partition_counts})
    plotted = topics[:TOPICS_PLOTTED]
    with matplotlib.rc_context(_PLOT_RC):  # type: ignore[arg-type]  # the stubs want literal rc keys
        figure = Figure(figsize=(9, 0.9 + 2.1 * len(plotted)), layout="constrained")
        axes = figure.subplots(len(plotted), 1, squeeze=False)[:, 0]
        drawn: list[str] = []
        for ax, topic in zip(axes, plotted, strict=False):
            per_cell = {(p, c): n for t, p, c, n in partition_counts if t == topic}
            partitions = sorted({p for p, _ in per_cell})
            bottoms = [0] * len(partitions)
            for cls in classes:
                heights = [per_cell.get((p, cls), 0) for p in partitions]
                if not any(heights):
                    continue
                ax.bar(partitions, heights, bottom=bottoms, width=0.8, color=colour(cls, classes))
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=False)]
                if cls not in drawn:
                    drawn.append(cls)
            ax.set_title(f"topic {topic}", loc="left")
            ax.set_xlabel("partition")
            ax.set_ylabel("findings")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
        drawn.sort(key=classes.index)
        figure.legend(
            [Line2D([], [], color=colour(c, classes), linewidth=8) for c in drawn],
            drawn,
            loc="outside upper center",
            ncols=min(len(drawn), 6),
            frameon=False,
        )
        svg = svg_figure(figure, "by-partition")
    note = ""
    if len(topics) > len(plotted):
        note = (
            f'\n<p class="note">Plotted: the first {len(plotted)} of {len(topics)} topics with findings, '
            "by name; the tables above count them all.</p>"
        )
    return svg + note


def plot_timeline(timeline: Timeline, classes: Sequence[str]) -> str:
    """Findings over record time as a <figure>; `timeline` must have counts."""
    with matplotlib.rc_context(_PLOT_RC):  # type: ignore[arg-type]  # the stubs want literal rc keys
        return svg_figure(timeline_figure(timeline, classes), "over-time")


def timeline_figure(timeline: Timeline, classes: Sequence[str]) -> Figure:
    width = timeline.bin_width_ms
    bins = list(range(timeline.first_bin_ms, timeline.last_bin_ms + 1, width))
    moments = [datetime.fromtimestamp(b / 1000, UTC) for b in bins]
    with matplotlib.rc_context(_PLOT_RC):  # type: ignore[arg-type]  # the stubs want literal rc keys
        figure = Figure(figsize=(9, 3.6), layout="constrained")
        ax = figure.subplots()
        # Stacked bars, one bin wide: classes at the same moments stack instead of hiding
        # each other, as lines over the same points would.
        bar_days = width / 86_400_000
        stacked = [0] * len(bins)
        for cls in classes:
            series = [timeline.counts.get((cls, b), 0) for b in bins]
            if any(series):
                ax.bar(
                    moments,  # type: ignore[arg-type]  # dates, through matplotlib's converters
                    series,
                    width=bar_days,
                    bottom=stacked,
                    align="edge",
                    color=colour(cls, classes),
                    label=cls,
                )
                stacked = [a + b for a, b in zip(stacked, series, strict=True)]
        # The span of the findings, a bin either side: a single bin would otherwise get
        # matplotlib's default span of years.
        padding = timedelta(milliseconds=width)
        ax.set_xlim(moments[0] - padding, moments[-1] + 2 * padding)  # type: ignore[arg-type]
        locator = AutoDateLocator(tz=UTC)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=UTC))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"record time (UTC), bins of {width_label(width)}")
        ax.set_ylabel("findings")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", frameon=False, ncols=3)
        return figure


def width_label(ms: int) -> str:
    """A bin width in its largest whole unit: "15 min", "3 h", "7 days"."""
    for unit_ms, unit in ((DAY_MS, "day"), (HOUR_MS, "h"), (MINUTE_MS, "min"), (SECOND_MS, "s")):
        if ms % unit_ms == 0:
            n = ms // unit_ms
            return f"{n} {unit}s" if unit == "day" and n != 1 else f"{n} {unit}"
    return f"{ms} ms"
