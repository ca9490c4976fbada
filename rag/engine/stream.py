"""Between the step loop's thread and the event loops its callers iterate on: one request's
stream of TokenEvents, what the loop keeps of a request it serves, and handing events over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rag.engine.sequence import Sequence, TokenEvent


class RequestStream:
    """Async iterator of one request's TokenEvents. Closing it early cancels the request."""

    def __init__(self, request_id: str, cancel: Callable[[str], None]):
        self.request_id = request_id
        self._cancel = cancel
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._cancel(self.request_id)


@dataclass
class Pending:
    """A request the step loop serves: its sequence, its stream and the loop that reads it."""

    seq: Sequence
    stream: RequestStream
    loop: asyncio.AbstractEventLoop
    text: str = ""  # detokenized output so far (truncated at a stop string)
    sent: int = 0  # chars of text already sent
    prefix_offset: int = 0
    read_offset: int = 0
    pending_ids: list[int] = field(default_factory=list)


def deliver(outbox: list[tuple[Pending, Any]]) -> None:
    """Hand each event (or exception) to its stream, on the stream's own event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Pending, Any]]] = {}
    for req, item in outbox:
        by_loop.setdefault(req.loop, []).append((req, item))
    for loop, items in by_loop.items():
        # A closed loop (RuntimeError) means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[Pending, Any]]) -> None:
    for req, item in items:
        req.stream._queue.put_nowait(item)
