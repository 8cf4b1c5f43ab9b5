"""The worker's log of the incidents it writes: one line per incident, at the level its
severity says (fatal: ERROR, warning: WARNING), naming its class, topic[partition]@offset
and producer. KDIV_LOG_INCIDENTS=false turns it off (the incidents topic still has them all).

Inside a push, Venice's rules report every record after a gap as MISSING: a line per record
would bury the first one, which is the one that matters. So a producer's run of incidents of
one class is logged by its first incident, and by one line with its length when it ends (the
producer's next record that is no fault, or an incident of another class).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from kdiv.div.validator import ValidationResult
from kdiv.incident.shape import Incident

# Keys of incidents already logged, so a rewrite (a replay, a gap or an episode growing) is not
# logged again; bounded, as the worker runs for months.
LOGGED_KEYS_KEPT = 10_000
_LEVELS = {"fatal": logging.ERROR, "warning": logging.WARNING}


def incident_line(incident: Incident) -> str:
    """The line that logs an incident: class, severity, where, producer (and route), detail."""
    producer = incident.producer if incident.producer is not None else "none"
    where = f"{incident.topic}[{incident.partition}]@{incident.offset}"
    if incident.segment is not None:
        producer += f" segment {incident.segment} seq {incident.seq}"
    route = f" route {incident.route} hop {incident.hop} trace {incident.trace_id}" if incident.route else ""
    return f"{incident.verdict} ({incident.severity}) at {where} producer {producer}{route}: {incident.detail}"


@dataclass
class _Run:
    verdict: str
    level: int
    first_offset: int
    last_offset: int
    count: int = 1


class IncidentLog:
    """Logs the incidents the worker writes (`written`), a producer's runs folded (`observe`)."""

    def __init__(self, logger: logging.Logger, enabled: bool = True) -> None:
        self._log = logger
        self.enabled = enabled
        self._logged: OrderedDict[bytes, None] = OrderedDict()
        # (topic, partition, producer hex) -> the run of incidents that producer is in
        self._runs: dict[tuple[str, int, str], _Run] = {}

    def written(self, incidents: Iterable[Incident]) -> None:
        """Log incidents just written to the incidents topic, each once."""
        if not self.enabled:
            return
        for incident in incidents:
            key = incident.key
            if key in self._logged:
                continue
            self._logged[key] = None
            if len(self._logged) > LOGGED_KEYS_KEPT:
                self._logged.popitem(last=False)
            level = _LEVELS.get(incident.severity, logging.WARNING)
            if incident.producer is not None:
                run_key = (incident.topic, incident.partition, incident.producer)
                run = self._runs.get(run_key)
                if run is not None and run.verdict == incident.verdict and incident.offset > run.last_offset:
                    run.last_offset = incident.offset
                    run.count += 1
                    run.level = max(run.level, level)
                    continue
                if run is not None:
                    self._end(run_key, run)
                self._runs[run_key] = _Run(incident.verdict, level, incident.offset, incident.offset)
            self._log.log(level, "%s", incident_line(incident))

    def producers_in_runs(self, topic: str, partition: int) -> set[bytes]:
        """Producers of the partition inside a run: their next OK record ends it, so the
        caller must show it to `observe` (the bulk path reports no other OK record)."""
        return {bytes.fromhex(p) for (t, part, p) in self._runs if t == topic and part == partition}

    def observe(self, results: Iterable[tuple[ValidationResult, Incident | None]]) -> None:
        """End the runs of producers whose record after the run's start is no fault."""
        for result, incident in results:
            if incident is not None or result.guid is None or not self._runs:
                continue
            record = result.record
            run_key = (record.topic, record.partition, result.guid.hex())
            run = self._runs.get(run_key)
            if run is not None and record.offset > run.first_offset:
                self._end(run_key, run)

    def _end(self, run_key: tuple[str, int, str], run: _Run) -> None:
        del self._runs[run_key]
        if run.count > 1:
            topic, partition, producer = run_key
            self._log.log(
                run.level,
                "%d %s incidents at %s[%d] offsets %d..%d from producer %s",
                run.count,
                run.verdict,
                topic,
                partition,
                run.first_offset,
                run.last_offset,
                producer,
            )
