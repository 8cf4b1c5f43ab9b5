"""Authentication for a worker's web server (``KDIV_WEB_TOKEN``), and how workers sign the
requests they forward to each other and the answers they give (docs/web-views.md, "Peers").

The token check wraps every route of the server, Faust's own (``/router/``, ``/table/``, ...)
included, except the few that scrapers and orchestrators call without credentials.

Workers never send the token itself to each other: a request is signed with an HMAC keyed
by the token over its method, target URL, time, a random nonce and body, and the answer is
signed over the request's signature, its status and body. Anyone who joins the consumer
group can advertise a URL and be asked; it sees no token, cannot replay what it was sent to
another worker (the target is signed) or to the same one (the nonce is), and cannot forge an
answer the asking worker would take.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Mapping

from aiohttp import web
from yarl import URL

from kdiv.worker.web.guard import clipped
from kdiv.worker.web.nonces import MAX_SPENT_NONCES, SpentNonces

log = logging.getLogger(__name__)

# Liveness/readiness probes and Prometheus scrapes; neither reveals record contents.
# /health/ and /metrics/ only redirect; /ui/ is the dashboard page, which holds no data:
# its requests for the views carry the token its user types in.
OPEN_PATHS = frozenset({"/health", "/metrics", "/health/", "/metrics/", "/ui/"})

PEER_TIME = "X-Kdiv-Peer-Time"
PEER_NONCE = "X-Kdiv-Peer-Nonce"
PEER_SIGNATURE = "X-Kdiv-Peer-Signature"
# How far a peer's clock may be from this one's; a signed request is refused outside it.
PEER_WINDOW_MS = 30_000
# Set on a request a peer signed: the answer is signed over it.
PEER_REQUEST_KEY = "kdiv_peer_signature"

_NONCE_BYTES = 16
_SIGNATURE_HEX = 64  # SHA-256


def _mac(token: str, *parts: bytes) -> str:
    return hmac.new(token.encode(), b"\n".join(parts), hashlib.sha256).hexdigest()


def request_signature(token: str, method: str, target: str, at_ms: int, nonce: str, body: bytes) -> str:
    """The HMAC of a forwarded request: method, target (origin, raw path and query as sent),
    time, nonce and body hash, keyed by the token."""
    return _mac(
        token,
        b"kdiv-peer-request-v1",
        method.upper().encode(),
        target.encode("utf-8", "surrogateescape"),
        str(at_ms).encode(),
        nonce.encode(),
        hashlib.sha256(body).hexdigest().encode(),
    )


def response_signature(token: str, request_sig: str, status: int, body: bytes) -> str:
    """The HMAC of an answer to a signed request: bound to that request, its status and body."""
    return _mac(
        token, b"kdiv-peer-response-v1", request_sig.encode(), str(status).encode(), hashlib.sha256(body).digest()
    )


def peer_target(url: URL) -> str:
    """What a signature names as the target: scheme://host:port plus the raw path and query."""
    return f"{url.scheme}://{url.host}:{url.port}{url.raw_path_qs}"


def sign_request(token: str, method: str, url: URL, body: bytes = b"") -> tuple[dict[str, str], str]:
    """The headers that authenticate a forwarded request to `url`, and its signature (the
    answer's signature is checked against it)."""
    at_ms = int(time.time() * 1000)
    nonce = secrets.token_hex(_NONCE_BYTES)
    signature = request_signature(token, method, peer_target(url), at_ms, nonce, body)
    return {PEER_TIME: str(at_ms), PEER_NONCE: nonce, PEER_SIGNATURE: signature}, signature


def answer_is_signed(token: str, request_sig: str, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
    """True when the answer carries the signature only a holder of the token can make."""
    given = headers.get(PEER_SIGNATURE, "")
    expected = response_signature(token, request_sig, status, body)
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


class SignedRequests:
    """Checks peers' signed requests: the signature, the time window, and each nonce once."""

    def __init__(
        self,
        token: str,
        own_origin: URL,
        window_ms: int = PEER_WINDOW_MS,
        *,
        max_nonces: int = MAX_SPENT_NONCES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token
        self.own_origin = own_origin
        self.window_ms = window_ms
        self._clock = clock
        # Only valid signed requests take a nonce, so this holds a window's worth of them.
        self._spent = SpentNonces(max_nonces)
        self._full_logged_ms: int | None = None

    def check(self, method: str, raw_path_qs: str, headers: Mapping[str, str], body: bytes) -> str | None:
        """The request's signature when it is a valid, fresh, first-seen signed request;
        None otherwise (the caller answers 401 without saying which check failed)."""
        raw_time, nonce, given = (
            headers.get(PEER_TIME, ""),
            headers.get(PEER_NONCE, ""),
            headers.get(PEER_SIGNATURE, ""),
        )
        if not (raw_time.isascii() and raw_time.isdigit() and len(raw_time) <= 16):
            return None
        if len(nonce) != 2 * _NONCE_BYTES or not _is_hex(nonce) or len(given) != _SIGNATURE_HEX:
            return None
        at_ms = int(raw_time)
        # The target is this worker's own advertised origin: a request signed for another
        # worker (a rogue member replaying what it was sent) does not verify here.
        target = f"{self.own_origin.scheme}://{self.own_origin.host}:{self.own_origin.port}{raw_path_qs}"
        expected = request_signature(self.token, method, target, at_ms, nonce, body)
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode()):
            return None
        now_ms = int(self._clock() * 1000)
        if abs(now_ms - at_ms) > self.window_ms:
            return None
        if not self._spent.take(nonce, at_ms + self.window_ms, now_ms):
            self._log_if_full(now_ms)
            return None
        return expected

    def _log_if_full(self, now_ms: int) -> None:
        # Once a window at most: peers asking this fast would otherwise log as fast.
        if not self._spent.full(now_ms):
            return
        if self._full_logged_ms is None or now_ms - self._full_logged_ms > self.window_ms:
            self._full_logged_ms = now_ms
            log.warning(
                "the nonces of %d signed peer requests of the last %d s are kept, the most kept: "
                "more signed requests are refused (401) until theirs expire",
                self._spent.capacity,
                2 * self.window_ms // 1000,
            )


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _bearer_token(header: str) -> bytes | None:
    """The credentials of ``Authorization: Bearer <token>``, the scheme in any case (RFC 7235)."""
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip(" ").encode("utf-8", "surrogateescape")


def authentication_middleware(
    token: str, signed: SignedRequests | None = None, open_paths: frozenset[str] = OPEN_PATHS
):
    """An aiohttp middleware answering 401 (JSON) unless the request carries
    ``Authorization: Bearer <token>`` or is a peer's signed request (`signed`)."""
    if not token:
        raise ValueError("an empty token would let everyone in")
    expected = token.encode()

    @web.middleware
    async def require_token(request: web.Request, handler):
        if request.path in open_paths:
            return await handler(request)
        given = _bearer_token(request.headers.get("Authorization", ""))
        # Constant time: the comparison must not tell how much of a guess was right.
        if given is not None and hmac.compare_digest(given, expected):
            return await handler(request)
        if signed is not None and PEER_SIGNATURE in request.headers:
            request_sig = signed.check(request.method, request.raw_path, request.headers, await request.read())
            if request_sig is not None:
                request[PEER_REQUEST_KEY] = request_sig
                return await handler(request)
        return web.json_response(
            {
                "error": "Unauthorized",
                "message": f"{clipped(request.method)} {clipped(request.path)}: send the worker's token as 'Authorization: Bearer <token>'",
            },
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="kdiv"'},
        )

    return require_token


def sign_answer(token: str, request: web.Request, response: web.StreamResponse) -> None:
    """Sign the answer to a peer's signed request (from aiohttp's on_response_prepare): an
    answer without a whole body (a stream) stays unsigned, and the asking worker refuses it."""
    request_sig = request.get(PEER_REQUEST_KEY)
    if request_sig is None or not isinstance(response, web.Response):
        return
    body = response.body
    if isinstance(body, bytes | bytearray):
        response.headers[PEER_SIGNATURE] = response_signature(token, request_sig, response.status, bytes(body))
