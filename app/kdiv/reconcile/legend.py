"""What report.html says each finding class means, and the colour it draws it in.

One colour per class, the same in the tables' swatches and in every plot, so a class reads
alike across topics and sections.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdiv.reconcile.findings import (
    CHECKSUM_MISMATCH,
    CORRUPTED_FLAG,
    DIVERGED,
    LOST,
    MALFORMED,
    NOT_VALIDATED,
    ROUTE_DUPLICATED,
    ROUTE_LOST,
    SCHEMA_UNKNOWN,
    SEQUENCE_BEHIND,
    SUBJECT_MISMATCH,
    UNREADABLE,
    UNVALIDATED,
)

CLASS_MEANINGS = {
    LOST: "validated record no longer in the topic (or the key gone without a tombstone)",
    UNVALIDATED: "record in the topic the validator passed without seeing",
    DIVERGED: "record at the validated offset is not the record validated (CRC32 differs)",
    SEQUENCE_BEHIND: "producer's highest (segment, seq) in the topic is below the table's",
    SUBJECT_MISMATCH: "restored state carries a schema id not registered under its changelog's subject",
    SCHEMA_UNKNOWN: "restored state carries a schema id the registry does not know",
    UNREADABLE: "changelog value the job cannot read (not framed, or not kdiv state)",
}
CLASS_COLOURS = {
    LOST: "#d62728",
    UNVALIDATED: "#ff7f0e",
    DIVERGED: "#9467bd",
    SEQUENCE_BEHIND: "#1f77b4",
    SUBJECT_MISMATCH: "#8c564b",
    SCHEMA_UNKNOWN: "#7f7f7f",
    UNREADABLE: "#e377c2",
}
# Reported by runs that compared the topics with the live worker's committed offsets.
BACKLOG_CLASS_MEANINGS = {
    NOT_VALIDATED: "records past the live worker's committed offset, older than KDIV_UNVALIDATED_AFTER_S: "
    "the worker has not validated them (stalled or far behind)",
}
BACKLOG_CLASS_COLOURS = {NOT_VALIDATED: "#bd9e39"}
# The changefeed classes, reported only by runs that verify changefeeds (summary["changefeeds"]).
CHECKSUM_CLASS_MEANINGS = {
    CHECKSUM_MISMATCH: "changefeed row whose TiCDC row checksum does not match its columns",
    CORRUPTED_FLAG: "changefeed row TiCDC itself flagged corrupted (its checksum disagreed with TiDB's)",
    MALFORMED: "changefeed record that cannot be read as a TiCDC message (or its writer schema is unknown)",
}
CHECKSUM_CLASS_COLOURS = {CHECKSUM_MISMATCH: "#843c39", CORRUPTED_FLAG: "#393b79", MALFORMED: "#637939"}
# The route classes, reported only by runs that check pipeline routes (summary["routes"]).
ROUTE_CLASS_MEANINGS = {
    ROUTE_LOST: "traced record a route's processor committed past and never wrote on (replay it from its offset)",
    ROUTE_DUPLICATED: "traced record a route's processor wrote more than once",
}
ROUTE_CLASS_COLOURS = {ROUTE_LOST: "#ad494a", ROUTE_DUPLICATED: "#e7969c"}
_MEANINGS = {**CLASS_MEANINGS, **BACKLOG_CLASS_MEANINGS, **CHECKSUM_CLASS_MEANINGS, **ROUTE_CLASS_MEANINGS}
_COLOURS = {**CLASS_COLOURS, **BACKLOG_CLASS_COLOURS, **CHECKSUM_CLASS_COLOURS, **ROUTE_CLASS_COLOURS}
# For a class the findings carry that this module does not know: reported, so drawn too.
_SPARE_COLOURS = ("#bcbd22", "#17becf", "#2ca02c")


def meaning(cls: str) -> str:
    """What a finding of `cls` is; "" for a class this module does not know."""
    return _MEANINGS.get(cls, "")


def colour(cls: str, classes: Sequence[str]) -> str:
    """The colour of `cls` among the report's `classes` (an unknown class takes a spare one by
    its place among the unknown, so it keeps its colour from plot to plot)."""
    if cls in _COLOURS:
        return _COLOURS[cls]
    spares = [c for c in classes if c not in _COLOURS]
    return _SPARE_COLOURS[spares.index(cls) % len(_SPARE_COLOURS)]
