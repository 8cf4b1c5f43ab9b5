"""The incidents' view: `GET /incidents/`, the incidents this worker read from the incidents
topic (`kdiv.worker.web.incidents_reader`), filtered, newest first, in pages. Every worker
reads them all, so each answers for the group itself."""

from __future__ import annotations

import json

from faust.web import Request

from kdiv.div.faults import Verdict
from kdiv.registry.subjects import SCHEMA_UNKNOWN, SUBJECT_MISMATCH
from kdiv.ticdc.checksum import FAULT_VERDICTS, ChecksumVerdict
from kdiv.worker.incidents import DELETED_BEFORE_VALIDATION, LOG_REWOUND, PRODUCERS_LIMIT
from kdiv.worker.readmodel import WorkerReadModel
from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.params import MAX_PAGE, BadRequest, choice_param, int_param, is_hex_guid, scope, time_param
from kdiv.worker.web.shapes import incident_json

# Every class an incident can have: the per-record faults, the subject check's, the rewinds
# and deletions before validation.
INCIDENT_CLASSES = tuple(
    dict.fromkeys(
        [v.value for v in Verdict if v.is_fault]
        + [SCHEMA_UNKNOWN, SUBJECT_MISMATCH, LOG_REWOUND, DELETED_BEFORE_VALIDATION, PRODUCERS_LIMIT]
        + [v.value for v in ChecksumVerdict if v in FAULT_VERDICTS]
        + ["LOST", "DUPLICATED", "UNRESOLVED"]
    )
)
SEVERITIES = ("fatal", "warning")
# The most bytes of items a page holds (each measured as JSON with every non-ASCII character
# escaped, the longest it can be written): a page ends before the item that would pass it,
# and always holds one. An incident is at most 256 KiB (kdiv.incident.bounds), so a page of
# 1,000 of the largest would be 256 MiB.
MAX_PAGE_BYTES = 4 << 20


async def incidents_view(site: Site, request: Request) -> Answer:
    """Incidents matching the request, newest first, paginated."""
    scope(request)  # every worker reads the incidents itself: either scope is this
    return Answer(incidents_page(site.worker, request))


def incidents_page(worker: WorkerReadModel, request: Request) -> dict:
    """Incidents matching the request, newest first, paginated."""
    limit = int_param(request, "limit", 50, minimum=1, maximum=MAX_PAGE)
    offset = int_param(request, "offset", 0)
    topic = request.query.get("topic")
    partition = int_param(request, "partition", None)
    verdict = choice_param(request, "class", INCIDENT_CLASSES)
    severity = choice_param(request, "severity", SEVERITIES)
    producer = request.query.get("producer")
    if producer is not None and not is_hex_guid(producer):
        raise BadRequest(f"producer={producer!r} is not a producer GUID (32 hex digits)")
    since = time_param(request, "since")
    until = time_param(request, "until")
    matching = [
        i
        for i in worker.recent_incidents()
        if (topic is None or i.topic == topic)
        and (partition is None or i.partition == partition)
        and (verdict is None or i.verdict == verdict)
        and (severity is None or i.severity == severity)
        and (producer is None or i.producer == producer.lower())
        and (since is None or i.detected_at_ms >= since)
        and (until is None or i.detected_at_ms < until)
    ]
    items = page_within_bytes(matching[offset : offset + limit], MAX_PAGE_BYTES)
    after = offset + len(items)
    return {
        "items": items,
        "total": len(matching),
        "offset": offset,
        "limit": limit,
        "next_offset": after if after < len(matching) else None,
        "bytes_cut": len(items) < min(limit, max(len(matching) - offset, 0)),
        "read_to": [{"partition": p, "offset": o} for p, o in sorted(worker.incidents_read_to().items())],
    }


def page_within_bytes(page: list, max_bytes: int) -> list[dict]:
    """The items of `page` as the view shows them, as many from the first as `max_bytes` holds
    (the first always)."""
    items: list[dict] = []
    size = 0
    for incident in page:
        item = incident_json(incident)
        size += len(json.dumps(item))
        if items and size > max_bytes:
            break
        items.append(item)
    return items
