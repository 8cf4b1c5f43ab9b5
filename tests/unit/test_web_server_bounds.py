"""The bounded web server (kdiv.worker.faustcompat.webserver) on loopback, over a plain aiohttp
app: keep-alive and pipelined requests are served whole, a head sent too slowly gets a 408, a
malformed request a JSON 400 and one WARNING line, and the cap closes the oldest connection
without a request, never one being answered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from kdiv.worker.faustcompat.webserver import BoundedRunner, ClientGuard
from kdiv.worker.web.bounds import WebBounds

HEADER_TIMEOUT = 0.5


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, ClientGuard, asyncio.Event]]:
    release = asyncio.Event()
    app = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"slow": True})

    app.router.add_get("/health", health)
    app.router.add_get("/slow", slow)
    guard = ClientGuard(WebBounds(HEADER_TIMEOUT, 5.0, 4, 60.0))
    runner = BoundedRunner(app, guard)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, guard, release
    finally:
        release.set()
        await runner.cleanup()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """One whole answer (head and a Content-Length body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), 5)


GET = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def test_keep_alive_and_pipelined_requests_are_served_on_one_connection(server):
    port, guard, _ = server
    reader, writer = await _connect(port)
    for _ in range(3):
        writer.write(GET)
        assert b'{"ok": true}' in await _answer(reader)
        await asyncio.sleep(HEADER_TIMEOUT)  # idle between requests is not a slow head
    writer.write(GET * 3)
    statuses = [(await _answer(reader)).split(b"\r\n")[0] for _ in range(3)]
    assert statuses == [b"HTTP/1.1 200 OK"] * 3, statuses
    writer.close()
    assert guard.tally.interval_ends is None  # no fault counted


async def test_a_head_not_sent_whole_in_time_gets_a_408_and_is_closed(server):
    port, guard, _ = server
    reader, writer = await _connect(port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    writer.write(b"GET /health HTTP/1.1\r\n")
    answer = b""
    while not answer:
        writer.write(b"X-Slow: 1\r\n")
        try:
            answer = await asyncio.wait_for(reader.read(100), 0.1)
        except TimeoutError:
            continue
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout")
    assert HEADER_TIMEOUT <= loop.time() - started < HEADER_TIMEOUT + 0.5
    assert await asyncio.wait_for(reader.read(), 2) == b""  # closed
    writer.close()


async def test_a_malformed_request_is_a_json_400_and_one_warning_line(server, caplog):
    port, guard, _ = server
    caplog.set_level(logging.INFO)
    for _ in range(5):
        reader, writer = await _connect(port)
        writer.write(b"GET /x HTTP/1.1\r\nBad Header\x01: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert b" 400 " in answer.split(b"\r\n")[0] and b'"error": "Bad Request"' in answer, answer
        assert b'"message": "malformed HTTP request: ' in answer
    lines = [r for r in caplog.records if r.name.startswith(("kdiv", "aiohttp"))]
    assert [r.levelno for r in lines] == [logging.WARNING], [r.getMessage() for r in lines]
    assert "malformed request" in lines[0].getMessage() and not lines[0].exc_info
    assert "\n" not in lines[0].getMessage()


async def test_the_cap_closes_the_oldest_waiting_connection_never_one_being_answered(server):
    port, guard, release = server
    # Two connections answering a request that waits; two idle ones, the first the oldest.
    answering = [await _connect(port) for _ in range(2)]
    for _, writer in answering:
        writer.write(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await asyncio.sleep(0.1)
    idle = [await _connect(port) for _ in range(2)]
    await asyncio.sleep(0.1)
    assert len(guard.table) == 4
    # A fifth: the oldest idle one is closed for it, and the newcomer is answered.
    reader, writer = await _connect(port)
    writer.write(GET)
    assert b" 200 " in (await _answer(reader)).split(b"\r\n")[0]
    assert await asyncio.wait_for(idle[0][0].read(), 2) == b""
    # Now: 2 answering, idle[1] and the newcomer waiting. Two more take their places.
    more = [await _connect(port) for _ in range(2)]
    assert await asyncio.wait_for(idle[1][0].read(), 2) == b""
    assert await asyncio.wait_for(reader.read(), 2) == b""
    # Both in `more` now wait, but ask something that waits too: every connection answers.
    for _, w in more:
        w.write(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await asyncio.sleep(0.1)
    refused_reader, refused_writer = await _connect(port)
    refused = await asyncio.wait_for(refused_reader.read(), 2)
    assert refused.startswith(b"HTTP/1.1 503 Service Unavailable") and b"Retry-After: 1" in refused
    release.set()
    for r, _ in answering + more:
        assert b'{"slow": true}' in await _answer(r)
    for _, w in [*answering, *idle, *more, (reader, writer), (refused_reader, refused_writer)]:
        w.close()
