"""The other workers of the group, as the views ask them: for a partition's owner's answer,
and for their items of a list view, merged with this worker's.

A worker is asked at the URL it advertises in the group's assignment metadata, which anyone
who can join the group can set: so with a token requests and answers are signed
(`kdiv.worker.web.auth`), an answer is read up to MAX_PEER_ANSWER bytes and taken only when
signed and JSON, and `KDIV_WEB_PEERS` may narrow who is asked at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import NamedTuple, cast

from aiohttp import ClientError, ClientTimeout
from faust.web import Request
from yarl import URL

from kdiv.untrusted import parse_json
from kdiv.worker.faustcompat.internals import peer_topics
from kdiv.worker.web.auth import answer_is_signed, sign_request
from kdiv.worker.web.guard import clipped, matches
from kdiv.worker.web.params import LOCAL, scope
from kdiv.worker.web.shapes import cursor_of

log = logging.getLogger("kdiv.views")

_PEER_TIMEOUT = ClientTimeout(total=5)
# A peer's answer read at most (a worker's list of 1,000s of producers is a few MiB).
MAX_PEER_ANSWER = 64 << 20


class PeerAnswer(NamedTuple):
    """Another worker's answer: status and JSON body, both None when it did not answer or its
    answer was refused (`refused` then says why: not signed, not JSON, not a permitted peer)."""

    url: URL
    status: int | None
    body: dict | list | None
    refused: str | None = None


def _is_producer_item(item: object) -> bool:
    """A peer's producer item with the fields pages are ordered by."""
    return (
        isinstance(item, dict)
        and isinstance(item.get("topic"), str)
        and isinstance(item.get("partition"), int)
        and isinstance(item.get("producer"), str)
    )


def _by_place(item: dict) -> tuple:
    return (item["topic"], item["partition"], item.get("producer", ""))


def _order_of(key, item: object) -> tuple | None:
    """An item's place in a merged list, as values that compare with every other item's
    (strings after numbers); None when the item has no such place."""
    if not isinstance(item, dict):
        return None
    try:
        parts = key(item)
    except (KeyError, TypeError, AttributeError):
        return None
    order = []
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            order.append((0, part, ""))
        elif isinstance(part, str):
            order.append((1, 0, part))
        else:
            return None
    return tuple(order)


async def _read_capped(response, limit: int) -> bytes:
    """The whole body of a peer's answer; ValueError past `limit` bytes."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise ValueError(f"an answer larger than {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class Peers:
    """This worker's peers: who they are, and their answers to a view's request."""

    def __init__(self, app, token: str, peer_patterns: Iterable[str]) -> None:
        self.app = app
        # The key of the requests and answers exchanged with peers (never sent itself);
        # without a token peers are asked and believed as they are (loopback only).
        self._token = token
        self._peer_patterns = tuple(peer_patterns)

    def peer_urls(self) -> list[URL]:
        me = URL(str(self.app.conf.canonical_url))
        urls = {URL(str(url)) for url in peer_topics(self.app)}
        return sorted((u for u in urls if (u.host, u.port) != (me.host, me.port)), key=str)

    def not_a_peer(self, url: URL) -> str | None:
        """Why a URL advertised in the group is not asked (None: it is): a member's metadata
        is untrusted, and `KDIV_WEB_PEERS` may narrow who is."""
        if url.scheme not in ("http", "https") or not url.host:
            return "is not an http(s) URL"
        if self._peer_patterns and not matches(self._peer_patterns, url.host.lower().rstrip("."), url.port):
            return "is not in KDIV_WEB_PEERS"
        return None

    def owner_of(self, topic: str, partition: int) -> URL | None:
        """The URL of the worker that owns (topic, partition), from Faust's assignor."""
        for url, topics in peer_topics(self.app).items():
            if partition in topics.get(topic, ()):
                return URL(str(url))
        return None

    async def ask(self, url: URL, request: Request) -> PeerAnswer:
        """Ask another worker for its local answer to this request: signed with the token
        (not sending it), and taken only when the answer is signed too."""
        refused = self.not_a_peer(url)
        if refused is not None:
            log.warning("worker %s %s: not asked for %s", url, refused, clipped(request.path))  # type: ignore[attr-defined]
            return PeerAnswer(url, None, None, f"{url} {refused}")
        path = request.path  # type: ignore[attr-defined]  # aiohttp's Request
        target = url.with_path(path).with_query({**request.query, "scope": LOCAL})
        headers, request_sig = sign_request(self._token, "GET", target) if self._token else ({}, "")
        try:
            async with self.app.http_client.get(
                target, timeout=_PEER_TIMEOUT, headers=headers, allow_redirects=False
            ) as response:
                body = await _read_capped(response, MAX_PEER_ANSWER)
                status, answer_headers = response.status, response.headers
        except (TimeoutError, ClientError, ValueError) as bad:
            log.warning("worker %s did not answer %s: %s", url, request.url, bad)
            return PeerAnswer(url, None, None)
        if self._token and not answer_is_signed(self._token, request_sig, status, body, answer_headers):
            # Not from a worker holding the token (a rogue group member, or something else at
            # that address): its body is not looked at.
            log.warning("worker %s answered %s %s without this group's signature: refused", url, status, target.path)
            return PeerAnswer(url, None, None, f"{url} answered without this group's signature")
        try:
            return PeerAnswer(url, status, parse_json(body, max_bytes=MAX_PEER_ANSWER))
        except ValueError as bad:
            log.warning("worker %s answered %s with a body that is not JSON: %s", url, target.path, bad)
            return PeerAnswer(url, None, None, f"{url} answered with a body that is not JSON")

    async def gather(self, request: Request, local: list[dict], sort_key=None) -> dict:
        """Local items plus every peer's, unless this is itself a peer's request."""
        if scope(request) == LOCAL:
            return {"items": local}
        key = sort_key or _by_place
        answers = await asyncio.gather(*(self.ask(url, request) for url in self.peer_urls()))
        ordered = [(_order_of(key, item), item) for item in local]
        unavailable = []
        for answer in answers:
            items_there = answer.body.get("items") if isinstance(answer.body, dict) else None
            if answer.status != 200 or not isinstance(items_there, list):
                unavailable.append(str(answer.url))
                continue
            refused = 0
            for item in items_there:
                order = _order_of(key, item)
                if order is None:
                    refused += 1
                else:
                    ordered.append((order, item))
            if refused:
                # A peer's answer is untrusted: what cannot be placed among ours is left out,
                # said here and by listing the peer as not (fully) available.
                path = request.path  # type: ignore[attr-defined]  # aiohttp's Request
                log.warning("worker %s answered %s with %d item(s) without their place", answer.url, path, refused)
                unavailable.append(str(answer.url))
        ordered.sort(key=lambda pair: pair[0] or ())
        return {"items": [item for _, item in ordered], "unavailable_workers": unavailable}

    async def gather_producer_pages(self, request: Request, local: dict) -> dict:
        """This worker's page of producers merged with every peer's page for the same
        request (unless this is itself a peer's request): the first `limit` of them all."""
        if request.query.get("scope") == LOCAL:
            return local
        answers = await asyncio.gather(*(self.ask(url, request) for url in self.peer_urls()))
        items, total, more = list(local["items"]), local["total"], local["next_cursor"] is not None
        unavailable = []
        for answer in answers:
            body = answer.body
            there = body.get("items") if isinstance(body, dict) else None
            counted = body.get("total") if isinstance(body, dict) else None
            if answer.status != 200 or not isinstance(there, list) or not isinstance(counted, int):
                unavailable.append(str(answer.url))
                continue
            items.extend(item for item in there if _is_producer_item(item))
            total += counted
            more = more or cast(dict, body).get("next_cursor") is not None
        items.sort(key=lambda item: (item["topic"], item["partition"], item["producer"]))
        limit = local["limit"]
        page = items[:limit]
        more = more or len(items) > limit
        return {
            "items": page,
            "total": total,
            "limit": limit,
            "next_cursor": cursor_of(page[-1]) if more and page else None,
            "unavailable_workers": unavailable,
        }
