"""Bearer-token authentication for a worker's web server (``KDIV_WEB_TOKEN``).

It wraps every route of the server, Faust's own (``/router/``, ``/table/``, ...) included,
except the two that scrapers and orchestrators call without credentials. Workers send
the token on their requests to each other (`kdiv.worker.views`), so nothing else needs to be open.
"""

from __future__ import annotations

import hmac

from aiohttp import web

# Liveness/readiness probes and Prometheus scrapes; neither reveals record contents.
# /health/ and /metrics/ only redirect; /ui/ is the dashboard page, which holds no data:
# its requests for the views carry the token its user types in.
OPEN_PATHS = frozenset({"/health", "/metrics", "/health/", "/metrics/", "/ui/"})


def authorization_header(token: str) -> dict[str, str]:
    """The Authorization header a worker sends to another worker's views."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def bearer_token_middleware(token: str, open_paths: frozenset[str] = OPEN_PATHS):
    """An aiohttp middleware answering 401 (JSON) unless ``Authorization: Bearer <token>``."""
    if not token:
        raise ValueError("an empty token would let everyone in")
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def require_bearer_token(request: web.Request, handler):
        if request.path in open_paths:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        # Constant time: the comparison must not tell how much of a guess was right.
        if hmac.compare_digest(given, expected):
            return await handler(request)
        return web.json_response(
            {
                "error": "Unauthorized",
                "message": f"{request.method} {request.path}: send the worker's token as 'Authorization: Bearer <token>'",
            },
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="kdiv"'},
        )

    return require_bearer_token
