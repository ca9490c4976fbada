"""The service's own bounded thread pools for the blocking work of requests, refused early.

FastAPI runs every sync route and dependency in anyio's one default pool of 40 threads, with
an unbounded queue in front: a burst of slow listings there delays every search and every key
lookup behind it, and nothing says "try later". Here each kind of work has its own threads
(`search`, `db` for listings and other short SQL, `auth` for key lookups), sized in Settings,
and a request that finds its kind's threads busy and `queue` others already waiting is
refused at once: 429 with Retry-After, before it waits or does anything.

Long-poll waiters are counted too: each holds a connection and polls the database, so there
are at most `max_long_polls` at once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

import anyio
import anyio.to_thread

from rag.config import ApiSettings
from rag.errors import Overloaded

T = TypeVar("T")


class Pool:
    """`threads` threads and at most `queue` requests waiting for one."""

    def __init__(self, name: str, threads: int, queue: int) -> None:
        self.name = name
        self.threads = threads
        self.queue = queue
        self.limiter = anyio.CapacityLimiter(threads)
        self.admitted = 0  # running or waiting; changed on the event loop only

    @property
    def full(self) -> bool:
        return self.admitted >= self.threads + self.queue

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on one of this pool's threads, or Overloaded (429) when it is full."""
        if self.full:
            raise Overloaded(
                f"too many requests are waiting for {self.name} threads; try again shortly",
                retry_after_s=1.0,
            )
        self.admitted += 1
        try:
            call = functools.partial(fn, *args)
            return await anyio.to_thread.run_sync(call, limiter=self.limiter)
        finally:
            self.admitted -= 1


class Pools:
    def __init__(self, settings: ApiSettings) -> None:
        queue = settings.thread_queue
        self.search = Pool("search", settings.search_threads, queue)
        self.db = Pool("database", settings.db_threads, queue)
        self.auth = Pool("key lookup", settings.auth_threads, queue)
        self.max_long_polls = settings.max_long_polls
        self.long_polls = 0

    @contextlib.contextmanager
    def long_poll(self) -> Iterator[None]:
        """Hold one of the long-poll places, or Overloaded (429) when all are taken."""
        if self.long_polls >= self.max_long_polls:
            raise Overloaded(
                f"{self.max_long_polls} requests are already waiting for jobs; "
                "try again, or poll without `wait`",
                retry_after_s=1.0,
            )
        self.long_polls += 1
        try:
            yield
        finally:
            self.long_polls -= 1
