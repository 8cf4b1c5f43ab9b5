"""KDIV_WEB_TOKEN on two real workers, and the rule that keeps a worker without one on loopback."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest

from kdiv.config.settings import Settings, SettingsError
from tests.harness.broker import produce_with_faults_for, wait_until_caught_up
from tests.harness.http import http_json, wait_for_split
from tests.harness.processes import WorkerProcess, free_port

PARTITIONS = 4
TOKEN = "kdiv-test-token-" + uuid.uuid4().hex


# -- the bind rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "kdiv-worker-1"])
def test_a_reachable_address_needs_a_token_or_an_explicit_opt_out(host):
    env = {"KDIV_TOPICS": "t", "KDIV_WEB_HOST": host}
    with pytest.raises(
        SettingsError, match="KDIV_WEB_HOST=.* KDIV_WEB_TOKEN is not set.*KDIV_WEB_ALLOW_UNAUTHENTICATED"
    ):
        Settings.from_env(env)
    assert Settings.from_env({**env, "KDIV_WEB_TOKEN": TOKEN}).web_token == TOKEN
    assert Settings.from_env({**env, "KDIV_WEB_ALLOW_UNAUTHENTICATED": "true"}).web_allow_unauthenticated
    # Without web views there is nothing to protect.
    assert not Settings.from_env({**env, "KDIV_WEB_ENABLED": "false"}).web_enabled


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_needs_no_token(host):
    settings = Settings.from_env({"KDIV_TOPICS": "t", "KDIV_WEB_HOST": host})
    assert settings.web_token == "" and settings.web_host == host


@pytest.mark.parametrize("token", ["short", "has space in the middle-xxxx", "ünïcödé-token-123456"])
def test_a_weak_or_malformed_token_is_refused(token):
    with pytest.raises(SettingsError, match="KDIV_WEB_TOKEN must be at least 16 characters"):
        Settings.from_env({"KDIV_TOPICS": "t", "KDIV_WEB_TOKEN": token})


def test_the_token_stays_out_of_reprs():
    assert TOKEN not in repr(Settings.from_env({"KDIV_TOPICS": "t", "KDIV_WEB_TOKEN": TOKEN}))


# -- two workers with a token ----------------------------------------------------------------


@pytest.fixture
async def two_workers(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(PARTITIONS)
    app_id = f"auth-{uuid.uuid4().hex[:8]}"
    workers = [
        WorkerProcess(
            name,
            bootstrap=bootstrap,
            topics=[topic],
            app_id=app_id,
            workdir=tmp_path,
            web_port=free_port(),
            env={"KDIV_WEB_TOKEN": TOKEN},
        )
        for name in ("w1", "w2")
    ]
    try:
        for w in workers:
            w.start()
        await asyncio.gather(*(w.wait_ready() for w in workers))
        await produce_with_faults_for(bootstrap, topic, 2, rate=200, fault_every=1000)
        await wait_until_caught_up(bootstrap, app_id, topic, workers=workers, timeout=90)
        yield topic, workers
    finally:
        for w in workers:
            w.terminate()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_views_need_the_token_except_health_and_metrics(two_workers):
    topic, workers = two_workers
    w1 = workers[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        owners = await wait_for_split(session, workers, PARTITIONS, AUTH)

        protected = [
            "/partitions/",
            f"/partitions/{topic}/0/",
            "/producers/",
            "/incidents/",
            # Faust's own views, and a path that does not exist (not revealed either).
            "/router/",
            "/router/topics",
            "/table/",
            "/stats/",
            "/no-such-view",
        ]
        wrong_tokens = [
            {},
            {"Authorization": "Bearer " + "x" * len(TOKEN)},
            {"Authorization": TOKEN},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": f"Bearer {TOKEN}x"},
        ]
        for path in protected:
            for headers in wrong_tokens:
                status, body = await http_json(session, "GET", w1.url + path, headers)
                assert status == 401, (path, headers, body)
                assert body["error"] == "Unauthorized" and "Bearer" in body["message"]

        for path in ("/partitions/", "/producers/", "/incidents/", "/router/", "/router/topics"):
            status, body = await http_json(session, "GET", w1.url + path, AUTH)
            assert status == 200, (path, body)
        status, body = await http_json(session, "GET", w1.url + "/no-such-view", AUTH)
        assert status == 404

        # Open for probes and scrapers.
        status, health = await http_json(session, "GET", w1.url + "/health")
        assert status == 200 and health["status"] == "ready"
        status, text = await http_json(session, "GET", w1.url + "/metrics")
        assert status == 200 and "kdiv_records_validated_total" in text

        # Nothing writes: other methods are refused, before and after authentication.
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            for path in ("/partitions/", "/incidents/", "/router/"):
                assert (await http_json(session, method, w1.url + path))[0] == 401, (method, path)
                status, body = await http_json(session, method, w1.url + path, AUTH)
                assert status == 405, (method, path, body)
            # The open paths are open to reading only.
            for path in ("/health", "/metrics"):
                assert (await http_json(session, method, w1.url + path))[0] == 405, (method, path)

        # The fan-out: each worker asks the other for its partitions, with the token.
        status, listing = await http_json(session, "GET", w1.url + "/partitions/", AUTH)
        assert status == 200 and listing["unavailable_workers"] == []
        assert {item["partition"] for item in listing["items"]} == set(range(PARTITIONS))

        # Forwarding: a partition owned by the other worker is answered by its owner, which
        # requires the token too; without it the asked worker refuses.
        for asked in workers:
            foreign = next(p for p, url in owners.items() if url != asked.url)
            path = f"{asked.url}/partitions/{topic}/{foreign}/"
            status, body = await http_json(session, "GET", path, AUTH)
            assert status == 200, body
            assert body["worker"] == owners[foreign] != asked.url
            assert (await http_json(session, "GET", path))[0] == 401
            owner_url = owners[foreign]
            assert (await http_json(session, "GET", f"{owner_url}/partitions/{topic}/{foreign}/?scope=local"))[0] == 401
