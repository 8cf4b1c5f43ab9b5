"""A peer's items merged into a list view: what cannot be placed among this worker's items is
left out and the peer named, never a 500 (a peer's answer is untrusted, even signed)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from yarl import URL

from kdiv.worker.web.peers import PeerAnswer, Peers


def gathered(answers: dict[str, PeerAnswer], local: list[dict], sort_key=None) -> dict:
    peers = Peers.__new__(Peers)
    peers.peer_urls = lambda: [URL(url) for url in answers]  # type: ignore[method-assign]

    async def ask(url, request):
        return answers[str(url)]

    peers.ask = ask  # type: ignore[method-assign]
    request = SimpleNamespace(path="/partitions/", query={})
    return asyncio.run(peers.gather(request, local, sort_key))  # type: ignore[arg-type]


def test_items_of_a_peer_without_a_place_are_left_out_and_the_peer_named(caplog):
    mine = [{"topic": "b", "partition": 0}, {"topic": "a", "partition": 2}]
    good, odd = "http://good:6066/", "http://odd:6066/"
    answers = {
        good: PeerAnswer(URL(good), 200, {"items": [{"topic": "a", "partition": 1}]}),
        odd: PeerAnswer(
            URL(odd),
            200,
            {
                "items": [
                    {"topic": "a", "partition": 0},
                    {"partition": 3},
                    {"topic": 7, "partition": 1},
                    {"topic": "c", "partition": [1]},
                    "not an item",
                    {"topic": "c", "partition": True},
                ]
            },
        ),
    }
    with caplog.at_level(logging.WARNING, logger="kdiv.views"):
        answer = gathered(answers, mine)
    # A number where a name was expected still has a place (numbers before names): shown, not a 500.
    assert [(i["topic"], i["partition"]) for i in answer["items"]] == [(7, 1), ("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert answer["unavailable_workers"] == [odd]
    assert any("odd" in r.getMessage() and "4 item(s)" in r.getMessage() for r in caplog.records)


def test_a_peer_whose_items_all_have_their_place_is_available():
    url = "http://peer:6066/"
    answers = {url: PeerAnswer(URL(url), 200, {"items": [{"route": "r", "hop": 1}, {"route": "r", "hop": 0}]})}
    answer = gathered(answers, [{"route": "q", "hop": 0}], sort_key=lambda i: (i["route"], i["hop"]))
    assert [(i["route"], i["hop"]) for i in answer["items"]] == [("q", 0), ("r", 0), ("r", 1)]
    assert answer["unavailable_workers"] == []
