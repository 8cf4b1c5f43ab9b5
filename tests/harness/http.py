"""Asking workers' web views: JSON requests, the router's view of who owns what."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import aiohttp

from tests.harness.processes import WorkerProcess


async def router_view(worker: WorkerProcess) -> tuple[dict, dict]:
    """(table changelog partitions, other topics' partitions) per worker URL, as Faust's
    assignor distributed them to `worker` (its /router/ endpoints): active partitions only.

    Tansu's DescribeGroups returns no member assignments, so the group is asked this way.
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with session.get(f"{worker.url}/router/") as response:
            response.raise_for_status()
            tables = await response.json()
        async with session.get(f"{worker.url}/router/topics") as response:
            response.raise_for_status()
            topics = await response.json()
    return tables, topics


def owners(distribution: dict, topic: str) -> dict[int, list[str]]:
    """partition -> URLs of the workers the distribution gives it to."""
    found: dict[int, list[str]] = defaultdict(list)
    for url, by_topic in distribution.items():
        for partition in by_topic.get(topic, ()):
            found[partition].append(url)
    return dict(found)


async def http_json(session, method: str, url: str, headers: dict | None = None) -> tuple[int, dict | str]:
    """(status, JSON body, or text when the answer is not JSON)."""
    async with session.request(method, url, headers=headers or {}) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def wait_for_split(
    session, workers, partitions: int, headers: dict | None = None, timeout: float = 60.0
) -> dict[int, str]:
    """Partition -> owning worker URL (from /partitions/), once each worker owns one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status, body = await http_json(session, "GET", f"{workers[0].url}/partitions/", headers)
        owners = {item["partition"]: item["worker"] for item in body["items"]} if isinstance(body, dict) else {}
        if len(owners) == partitions and len(set(owners.values())) == len(workers):
            return owners
        if loop.time() > deadline:
            raise AssertionError(f"partitions not split between the workers: {status} {body}")
        await asyncio.sleep(0.5)


async def wait_for_incidents_read(session, worker: WorkerProcess, ends: dict[int, int], timeout: float = 20.0) -> None:
    """Wait until `worker`'s incident list has read the incidents topic up to `ends`
    (partition -> end offset), by the `read_to` its /incidents/ view reports."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    read_to: dict[int, int] = {}
    while loop.time() < deadline:
        status, page = await http_json(session, "GET", f"{worker.url}/incidents/?limit=1")
        if status == 200 and isinstance(page, dict):
            read_to = {item["partition"]: item["offset"] for item in page["read_to"]}
            if all(read_to.get(p, 0) >= end for p, end in ends.items()):
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{worker.url} read the incidents topic to {read_to}, not to {ends}, in {timeout:.0f} s")
