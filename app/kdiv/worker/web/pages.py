"""The dashboard: `GET /ui/`, one HTML page over the JSON views, and the Content-Security-Policy
that lets exactly its inline script and style run."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from faust.web import Request

from kdiv.worker.web.guard import page_policy
from kdiv.worker.web.handlers import Answer, Site
from kdiv.worker.web.incidents import INCIDENT_CLASSES

DASHBOARD_PATH = "/ui/"


@cache
def dashboard_page() -> str:
    """The dashboard's HTML, with the incident classes its filter offers."""
    return (
        resources.files("kdiv.worker")
        .joinpath("dashboard.html")
        .read_text(encoding="utf-8")
        .replace("__INCIDENT_CLASSES__", json.dumps(list(INCIDENT_CLASSES)))
    )


def page_policies() -> dict[str, str]:
    """The Content-Security-Policy of each HTML page, by path (`guard.security_headers`)."""
    return {DASHBOARD_PATH: page_policy(dashboard_page())}


async def dashboard_view(site: Site, request: Request) -> Answer:
    """The dashboard page."""
    return Answer(dashboard_page(), html=True)
