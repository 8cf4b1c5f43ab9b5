"""The HTTP of a real worker's views: what it parses, which Host names it answers, and the
security headers of every answer."""

from __future__ import annotations

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
        for host in ("evil.example", f"evil.example:{port}", "kdiv.internal.evil.example", "localhost.evil", "a:b:c"):
            for path, headers in (("/partitions/", AUTH), ("/partitions/", {}), ("/ui/", {}), ("/health", {})):
                status, body = await http_json(session, "GET", w.url + path, {**headers, "Host": host})
                assert status == 421, (host, path, body)
                assert isinstance(body, dict) and "KDIV_WEB_ALLOWED_HOSTS" in body["message"], body


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
