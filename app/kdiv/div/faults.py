"""Verdicts and the validation exceptions the tracker raises, after Venice's exceptions/validation.

The hierarchy matters: ImproperlyStartedSegment is a MissingData, as in Venice, so handlers
that catch MissingData also catch it; handlers that must tell them apart test it first.
"""

from __future__ import annotations

import enum


class Verdict(enum.Enum):
    """What the validator says of one record: OK, a fault class, or that it carries no (readable) DIV metadata."""

    OK = "OK"
    DUPLICATE = "DUPLICATE"
    MISSING = "MISSING"
    CORRUPT = "CORRUPT"
    UNREGISTERED_PRODUCER = "UNREGISTERED_PRODUCER"
    DATA_AFTER_SEGMENT_END = "DATA_AFTER_SEGMENT_END"
    # Exact semantics only (`kdiv.div.exact`); Venice reads both as DUPLICATE.
    LATE = "LATE"  # a seq reported MISSING, arriving now
    DIVERGENT = "DIVERGENT"  # a seq seen before, now with other bytes
    UNTRACKED = "UNTRACKED"  # no `div` header: not ours to judge
    MALFORMED = "MALFORMED"  # a `div` header that cannot be decoded

    @property
    def is_fault(self) -> bool:
        """True for the verdicts that are reported as incidents."""
        return self not in (Verdict.OK, Verdict.UNTRACKED)


# Faults that fail a push when they happen inside one (Venice's FatalDataValidationException),
# and DIVERGENT: the push holds two versions of one record.
FATAL_VERDICTS = frozenset(
    {
        Verdict.MISSING,
        Verdict.CORRUPT,
        Verdict.UNREGISTERED_PRODUCER,
        Verdict.DATA_AFTER_SEGMENT_END,
        Verdict.DIVERGENT,
    }
)


class DataValidationError(Exception):
    """A fault found while tracking a record: its verdict and a detail naming what differs."""

    verdict: Verdict

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class DuplicateData(DataValidationError):
    """Benign: the record was already accepted; consumers skip it."""

    verdict = Verdict.DUPLICATE


class FatalDataValidation(DataValidationError):
    """A fault that fails a push; after the push it is reported and state moves past it."""


class MissingData(FatalDataValidation):
    """Records or segments of a producer that never arrived (Venice's MISSING)."""

    verdict = Verdict.MISSING


class ImproperlyStartedSegment(MissingData):
    """A segment seen without its START_OF_SEGMENT where that cannot be excused."""

    verdict = Verdict.UNREGISTERED_PRODUCER


class CorruptData(FatalDataValidation):
    """A record, or a segment's checksum, that does not match what the producer sent."""

    verdict = Verdict.CORRUPT


class DataAfterSegmentEnded(FatalDataValidation):
    """A record for a segment whose checksum was already finalised by its END_OF_SEGMENT."""

    verdict = Verdict.DATA_AFTER_SEGMENT_END
