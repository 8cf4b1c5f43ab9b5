"""HTTP hygiene of a worker's web server: which Host names it answers, the security headers
of every answer, and host patterns (``KDIV_WEB_ALLOWED_HOSTS``, ``KDIV_WEB_PEERS``).

The Host check is against DNS rebinding: a page of the attacker's name that resolves to the
worker's address reaches a worker bound to loopback from the user's browser, with the
attacker's name as its Host. An IP literal cannot be rebound (a page of that address is the
worker's own origin), so any is answered; names must be the worker's own.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import ipaddress
import re
from collections.abc import Iterable

from aiohttp import web

LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
# The most characters of a request's own text (a path, a parameter, a header) an error echoes:
# an answer or a log line is not a mirror of what a client sent.
ECHO_LIMIT = 64

# JSON and metrics: nothing to run, embed or frame.
API_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

_COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Answers hold live state (and, with a token, data behind it): no cache keeps them.
    "Cache-Control": "no-store",
}


def clipped(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` as an error echoes it: at most `limit` characters, then how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def echoed(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` quoted (repr: control characters escaped) and clipped, for an error message."""
    return repr(text[:limit]) + ("" if len(text) <= limit else f"…({len(text)} chars)")


def split_host(header: str) -> tuple[str, int | None] | None:
    """(host lower-cased without a trailing dot, port or None) of a Host header; None when
    it is not one ("[::1]:80", "name:80" and "name" are; a port is ASCII digits within 1..65535)."""
    header = header.strip().lower()
    if header.startswith("["):
        host, sep, rest = header[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = header.partition(":")
        if ":" in port_text:
            return None
    if port_text and not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        return None
    if port_text and not 1 <= int(port_text) <= 65535:
        return None
    host = host.rstrip(".")
    if not host or not host.isascii():
        return None
    return host, int(port_text) if port_text else None


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def matches(patterns: Iterable[str], host: str, port: int | None) -> bool:
    """True when a pattern (fnmatch, lower case) matches the host or "host:port" (an IPv6
    address in brackets, as in a URL)."""
    named = f"[{host}]" if ":" in host else host
    candidates = {host, named} | ({f"{named}:{port}"} if port is not None else set())
    return any(fnmatch.fnmatchcase(candidate, pattern) for pattern in patterns for candidate in candidates)


def allowed_host_names(bound: str, advertised: str | None, configured: Iterable[str]) -> tuple[str, ...]:
    """The names the Host check lets through: the configured ones, the bound and advertised
    host, and the localhost names."""
    names = [*configured, *LOCAL_NAMES, bound.lower().rstrip(".")]
    if advertised:
        names.append(advertised.lower().rstrip("."))
    return tuple(dict.fromkeys(names))


def host_check_middleware(allowed: tuple[str, ...]):
    """Answer 421 (JSON) to a request whose Host is not one of `allowed` or an IP literal.
    No Host header at all (HTTP/1.0) is answered: every browser sends one."""
    any_host = "*" in allowed

    @web.middleware
    async def check_host(request: web.Request, handler):
        header = request.headers.get("Host")
        if any_host or header is None:
            return await handler(request)
        parsed = split_host(header)
        if parsed is not None and (is_ip_literal(parsed[0]) or matches(allowed, *parsed)):
            return await handler(request)
        return web.json_response(
            {
                "error": "Misdirected Request",
                "message": f"Host {echoed(header)} is not a name of this worker: add it to KDIV_WEB_ALLOWED_HOSTS "
                "if it is one",
            },
            status=421,
        )

    return check_host


def inline_hashes(page: str, tag: str) -> list[str]:
    """CSP sources ('sha256-...') for each inline <tag> block of the page, as the browser hashes it."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
    return [f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks]


def page_policy(page: str) -> str:
    """The dashboard's CSP: its own inline script and style (by hash), requests to this
    worker only, no frames, forms, plugins or other origins."""
    return (
        "default-src 'none'; "
        f"script-src {' '.join(inline_hashes(page, 'script'))}; "
        f"style-src {' '.join(inline_hashes(page, 'style'))}; "
        "connect-src 'self'; img-src data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )


def security_headers(page_paths: dict[str, str]):
    """An on_response_prepare handler adding the security headers to every answer; the
    paths in `page_paths` get the CSP given there, every other the API's."""

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        for name, value in _COMMON_HEADERS.items():
            response.headers.setdefault(name, value)
        response.headers["Content-Security-Policy"] = page_paths.get(request.path, API_POLICY)

    return add_headers
