"""`GET /reconcile/{run}/report.html`: a reconciliation run's report, from KDIV_RECONCILE_REPORTS.

Only a run directory's report is served: the run's name is matched before it reaches the file
system, and the file found (through links or not) must lie under the reports directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web
from faust.web import Request

from kdiv.worker.web.handlers import Answer, Site

REPORT = "/reconcile/{run}/report.html"
REPORT_FILE = "report.html"
# A run directory's name as `kdiv reconcile` makes it (a snapshot time); nothing else is looked
# up, so no "..", no separator, no hidden name reaches the file system.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# report.html is self-contained: inline CSS and SVG, no script; so it gets no script at all.
REPORT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def report_path(reports: Path | None, run: str) -> Path | None:
    """The report.html of run `run` under `reports`, or None when there is none: a name
    that is not a run's, or a file (through a link or not) outside `reports`."""
    if reports is None or RUN_NAME.fullmatch(run) is None or ".." in run:
        return None
    try:
        root = reports.resolve(strict=True)
        found = (root / run / REPORT_FILE).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, a link loop
        return None
    if not found.is_relative_to(root) or not found.is_file():
        return None
    return found


def report_url(reports: Path | None, run: str | None) -> str | None:
    """The path the worker serves a run's report at, when it has one."""
    if run is None or report_path(reports, run) is None:
        return None
    return REPORT.replace("{run}", run)


async def report_view(site: Site, request: Request, run: str) -> Answer:
    """A reconciliation run's report.html."""
    found = report_path(site.worker.settings.reconcile_reports, run)
    if found is None:
        return Answer.error(404, f"no reconciliation report of run {run!r}")
    try:
        page = found.read_text(encoding="utf-8", errors="replace")
    except OSError as failed:
        return Answer.error(404, f"the reconciliation report of run {run!r} cannot be read: {failed.strerror}")
    return Answer(page, html=True)


async def report_policy(request: web.Request, response: web.StreamResponse) -> None:
    """An on_response_prepare handler, after `webguard.security_headers`: a report's own
    inline CSS is allowed, and nothing else."""
    route = request.match_info.route
    if response.status == 200 and route.resource is not None and route.resource.canonical == REPORT:
        response.headers["Content-Security-Policy"] = REPORT_POLICY
