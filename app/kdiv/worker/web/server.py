"""The views on a worker's web server: its routes, each with the handler that answers it and
the query parameters it takes, and the middlewares every request passes first (Host check,
errors as JSON, the token, strict parameters, the trailing slash).
"""

from __future__ import annotations

from typing import NamedTuple

from aiohttp import web
from yarl import URL

from kdiv.config.settings import Settings
from kdiv.worker.faustcompat.webserver import bound_web_server
from kdiv.worker.readmodel import WorkerReadModel
from kdiv.worker.web.audit import routes_view
from kdiv.worker.web.auth import SignedRequests, authentication_middleware, sign_answer
from kdiv.worker.web.bounds import WebBounds
from kdiv.worker.web.guard import allowed_host_names, clipped, host_check_middleware, security_headers
from kdiv.worker.web.handlers import Handler, Site, view_class
from kdiv.worker.web.incidents import incidents_view
from kdiv.worker.web.overview import OVERVIEW_PARAMETERS, overview_view
from kdiv.worker.web.pages import DASHBOARD_PATH, dashboard_view, page_policies
from kdiv.worker.web.params import strict_parameters
from kdiv.worker.web.partitions import changefeeds_view, partition_view, partitions_view
from kdiv.worker.web.peers import Peers
from kdiv.worker.web.producers import producer_view, producers_view
from kdiv.worker.web.reports import REPORT, report_policy, report_view
from kdiv.worker.web.status import health_view, metrics_view, reconcile_view


class Route(NamedTuple):
    """A view: its path (aiohttp's pattern), Faust's name for it, its handler and the query
    parameters it takes (any other is a 400)."""

    path: str
    name: str
    handler: Handler
    parameters: frozenset[str]


_FILTERS = frozenset({"topic", "partition", "status", "scope"})
_INCIDENT_FILTERS = frozenset(
    {"limit", "offset", "topic", "partition", "class", "severity", "producer", "since", "until", "scope"}
)

ROUTES = (
    Route("/producers/", "ProducersView", producers_view, _FILTERS | {"limit", "cursor"}),
    Route("/producers/{guid}/", "ProducerView", producer_view, _FILTERS),
    Route("/partitions/", "PartitionsView", partitions_view, frozenset({"topic", "scope"})),
    Route("/partitions/{topic}/{partition}/", "PartitionView", partition_view, frozenset({"scope"})),
    Route("/routes/", "RoutesView", routes_view, frozenset({"scope"})),
    Route("/changefeeds/", "ChangefeedsView", changefeeds_view, frozenset({"topic", "table", "scope"})),
    Route("/incidents/", "IncidentsView", incidents_view, _INCIDENT_FILTERS),
    Route("/overview/", "OverviewView", overview_view, OVERVIEW_PARAMETERS),
    Route(DASHBOARD_PATH, "DashboardView", dashboard_view, frozenset()),
    Route("/reconcile/", "ReconcileView", reconcile_view, frozenset()),
    Route(REPORT, "ReportView", report_view, frozenset()),
    Route("/health", "HealthView", health_view, frozenset()),
    Route("/metrics", "MetricsView", metrics_view, frozenset()),
)
# The query parameters each view takes, by its route.
QUERY_PARAMETERS: dict[str, frozenset[str]] = {route.path: route.parameters for route in ROUTES}
# The views without a slash, asked for with one: redirected.
_WITHOUT_SLASH = ("/metrics", "/health")


@web.middleware
async def json_errors(request, handler):
    """aiohttp answers unknown paths and methods with HTML; every error here is JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response(
            {"error": exc.reason, "message": f"{clipped(request.method)} {clipped(request.path)}: {exc.reason}"},
            status=exc.status,
        )


def register_views(app, settings: Settings, worker: WorkerReadModel) -> Site:
    """Serve the views of `worker` on the app's web server."""
    site = Site(app, worker, Peers(app, settings.web_token, settings.web_peers))
    advertised = URL(str(app.conf.canonical_url))
    web_app = app.web.web_app
    # Header and idle timeouts, a cap on connections, client faults counted (docs/web-views.md#connections).
    bound_web_server(app, WebBounds.from_settings(settings))
    # First: a page of a name that is not this worker's (DNS rebinding) gets nothing.
    web_app.middlewares.append(
        host_check_middleware(allowed_host_names(settings.web_host, advertised.host, settings.web_allowed_hosts))
    )
    web_app.middlewares.append(json_errors)
    if settings.web_token:
        # Inside json_errors: an unknown path or method is not revealed without the token.
        web_app.middlewares.append(
            authentication_middleware(settings.web_token, SignedRequests(settings.web_token, advertised))
        )

        async def sign_peer_answers(request, response) -> None:
            sign_answer(settings.web_token, request, response)

        web_app.on_response_prepare.append(sign_peer_answers)
    web_app.middlewares.append(strict_parameters(QUERY_PARAMETERS))
    # /incidents -> /incidents/ (and the other list views): aiohttp redirects when only the
    # path with the slash exists. Inside the token check, like every other path.
    web_app.middlewares.append(web.normalize_path_middleware(append_slash=True, merge_slashes=True))
    web_app.on_response_prepare.append(security_headers(page_policies()))
    web_app.on_response_prepare.append(report_policy)

    for route in ROUTES:
        app.page(route.path)(view_class(route.name, site, route.handler))

    for path in _WITHOUT_SLASH:

        async def without_slash(request, path=path):
            raise web.HTTPPermanentRedirect(path + (f"?{request.query_string}" if request.query_string else ""))

        web_app.router.add_get(path + "/", without_slash)

    return site
