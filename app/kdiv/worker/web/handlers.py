"""What a view's handler is: a function of the worker's site and the request that gives an
`Answer`; and the one Faust view class that serves any of them, answering its BadRequest
with a 400.

A handler takes the path's parameters as keyword arguments (aiohttp's match info) and reads
the query through `kdiv.worker.web.params`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NamedTuple

from faust.web import Request, Response, View

from kdiv.worker.readmodel import WorkerReadModel
from kdiv.worker.web.params import BadRequest
from kdiv.worker.web.peers import Peers


class Site(NamedTuple):
    """What the handlers answer from: the Faust app, what the views read of the validation
    worker, and its peers."""

    app: Any
    worker: WorkerReadModel
    peers: Peers


@dataclass(frozen=True, slots=True)
class Answer:
    """A view's answer: JSON by default, else an HTML page or bytes of `content_type`."""

    body: Any
    status: int = 200
    html: bool = False
    content_type: str | None = None

    @classmethod
    def error(cls, status: int, message: str) -> Answer:
        """An error as every view gives it: the HTTP reason and what was wrong."""
        return cls({"error": HTTPStatus(status).phrase, "message": message}, status)


Handler = Callable[..., Awaitable[Answer]]


def view_class(name: str, site: Site, handler: Handler) -> type[View]:
    """A Faust view named `name` whose GET is `handler`'s answer."""

    async def get(self: View, request: Request, **path: str) -> Response:
        try:
            answer = await handler(site, request, **path)
        except BadRequest as bad:
            answer = Answer.error(400, str(bad))
        if answer.html:
            return self.html(answer.body, status=answer.status)
        if answer.content_type is not None:
            return self.bytes(answer.body, content_type=answer.content_type, status=answer.status)
        return self.json(answer.body, status=answer.status)

    return type(name, (View,), {"get": get, "__doc__": handler.__doc__, "__module__": handler.__module__})
