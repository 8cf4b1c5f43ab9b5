"""The views' query and path parameters: parsed strictly, anything else a clear 400.

Every route names the query parameters it takes (`kdiv.worker.web.server.ROUTES`); the
`strict_parameters` middleware refuses any other, a repeated one and a bad scope before a
handler runs, and handlers read the values through the parsers here, which raise
`BadRequest` for what they cannot take.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from aiohttp import web
from faust.web import Request

from kdiv.worker.web.guard import clipped, echoed

LOCAL = "local"
SCOPES = (LOCAL,)
# The most items a page of a list view holds.
MAX_PAGE = 1000
# The longest integer a query parameter or path takes (int64), and time given as ISO 8601.
MAX_DIGITS = 19
MAX_TIME_TEXT = 40


class BadRequest(Exception):
    """A parameter the view cannot take; answered 400."""


def shown(raw: str) -> str:
    """A value from the request, quoted and cut short, for an error message."""
    return echoed(raw)


def parse_count(raw: str, what: str) -> int:
    """A non-negative integer of ASCII digits (not "²", "٣", " 5", "1_0" or "+1", which int()
    takes or trips on), at most MAX_DIGITS long."""
    if not (raw.isascii() and raw.isdigit()):
        raise BadRequest(f"{what}={shown(raw)} is not a non-negative integer (ASCII digits)")
    if len(raw) > MAX_DIGITS:
        raise BadRequest(f"{what}={shown(raw)} has more than {MAX_DIGITS} digits")
    return int(raw)


def int_param(request: Request, name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None):
    """An integer query parameter within minimum..maximum; `default` when absent or empty."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    value = parse_count(raw, f"query parameter {name}")
    if value < minimum or (maximum is not None and value > maximum):
        raise BadRequest(f"query parameter {name}={value} is outside {minimum}..{maximum if maximum else ''}")
    return value


def choice_param(request: Request, name: str, choices: tuple[str, ...]) -> str | None:
    """A query parameter that is one of `choices`; None when absent or empty."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise BadRequest(f"query parameter {name}={shown(raw)} is not one of {', '.join(choices)}")
    return raw


def scope(request: Request) -> str | None:
    """The request's scope: LOCAL, or None for the whole group; anything else is a 400."""
    return choice_param(request, "scope", SCOPES)


def time_param(request: Request, name: str) -> int | None:
    """A time as ms since the epoch, given as such or as ISO 8601 (UTC unless it says)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw.isascii() and raw.isdigit():  # not "²", which isdigit() takes and int() refuses
        return parse_count(raw, f"query parameter {name} (ms since the epoch)")
    if not raw.isascii() or len(raw) > MAX_TIME_TEXT:
        raise BadRequest(f"query parameter {name}={shown(raw)} is neither ms since the epoch nor an ISO 8601 time")
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(
            f"query parameter {name}={shown(raw)} is neither ms since the epoch nor an ISO 8601 time"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def is_hex_guid(raw: str) -> bool:
    """A producer GUID as the views take it: 32 hex digits."""
    return len(raw) == 32 and all(c in "0123456789abcdefABCDEF" for c in raw)


def producers_cursor(request: Request) -> tuple[str, int, bytes] | None:
    """The `cursor` parameter of /producers/: "topic/partition/GUID", the last item of the
    previous page (its `next_cursor`); the page holds the producers after it."""
    raw = request.query.get("cursor")
    if raw is None or raw == "":
        return None
    parts = raw.rsplit("/", 2)
    if len(parts) != 3 or not parts[0] or not (parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= 10):
        raise BadRequest(f"query parameter cursor={shown(raw)} is not topic/partition/GUID (a page's next_cursor)")
    if not is_hex_guid(parts[2]):
        raise BadRequest(f"query parameter cursor={shown(raw)} does not end in a producer GUID (32 hex digits)")
    return parts[0], int(parts[1]), bytes.fromhex(parts[2])


def query_problem(request: web.Request, taken: frozenset[str]) -> str | None:
    """What is wrong with the request's query for a view taking `taken`: an unknown or repeated
    parameter, or a bad scope; None when nothing is."""
    names = [name for name, _ in request.query.items()]  # keys() gives a repeated name once
    for name in dict.fromkeys(names):
        if name not in taken:
            known = ", ".join(sorted(taken)) or "none"
            return f"unknown query parameter {shown(name)} (this view takes: {known})"
        if names.count(name) > 1:
            return f"query parameter {shown(name)} is given {names.count(name)} times"
    # The same check of scope on every view that takes it, whichever way the view reads it.
    given_scope = request.query.get("scope", "")
    if given_scope not in ("", *SCOPES):
        return f"query parameter scope={shown(given_scope)} is not one of {', '.join(SCOPES)}"
    return None


def strict_parameters(taken_by_route: Mapping[str, frozenset[str]]):
    """Middleware: a request to a route of `taken_by_route` (by its path pattern) with a query
    parameter that route does not take, a repeated one or a bad scope is a 400 naming it;
    so a misspelt filter is not taken for one that matched everything."""

    @web.middleware
    async def known_parameters(request, handler):
        route = request.match_info.route.resource
        taken = taken_by_route.get(route.canonical) if route is not None else None
        problem = query_problem(request, taken) if taken is not None else None
        if problem is not None:
            return web.json_response(
                {"error": "Bad Request", "message": f"{clipped(request.path)}: {problem}"}, status=400
            )
        return await handler(request)

    return known_parameters
