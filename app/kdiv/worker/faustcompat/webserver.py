"""The worker's web server with bounds on what a client may hold (`kdiv.worker.web.bounds`):
Faust's aiohttp runner replaced by one whose connections are `BoundedRequestHandler`s.

aiohttp has an idle timeout (its keep-alive timeout, which also runs from a connection's
start) but no bound on the time a request head may take once it started, no cap on
connections, and it logs every malformed request with a traceback at ERROR. Here:

- a request head must be whole within the header timeout of its first byte, else the
  client gets a 408 and the connection is closed;
- at the cap a new connection takes the place of the oldest one without a request under
  way, or gets a 503 and is closed when all are answering (`bounds.ConnectionTable`);
- malformed requests, header timeouts and connections closed at the cap are logged one
  short WARNING line for the first of each kind, then as counts (`bounds.FaultTally`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from kdiv.worker.web.bounds import (
    EVICTED,
    HEADER_TIMEOUT,
    MALFORMED,
    ONE_FAULT,
    REFUSED,
    ConnectionTable,
    FaultTally,
    WebBounds,
    descriptor_shortage,
)
from kdiv.worker.web.guard import clipped

log = logging.getLogger(__name__)


def _raw_answer(status: HTTPStatus, extra: str = "") -> bytes:
    """A whole HTTP/1.1 answer with no body, written straight to a connection that is closed
    after it (no request object exists for it)."""
    return (f"HTTP/1.1 {status.value} {status.phrase}\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n").encode(
        "ascii"
    )


_TIMED_OUT = _raw_answer(HTTPStatus.REQUEST_TIMEOUT)
_AT_CAP = _raw_answer(HTTPStatus.SERVICE_UNAVAILABLE, "Retry-After: 1\r\n")


class ClientGuard:
    """The state shared by a web server's connections: the table of them, the fault tally,
    and the timer that logs the tally's counts."""

    def __init__(self, bounds: WebBounds, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.bounds = bounds
        self.table: ConnectionTable[BoundedRequestHandler] = ConnectionTable(bounds.max_connections)
        self.tally = FaultTally(bounds.fault_log_interval_s)
        self._loop = loop
        self._summary: asyncio.TimerHandle | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop or asyncio.get_running_loop()

    def fault(self, kind: str, peer: object, detail: str) -> None:
        """Count a client fault; the first of its kind in an interval is logged at once."""
        now = self.loop.time()
        if self.tally.record(kind, now):
            log.warning(
                "web client %s: %s (%s); more in the next %g s are counted, not logged one by one",
                _peer_name(peer),
                ONE_FAULT[kind],
                clipped(detail, 120),
                self.tally.interval_s,
            )
        ends = self.tally.interval_ends
        if self._summary is None and ends is not None:
            self._summary = self.loop.call_at(ends, self._log_summary)

    def _log_summary(self) -> None:
        self._summary = None
        line = self.tally.summary(self.loop.time())
        if line is not None:
            log.warning(line)


def _peer_name(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "?"


class BoundedRequestHandler(RequestHandler):
    """aiohttp's connection, with a header timeout, a place in the guard's table, and client
    faults counted instead of logged with a traceback each."""

    def __init__(self, manager: Server, *, guard: ClientGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._heads_seen = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        admission = guard.table.open(self)
        peer = transport.get_extra_info("peername")
        if not admission.admitted:
            guard.fault(REFUSED, peer, f"{guard.table.cap} connections are all answering a request")
            # Not handed to aiohttp at all: no task, no parser; answered and closed.
            cast(asyncio.Transport, transport).write(_AT_CAP)
            transport.close()
            return
        self._admitted = True
        if admission.evicted is not None:
            evicted = admission.evicted
            guard.fault(EVICTED, evicted.peername, f"the oldest of {guard.table.cap} connections without a request")
            evicted.force_close()
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._guard.table.close(self)
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        waiting = self._guard.table.is_waiting(self)
        if waiting and self._head_timer is None and data:
            # The first byte of a request head: the whole head is due within the timeout.
            self._head_timer = self._guard.loop.call_later(self._guard.bounds.header_timeout_s, self._head_timed_out)
        super().data_received(data)
        # aiohttp counts each request (or malformed one) whose head it parsed.
        if self._request_count != self._heads_seen:
            self._heads_seen = self._request_count
            self._stop_head_timer()
            self._guard.table.busy(self)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or not self._guard.table.is_waiting(self):
            return
        self._guard.fault(
            HEADER_TIMEOUT, self.peername, f"no whole request head within {self._guard.bounds.header_timeout_s:g} s"
        )
        transport.write(_TIMED_OUT)
        self.force_close()

    def answering(self) -> None:
        """A request of this connection is being answered: it is not closed for another."""
        self._stop_head_timer()
        self._guard.table.busy(self)

    def answered(self) -> None:
        """The request's answer is sent: the connection waits for the next one (or is closed
        by aiohttp's idle timeout)."""
        self._guard.table.waiting(self)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A malformed request (a 4xx from the parser) is a client's fault: counted, one short
        WARNING line, a JSON answer; a 500 is the worker's and keeps aiohttp's traceback."""
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        # aiohttp's parser errors span lines (the request line, a caret under the fault): one here.
        reason = " ".join((message or (str(exc) if exc is not None else "") or HTTPStatus(status).phrase).split())
        self._guard.fault(MALFORMED, self.peername, reason)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was sent already, the error cannot be")
        answer = web.json_response(
            {"error": HTTPStatus(status).phrase, "message": f"malformed HTTP request: {clipped(reason, 120)}"},
            status=status,
        )
        answer.force_close()
        return answer


class BoundedServer(Server):
    """aiohttp's low-level server, making `BoundedRequestHandler` connections and telling
    each when its request is answered."""

    def __init__(self, made: Server, guard: ClientGuard, handler_kwargs: dict[str, Any]) -> None:
        inner = made.request_handler

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            protocol = request.protocol
            if not isinstance(protocol, BoundedRequestHandler):
                return await inner(request)
            protocol.answering()  # also a pipelined request, parsed with the one before
            try:
                return await inner(request)
            finally:
                protocol.answered()

        super().__init__(
            handle,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **handler_kwargs,
        )
        self._guard = guard
        self._handler_kwargs = handler_kwargs

    def __call__(self) -> RequestHandler:
        return BoundedRequestHandler(self, loop=asyncio.get_running_loop(), guard=self._guard, **self._handler_kwargs)


class BoundedRunner(web.AppRunner):
    """Faust's AppRunner (access log off), whose server is a `BoundedServer`."""

    def __init__(self, app: web.Application, guard: ClientGuard) -> None:
        # The idle timeout is aiohttp's keep-alive timeout: from a connection's start, and
        # from each answer, to the next whole request head.
        self._handler_kwargs: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": guard.bounds.idle_timeout_s,
        }
        super().__init__(app, **self._handler_kwargs)
        self._guard = guard

    async def _make_server(self) -> Server:
        made = await super()._make_server()
        return BoundedServer(made, self._guard, self._handler_kwargs)


def bound_web_server(app: Any, bounds: WebBounds) -> ClientGuard:
    """Serve the Faust app's web views through a `BoundedRunner` (before the server starts)."""
    shortage = descriptor_shortage(bounds.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if shortage is not None:
        log.warning(shortage)
    web_driver = app.web
    guard = ClientGuard(bounds)
    web_driver._runner = BoundedRunner(web_driver.web_app, guard)
    return guard
