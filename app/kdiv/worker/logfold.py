"""Repeated log lines folded into one per window: a broker that goes away makes aiokafka log
the same connection error for every request, thousands of lines a minute, which bury the one
line that says what happened. The first line of a kind passes; the same line again within the
window is counted, and the next one after it says how many were folded.

And a retriable failure aiokafka logs at ERROR (`DEMOTED`), which it retries by itself: a
warning, as it is (a changelog partition a few milliseconds old has no leader yet)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

WINDOW_S = 60.0
# Kinds of line remembered at most (the oldest forgotten first).
MAX_KINDS = 1000
# The loggers folded: the Kafka client's and the stream framework's, which repeat per request.
FOLDED_PREFIXES = ("aiokafka", "faust", "mode")


class FoldRepeats(logging.Filter):
    """Pass one line per (logger, level, message template) per window; count the rest."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        # kind -> [window start, lines folded in it]
        self._kinds: OrderedDict[tuple[str, int, str], list] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            # Appended to the template (the note holds no %, so formatting is unchanged).
            record.msg = f"{record.msg} ({seen[1]} more like this in the {now - seen[0]:.0f} s before)"
        self._kinds[kind] = [now, 0]
        self._kinds.move_to_end(kind)
        while len(self._kinds) > MAX_KINDS:
            self._kinds.popitem(last=False)
        return True


# (logger, message template) aiokafka logs at ERROR whatever the failure, retrying a retriable one.
DEMOTED = (("aiokafka.consumer.fetcher", "Failed fetch offsets from %s: %s"),)


class DemoteRetriable(logging.Filter):
    """An ERROR line of `DEMOTED` whose failure is retriable becomes a WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and (record.name, record.msg) in DEMOTED:
            args = record.args if isinstance(record.args, tuple) else ()
            if any(getattr(arg, "retriable", False) for arg in args):
                record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def demote_retriable() -> None:
    """Install `DemoteRetriable` on the loggers of `DEMOTED`, first among their filters (the
    fold then counts a line at the level it is written at)."""
    demote = DemoteRetriable()
    for name in {name for name, _ in DEMOTED}:
        logging.getLogger(name).filters.insert(0, demote)


def fold_repeats(names: Iterable[str] | None = None, window_s: float = WINDOW_S) -> FoldRepeats:
    """Install one `FoldRepeats` on every logger of the folded libraries (all existing
    loggers under `FOLDED_PREFIXES`, or `names`)."""
    fold = FoldRepeats(window_s)
    if names is None:
        existing = list(logging.Logger.manager.loggerDict)
        names = [n for n in existing if n.split(".")[0] in FOLDED_PREFIXES]
    for name in names:
        logging.getLogger(name).addFilter(fold)
    return fold
