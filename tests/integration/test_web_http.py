"""The HTTP of a real worker's views: what it parses, which Host names it answers, and the
security headers of every answer."""

from __future__ import annotations

import asyncio
import os
import uuid

import aiohttp
import pytest

from kdiv.config.settings import Settings, SettingsError
from tests.harness.http import http_json
from tests.harness.processes import WorkerProcess, free_port

TOKEN = "kdiv-http-token-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GUID = "0" * 32


@pytest.fixture
async def worker(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2)
    w = WorkerProcess(
        "http",
        bootstrap=bootstrap,
        topics=[topic],
        app_id=f"http-{uuid.uuid4().hex[:8]}",
        workdir=tmp_path,
        web_port=free_port(),
        env={"KDIV_WEB_TOKEN": TOKEN, "KDIV_WEB_ALLOWED_HOSTS": "kdiv.internal, *.kdiv.example"},
    )
    try:
        w.start()
        await w.wait_ready()
        yield topic, w
    finally:
        w.terminate()


async def test_the_authorization_scheme_is_case_insensitive(worker):
    _topic, w = worker
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"):
            status, body = await http_json(
                session, "GET", f"{w.url}/partitions/", {"Authorization": f"{scheme} {TOKEN}"}
            )
            assert status == 200, (scheme, body)
        for wrong in (f"bearer {TOKEN}x", f"bearer{TOKEN}", f"bearerx {TOKEN}", TOKEN):
            status, body = await http_json(session, "GET", f"{w.url}/partitions/", {"Authorization": wrong})
            assert status == 401, (wrong, body)


async def test_parameters_are_parsed_strictly_and_unknown_ones_refused(worker):
    topic, w = worker
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        long_digits = "9" * 4300
        for path, named in (
            # Digits int() takes or trips on that are no ASCII integer: superscript, Arabic-Indic,
            # full-width, underscores, signs, spaces, thousands of digits.
            ("/incidents/?partition=%C2%B2", "partition"),
            ("/incidents/?partition=%D9%A3", "partition"),
            ("/incidents/?limit=%EF%BC%95", "limit"),
            ("/incidents/?limit=1_0", "limit"),
            ("/incidents/?offset=+1", "offset"),
            ("/incidents/?offset=%201", "offset"),
            (f"/incidents/?offset={long_digits}", "offset"),
            (f"/incidents/?limit={long_digits}", "limit"),
            ("/incidents/?since=%C2%B2", "since"),
            (f"/incidents/?until={long_digits}", "until"),
            ("/incidents/?since=%D9%A3%D9%A3%D9%A3%D9%A3-01-01", "since"),
            (f"/incidents/?since=2026-01-01T00:00:00{'0' * 300}", "since"),
            ("/producers/?partition=%D9%A3", "partition"),
            (f"/producers/?partition={long_digits}", "partition"),
            (f"/partitions/{topic}/%D9%A3/", "partition"),
            (f"/partitions/{topic}/1_0/", "partition"),
            (f"/partitions/{topic}/+1/", "partition"),
            (f"/partitions/{topic}/{long_digits}/", "partition"),
            # Unknown, misspelt and repeated parameters: not a filter that matched everything.
            ("/incidents/?clas=MISSING", "clas"),
            ("/partitions/?topik=x", "topik"),
            ("/producers/?statuss=IN_PROGRESS", "statuss"),
            (f"/producers/{GUID}/?limit=5", "limit"),
            (f"/partitions/{topic}/0/?topic=x", "topic"),
            ("/routes/?route=x", "route"),
            ("/changefeeds/?tabel=x", "tabel"),
            ("/reconcile/?run=x", "run"),
            ("/health?verbose=1", "verbose"),
            ("/metrics?name=x", "name"),
            ("/incidents/?topic=a&topic=b", "topic"),
            # scope: the same check on every view that takes it.
            ("/partitions/?scope=bogus", "scope"),
            (f"/partitions/{topic}/0/?scope=bogus", "scope"),
            (f"/partitions/{topic}/0/?scope=LOCAL", "scope"),
            ("/producers/?scope=bogus", "scope"),
            (f"/producers/{GUID}/?scope=bogus", "scope"),
            ("/routes/?scope=bogus", "scope"),
            ("/changefeeds/?scope=bogus", "scope"),
            ("/incidents/?scope=bogus", "scope"),
        ):
            status, body = await http_json(session, "GET", w.url + path, AUTH)
            assert status == 400, (path, body)
            assert isinstance(body, dict) and body["error"] == "Bad Request", (path, body)
            assert named in body["message"] and len(body["message"]) < 300, (path, body["message"][:400])

        # What is well formed still answers.
        for path in (
            "/incidents/?partition=1&limit=10&offset=0&since=0&until=2026-01-01T00:00:00Z&scope=local",
            f"/partitions/{topic}/0/?scope=local",
            "/partitions/?topic=x&scope=local",
            "/producers/?partition=0&status=IN_PROGRESS",
            "/routes/?scope=local",
            "/changefeeds/?topic=x&table=y",
            "/health",
        ):
            status, body = await http_json(session, "GET", w.url + path, AUTH)
            assert status in (200, 503) if path == "/health" else status == 200, (path, body)


async def test_only_the_workers_own_host_names_are_answered(worker):
    _topic, w = worker
    port = w.web_port
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "LOCALHOST.",
            f"[::1]:{port}",
            f"10.9.8.7:{port}",
            "kdiv.internal",
            f"Kdiv.Internal:{port}",
            f"w-2.kdiv.example:{port}",
        ):
            status, body = await http_json(session, "GET", f"{w.url}/partitions/", {**AUTH, "Host": host})
            assert status == 200, (host, body)
        # A page whose name was rebound to the worker's address: refused before anything else,
        # with or without the token, on the open paths too.
        # A port is ASCII digits within 1..65535, or the Host is not one.
        for host in (
            "evil.example",
            f"evil.example:{port}",
            "kdiv.internal.evil.example",
            "localhost.evil",
            "a:b:c",
            "kdiv.internal:99999",
            "127.0.0.1:99999",
            "[::1]:65536",
            "localhost:0",
            "localhost:+80",
        ):
            for path, headers in (("/partitions/", AUTH), ("/partitions/", {}), ("/ui/", {}), ("/health", {})):
                status, body = await http_json(session, "GET", w.url + path, {**headers, "Host": host})
                assert status == 421, (host, path, body)
                assert isinstance(body, dict) and "KDIV_WEB_ALLOWED_HOSTS" in body["message"], body


async def test_errors_echo_at_most_64_characters_of_what_was_sent(worker):
    topic, w = worker
    long = "t" * 5000
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for path, expected in (
            (f"/partitions/{long}/0/", 404),
            (f"/producers/{long}/", 400),
            (f"/reconcile/{long}/report.html", 404),
            (f"/no-such-view/{long}", 404),
            (f"/incidents/?topic=x&{long}=1", 400),
            (f"/incidents/?partition={'1' * 5000}", 400),
            (f"/partitions/{topic}/{'9' * 5000}/", 400),
        ):
            status, body = await http_json(session, "GET", w.url + path, AUTH)
            assert status == expected and isinstance(body, dict), (path[:80], status, body)
            assert len(body["message"]) < 300 and "…(" in body["message"], (path[:80], body)
        status, body = await http_json(session, "GET", f"{w.url}/partitions/{long}/", {})
        assert status == 401 and isinstance(body, dict) and len(body["message"]) < 300, body


async def test_every_answer_carries_the_security_headers(worker):
    topic, w = worker
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for method, path, headers, expected in (
            ("GET", "/partitions/", AUTH, 200),
            ("GET", f"/partitions/{topic}/0/", AUTH, 200),
            ("GET", "/partitions/", {}, 401),
            ("GET", "/incidents/?limit=0", AUTH, 400),
            ("GET", "/no-such-view", AUTH, 404),
            ("POST", "/partitions/", AUTH, 405),
            ("GET", "/router/", AUTH, 200),
            ("GET", "/metrics", {}, 200),
            ("GET", "/health", {}, 200),
            ("GET", "/partitions/", {**AUTH, "Host": "evil.example"}, 421),
            ("GET", "/ui/", {}, 200),
        ):
            async with session.request(method, w.url + path, headers=headers, allow_redirects=False) as response:
                assert response.status == expected, (method, path, await response.text())
                got = response.headers
                assert got.get("X-Content-Type-Options") == "nosniff", (path, dict(got))
                assert got.get("X-Frame-Options") == "DENY", (path, dict(got))
                assert got.get("Referrer-Policy") == "no-referrer", (path, dict(got))
                policy = got.get("Content-Security-Policy", "")
                assert "frame-ancestors 'none'" in policy and policy.startswith("default-src 'none'"), (path, policy)
                if path == "/ui/":
                    assert "script-src 'sha256-" in policy and "style-src 'sha256-" in policy, policy
                    assert "unsafe" not in policy and "connect-src 'self'" in policy, policy


@pytest.mark.parametrize(
    ("name", "value"),
    [("WEB_ALLOWED_HOSTS", "evil example"), ("WEB_ALLOWED_HOSTS", "a/b"), ("WEB_PEERS", "http://w1:6066")],
)
def test_a_host_list_that_is_not_one_is_refused_naming_it(name, value):
    with pytest.raises(SettingsError, match=f"KDIV_{name}: .* is not a host name"):
        Settings.from_env({"KDIV_TOPICS": "t", f"KDIV_{name}": value})
    good = Settings.from_env({"KDIV_TOPICS": "t", f"KDIV_{name}": "kdiv-*.internal:6066, 10.0.0.*,[::1]"})
    assert getattr(good, name.lower()) == ("kdiv-*.internal:6066", "10.0.0.*", "[::1]")


async def _slow_client(port: int, opened: list, closed: list, line_every_s: float, give_up_s: float) -> None:
    """A client that sends its request head a header line at a time and never ends it; notes
    when it connected and when the worker closed the connection (None: still open at the end)."""
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        closed.append((loop.time(), loop.time(), b"connect failed"))
        return
    started = loop.time()
    opened.append(started)
    answer = b""
    try:
        writer.write(b"GET /partitions/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        while loop.time() - started < give_up_s:
            try:
                answer = await asyncio.wait_for(reader.read(200), line_every_s)
            except TimeoutError:
                writer.write(b"X-Slow: still sending\r\n")
                continue
            break  # an answer or the end: the worker closed it
        else:
            closed.append((started, None, b""))
            return
        closed.append((started, loop.time(), answer))
    except OSError:
        closed.append((started, loop.time(), b"reset"))
    finally:
        writer.close()


def _open_sockets(pid: int) -> int:
    """The process's open sockets; one closed between the listing and its reading is not."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue
    return count


async def test_slow_clients_are_closed_within_the_bounds_and_health_still_answers(bootstrap, topic_factory, tmp_path):
    header_timeout, cap, clients = 2.0, 60, 400
    w = WorkerProcess(
        "bounds",
        bootstrap=bootstrap,
        topics=[topic_factory(1)],
        app_id=f"bounds-{uuid.uuid4().hex[:8]}",
        workdir=tmp_path,
        web_port=free_port(),
        env={
            "KDIV_WEB_TOKEN": TOKEN,
            "KDIV_WEB_HEADER_TIMEOUT_S": str(header_timeout),
            "KDIV_WEB_IDLE_TIMEOUT_S": "5",
            "KDIV_WEB_MAX_CONNECTIONS": str(cap),
            "KDIV_WEB_FAULT_LOG_INTERVAL_S": "3",
        },
    )
    try:
        w.start()
        await w.wait_ready()
        pid = w.pid
        assert pid is not None and w.web_port is not None
        before = _open_sockets(pid)
        opened: list[float] = []
        closed: list[tuple] = []
        loop = asyncio.get_running_loop()
        # Many more slow clients than the cap, without a token, each a header line every 0.5 s.
        slow = [
            asyncio.create_task(_slow_client(w.web_port, opened, closed, 0.5, give_up_s=15.0)) for _ in range(clients)
        ]
        health_times: list[float] = []
        most_sockets = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for _ in range(200):  # until every slow client connected (10 s at most)
                if len(opened) + len(closed) >= clients:
                    break
                await asyncio.sleep(0.05)
            # The cap is full of slow clients: /health still answers, fast.
            for _ in range(10):
                asked = loop.time()
                status, body = await http_json(session, "GET", f"{w.url}/health", {"Connection": "close"})
                health_times.append(loop.time() - asked)
                assert status in (200, 503) and isinstance(body, dict) and "status" in body, body
                most_sockets = max(most_sockets, _open_sockets(pid))
                await asyncio.sleep(0.1)
            # A second wave while the first is still being closed.
            slow += [
                asyncio.create_task(_slow_client(w.web_port, opened, closed, 0.5, give_up_s=15.0))
                for _ in range(clients // 2)
            ]
            for _ in range(10):
                most_sockets = max(most_sockets, _open_sockets(pid))
                await asyncio.sleep(0.1)
            await asyncio.gather(*slow)
            # Malformed requests: a JSON 400 each, one WARNING line in all, then a count.
            for n in range(30):
                reader, writer = await asyncio.open_connection("127.0.0.1", w.web_port)
                writer.write(b"GET /%s HTTP/1.1\r\nBad Header\x01: x\r\n\r\n" % str(n).encode())
                answer = await asyncio.wait_for(reader.read(), 5)
                writer.close()
                assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0], answer[:200]
                assert b'"error": "Bad Request"' in answer, answer
            await asyncio.sleep(4)  # past a fault log interval: the counts are logged
            status, _ = await http_json(session, "GET", f"{w.url}/partitions/", AUTH)
            assert status == 200
        log = w.log_text(current_run_only=True)
    finally:
        w.terminate()

    assert len(closed) == clients + clients // 2
    # Every slow client was closed by the worker, none later than the header timeout (plus
    # scheduling slack on a loaded machine): by a 408, or at the cap for a newer connection.
    still_open = [c for c in closed if c[1] is None]
    assert not still_open, f"{len(still_open)} slow clients still open after 15 s"
    held = sorted(end - began for began, end, _ in closed)
    assert held[-1] < header_timeout + 1.5, held[-10:]
    timed_out = sum(answer.startswith(b"HTTP/1.1 408") for _, _, answer in closed)
    assert timed_out >= 1, [a for _, _, a in closed][:5]
    # The cap held: the worker's sockets (Kafka's too) grew by at most the cap and the
    # connections accepted in one turn of its loop.
    assert most_sockets - before <= cap + 130, (before, most_sockets)
    assert max(health_times) < 1.0, health_times
    # The log holds a few lines and counts, not a line per connection, and no traceback.
    client_lines = [line for line in log.splitlines() if "web client" in line]
    assert len(client_lines) <= 12, client_lines[:20]
    assert any(
        "web clients in the last 3 s:" in line and "request heads not sent whole in time" in line
        for line in client_lines
    ), client_lines
    assert any("malformed request" in line for line in client_lines), client_lines
    assert "Traceback" not in log and "Error handling request" not in log, w.problems()[:5]
    assert not w.problems(), w.problems()[:5]
