"""The overview's web views: `GET /overview/` (what the dashboard's first screen shows) and
`GET /reconcile/{run}/report.html` (a reconciliation run's report, from KDIV_RECONCILE_REPORTS).
JSON shape in docs/web-views.md."""

from __future__ import annotations

import re
from http import HTTPStatus
from pathlib import Path

from aiohttp import web
from faust.web import Request, Response, View

from kdiv.worker.overview import GROUPS_PAGE, MAX_GROUPS_PAGE, GroupsQuery, overview
from kdiv.worker.views import LOCAL, QUERY_PARAMETERS, BadRequest, Views, parse_count

OVERVIEW = "/overview/"
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


def _count(request: Request, name: str, default: int | None, maximum: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    value = parse_count(raw, f"query parameter {name}")
    if maximum is not None and not 1 <= value <= maximum:
        raise BadRequest(f"query parameter {name}={value} is outside 1..{maximum}")
    return value


def groups_query(request: Request) -> GroupsQuery:
    """The incident groups asked for: `groups_topic`, `groups_partition`, `groups_offset`, `groups_limit`."""
    return GroupsQuery(
        topic=request.query.get("groups_topic") or None,
        partition=_count(request, "groups_partition", None),
        offset=_count(request, "groups_offset", 0) or 0,
        limit=_count(request, "groups_limit", GROUPS_PAGE, MAX_GROUPS_PAGE) or GROUPS_PAGE,
    )


def register_overview(app, views: Views) -> None:
    """Serve the overview and the reconciliation reports (after register_views' middlewares:
    the same host check, token and parameter checks apply)."""
    worker = views.worker
    # The parameter check (register_views' middleware) looks each route up in this table.
    QUERY_PARAMETERS[OVERVIEW] = frozenset(
        {"groups_topic", "groups_partition", "groups_offset", "groups_limit", "scope"}
    )
    QUERY_PARAMETERS[REPORT] = frozenset()

    def error(view: View, status: int, message: str) -> Response:
        return view.json({"error": HTTPStatus(status).phrase, "message": message}, status=status)

    @app.page(OVERVIEW)
    class OverviewView(View):
        async def get(self, request: Request) -> Response:
            try:
                groups = groups_query(request)
            except BadRequest as bad:
                return error(self, 400, str(bad))
            # Workers ask each other for their partitions (scope=local); the incidents every
            # worker reads itself, so they are this worker's.
            local = views.partitions(request)
            if request.query.get("scope") == LOCAL:
                return self.json({"items": local})
            gathered = await views.gather(request, local)
            _, health = views.health()
            status, last = views.last_reconciliation()
            if status != 200:
                last = {"available": False, "message": last.get("message")}
            reports = worker.settings.reconcile_reports
            return self.json(
                overview(
                    list(worker.recent.newest_first()),
                    gathered["items"],
                    worker.clock(),
                    process=health["status"],
                    unavailable_workers=gathered["unavailable_workers"],
                    reconciliation=last,
                    report_url=report_url(reports, last.get("run")),
                    groups=groups,
                )
            )

    async def serve_report(request: web.Request) -> web.StreamResponse:
        found = report_path(worker.settings.reconcile_reports, request.match_info["run"])
        if found is None:
            return web.json_response(
                {"error": "Not Found", "message": f"no reconciliation report {request.path}"}, status=404
            )
        return web.FileResponse(found, headers={"Content-Type": "text/html; charset=utf-8"})

    app.web.web_app.router.add_get(REPORT, serve_report)

    async def report_policy(request: web.Request, response: web.StreamResponse) -> None:
        # After security_headers (added before this): the report's own inline CSS is allowed.
        if response.status == 200 and request.match_info.route.resource is not None:
            if request.match_info.route.resource.canonical == REPORT:
                response.headers["Content-Security-Policy"] = REPORT_POLICY

    app.web.web_app.on_response_prepare.append(report_policy)
