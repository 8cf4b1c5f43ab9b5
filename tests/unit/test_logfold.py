"""Repeated lines of a library folded: one per window, then a count."""

from __future__ import annotations

import logging

from aiokafka.errors import NotLeaderForPartitionError, UnknownError

from kdiv.worker.logfold import DemoteRetriable, FoldRepeats, fold_repeats


def test_the_same_line_repeated_is_one_line_per_window_then_a_count(caplog):
    now = [0.0]
    fold = FoldRepeats(window_s=60, clock=lambda: now[0])
    logger = logging.getLogger("aiokafka.test-fold")
    logger.addFilter(fold)
    try:
        with caplog.at_level(logging.ERROR, logger="aiokafka.test-fold"):
            for second in range(120):
                now[0] = float(second)
                for _ in range(50):
                    logger.error("Unable connect to node with id %s: %s", 1, "[Errno 111] refused")
                logger.error("Unable to update metadata from %s", [1])
    finally:
        logger.removeFilter(fold)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Unable connect to node with id 1: [Errno 111] refused",
        "Unable to update metadata from [1]",
        "Unable connect to node with id 1: [Errno 111] refused (2999 more like this in the 60 s before)",
        "Unable to update metadata from [1] (59 more like this in the 60 s before)",
    ]


def test_other_lines_pass_and_the_filter_goes_on_every_library_logger():
    logging.getLogger("aiokafka.some.child")
    fold = fold_repeats()
    try:
        assert fold in logging.getLogger("aiokafka.some.child").filters
        assert fold not in logging.getLogger("kdiv.worker").filters
        record = logging.LogRecord("aiokafka.x", logging.INFO, __file__, 1, "a %s", ("b",), None)
        other = logging.LogRecord("aiokafka.x", logging.INFO, __file__, 1, "c", (), None)
        assert fold.filter(record) and fold.filter(other) and not fold.filter(record)
    finally:
        for name in list(logging.Logger.manager.loggerDict):
            logging.getLogger(name).removeFilter(fold)


def test_a_retriable_failure_aiokafka_logs_at_error_is_a_warning():
    demote = DemoteRetriable()

    def line(err: Exception) -> logging.LogRecord:
        record = logging.LogRecord(
            "aiokafka.consumer.fetcher", logging.ERROR, "f.py", 1, "Failed fetch offsets from %s: %s", (1, err), None
        )
        assert demote.filter(record)
        return record

    assert line(NotLeaderForPartitionError()).levelname == "WARNING"
    assert line(UnknownError()).levelname == "ERROR"  # not retriable: left as it is
