"""Workers asking each other (signed requests, signed answers), with a rogue group member.

The rogue is a real member of the worker's consumer group that does not know the token (a
kdiv worker without one, its web server off) and advertises the URL of a server in this test,
which records every request it gets and answers made-up state.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import aiohttp
from aiohttp import web
from yarl import URL

from kdiv.worker.web.auth import (
    PEER_NONCE,
    PEER_SIGNATURE,
    PEER_TIME,
    answer_is_signed,
    request_signature,
    sign_request,
)
from tests.harness.http import http_json
from tests.harness.processes import WorkerProcess, free_port

PARTITIONS = 4
TOKEN = "kdiv-peer-token-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FORGED_RECORDS = 424242


class Impostor:
    """An HTTP server that records each request and answers forged state; it copies the
    request's signature headers into its answer, as a rogue that cannot sign would try."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.runner: web.AppRunner | None = None

    async def answer(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        forged = {"topic": self.topic, "partition": 99, "records": FORGED_RECORDS, "worker": "forged"}
        body = {"items": [forged]} if request.path == "/partitions/" else forged
        echoed = {k: v for k, v in request.headers.items() if k.lower().startswith("x-kdiv-")}
        return web.json_response(body, headers=echoed)

    async def __aenter__(self) -> Impostor:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def rogue_owned(session, worker: WorkerProcess, topic: str, rogue_url: str, timeout: float = 60.0) -> list[int]:
    """The partitions Faust's assignor gave the rogue, as `worker`'s router sees them, once
    `worker` itself lists only the others (the rebalance is over there)."""
    deadline = asyncio.get_running_loop().time() + timeout
    topics: dict | str = {}
    while asyncio.get_running_loop().time() < deadline:
        status, topics = await http_json(session, "GET", f"{worker.url}/router/topics", AUTH)
        _, local = await http_json(session, "GET", f"{worker.url}/partitions/?scope=local", AUTH)
        if status == 200 and isinstance(topics, dict) and isinstance(local, dict):
            owned = set(topics.get(rogue_url, {}).get(topic, []))
            mine = set(topics.get(worker.url, {}).get(topic, []))
            if owned and mine and {item["partition"] for item in local["items"]} == mine:
                return sorted(owned)
        await asyncio.sleep(0.3)
    raise AssertionError(f"the rogue member {rogue_url} was never given a partition: {topics}")


async def test_a_rogue_group_member_never_sees_the_token_and_its_answers_are_refused(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(PARTITIONS)
    app_id = f"peers-{uuid.uuid4().hex[:8]}"
    async with Impostor(topic) as impostor:
        rogue_url = f"http://127.0.0.1:{impostor.port}"
        worker = WorkerProcess(
            "w1",
            bootstrap=bootstrap,
            topics=[topic],
            app_id=app_id,
            workdir=tmp_path,
            web_port=free_port(),
            env={"KDIV_WEB_TOKEN": TOKEN},
        )
        # A member without the token, advertising the impostor's address as its web URL.
        rogue = WorkerProcess(
            "rogue",
            bootstrap=bootstrap,
            topics=[topic],
            app_id=app_id,
            workdir=tmp_path,
            env={"KDIV_WEB_PORT": str(impostor.port)},
        )
        try:
            worker.start()
            rogue.start()
            await asyncio.gather(worker.wait_ready(), rogue.wait_ready())
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                owned = await rogue_owned(session, worker, topic, rogue_url)

                # A partition the rogue owns: its made-up state is not passed on.
                status, body = await http_json(session, "GET", f"{worker.url}/partitions/{topic}/{owned[0]}/", AUTH)
                assert status == 502, body
                assert isinstance(body, dict) and rogue_url in body["message"], body
                assert str(FORGED_RECORDS) not in str(body)

                # The list: the rogue is an unavailable worker, none of its items are merged.
                status, listing = await http_json(session, "GET", f"{worker.url}/partitions/", AUTH)
                assert status == 200 and isinstance(listing, dict), listing
                assert listing["unavailable_workers"] == [rogue_url]
                assert all(item["worker"] == worker.url for item in listing["items"]), listing
                assert 99 not in {item["partition"] for item in listing["items"]}

                # It was asked, and saw no token: only a signature of each request.
                assert len(impostor.requests) >= 2
                for _method, path_qs, headers in impostor.requests:
                    assert TOKEN not in path_qs and not any(TOKEN in value for value in headers.values())
                    assert "Authorization" not in headers and len(headers[PEER_SIGNATURE]) == 64

                # What it was sent does not open the worker: signed for the rogue's address.
                _method, path_qs, headers = impostor.requests[-1]
                replay = {k: v for k, v in headers.items() if k.lower().startswith("x-kdiv-")}
                for host in (None, f"127.0.0.1:{impostor.port}"):
                    sent = {**replay, **({"Host": host} if host else {})}
                    status, body = await http_json(session, "GET", f"{worker.url}{path_qs}", sent)
                    assert status == 401, (host, body)

                # The worker's own answer to a signed request for it, and no second use.
                await assert_signed_requests_are_checked(session, worker)

                # Limited to KDIV_WEB_PEERS, the worker does not even ask the rogue.
                worker.terminate()
                worker.extra_env["KDIV_WEB_PEERS"] = "kdiv-worker-*, 127.0.0.1:1"
                worker.start()
                await worker.wait_ready()
                owned = await rogue_owned(session, worker, topic, rogue_url)
                asked_before = len(impostor.requests)
                status, body = await http_json(session, "GET", f"{worker.url}/partitions/{topic}/{owned[0]}/", AUTH)
                assert status == 502 and isinstance(body, dict), body
                assert rogue_url in body["message"] and "KDIV_WEB_PEERS" in body["message"], body
                status, listing = await http_json(session, "GET", f"{worker.url}/partitions/", AUTH)
                assert status == 200 and isinstance(listing, dict) and listing["unavailable_workers"] == [rogue_url]
                assert len(impostor.requests) == asked_before
            assert worker.problems() == []
        finally:
            rogue.terminate()
            worker.terminate()


async def assert_signed_requests_are_checked(session, worker: WorkerProcess) -> None:
    target = URL(f"{worker.url}/partitions/?scope=local")
    headers, request_sig = sign_request(TOKEN, "GET", target)
    async with session.get(target, headers=headers) as response:
        body = await response.read()
        assert response.status == 200, body
        assert answer_is_signed(TOKEN, request_sig, 200, body, response.headers)
        assert not answer_is_signed("x" * 32, request_sig, 200, body, response.headers)
    # The same request again (a replay), one signed a minute ago, one signed for another
    # worker's address, one signed with another key.
    again = await http_json(session, "GET", str(target), headers)
    assert again[0] == 401, again
    nonce = "ab" * 16
    old_ms = int(time.time() * 1000) - 60_000
    now_ms = int(time.time() * 1000)
    assert worker.web_port is not None
    other_port = worker.web_port + 1
    for label, key, signed_target, at_ms in (
        ("stale", TOKEN, str(target), old_ms),
        ("another worker's", TOKEN, f"http://127.0.0.1:{other_port}/partitions/?scope=local", now_ms),
        ("another key", "y" * 32, str(target), now_ms),
    ):
        signature = request_signature(key, "GET", signed_target, at_ms, nonce, b"")
        sent = {PEER_TIME: str(at_ms), PEER_NONCE: nonce, PEER_SIGNATURE: signature}
        status, body = await http_json(session, "GET", str(target), sent)
        assert status == 401, (label, body)
