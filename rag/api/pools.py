"""The service's own bounded thread pools for the blocking work of requests, fair across
tenants and refused early.

FastAPI runs every sync route and dependency in anyio's one default pool of 40 threads, with
an unbounded first-come queue in front: a burst of slow listings there delays every search
and every key lookup behind it, and nothing says "try later". Here each kind of work has its
own threads (`search`, `db` for listings and other short SQL, `auth` for key lookups), sized
in Settings. A request that finds them busy waits in its tenant's line, and a freed thread
goes to the tenants' lines in turn, so a tenant with 60 searches waiting delays another
tenant's search by one search, not sixty. And one tenant runs at most `tenant_threads` of a
pool's requests at once, even when threads are free: on a CPU with few cores a search is
mostly CPU work, so a tenant with eight searches running would slow every other tenant's by
sharing the cores, whatever the order of the lines. A request is refused at once (429 with
Retry-After, before it waits or does anything) when `queue` requests already wait, or its
own tenant's line holds `tenant_queue`.

A request that waits in its line longer than `wait_s` is refused the same way: a tenant
whose own backlog outlasts a client's patience gets an answer, not a connection that hangs.

Long-poll waiters are counted too: each holds a connection, so there are at most
`max_long_polls` at once; the waiters of one job share one look at the database
(rag.api.jobwatch).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from rag.api.jobwatch import JobWatch
from rag.config import ApiSettings
from rag.errors import Overloaded
from rag.torch_threads import cpu_count

T = TypeVar("T")

# The tenant a request acts for, once its key is known (set by rag.api.deps); None before.
current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "current_tenant", default=None
)


class Pool:
    """`threads` threads; at most `queue` requests waiting for one, `tenant_queue` of them
    from one tenant; waiting tenants served in turn; at most `tenant_threads` (default: all)
    of one tenant's requests running at once."""

    def __init__(
        self, name: str, threads: int, queue: int, tenant_queue: int,
        tenant_threads: int | None = None, wait_s: float = 30.0,
    ) -> None:  # fmt: skip
        self.name = name
        self.wait_s = wait_s
        self.threads = threads
        self.queue = queue
        self.tenant_queue = tenant_queue
        self.tenant_threads = min(threads, tenant_threads or threads)
        self.limiter = anyio.CapacityLimiter(threads)  # never waits: a slot is held first
        self.busy = 0
        self._running: dict[str | None, int] = {}  # by tenant
        # Lines of waiting requests by tenant, oldest line first; changed on the event loop.
        self._lines: OrderedDict[str | None, deque[asyncio.Future[None]]] = OrderedDict()
        self.waiting = 0

    @property
    def admitted(self) -> int:
        """Requests running or waiting."""
        return self.busy + self.waiting

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on one of this pool's threads, or Overloaded (429) when it is full."""
        tenant = current_tenant.get()
        await self._acquire(tenant)
        try:
            call = functools.partial(fn, *args)
            return await anyio.to_thread.run_sync(call, limiter=self.limiter)
        finally:
            self._release(tenant)

    def _may_run(self, tenant: str | None) -> bool:
        return self._running.get(tenant, 0) < self.tenant_threads

    def _start(self, tenant: str | None) -> None:
        self._running[tenant] = self._running.get(tenant, 0) + 1

    async def _acquire(self, tenant: str | None) -> None:
        none_ahead = not any(self._may_run(t) for t in self._lines)  # none runnable waits
        if self.busy < self.threads and none_ahead and self._may_run(tenant):
            self.busy += 1
            self._start(tenant)
            return
        line = self._lines.get(tenant)
        if self.waiting >= self.queue or (line is not None and len(line) >= self.tenant_queue):
            raise Overloaded(
                f"too many requests are waiting for {self.name} threads; try again shortly",
                retry_after_s=1.0,
            )
        if line is None:
            line = self._lines[tenant] = deque()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.append(turn)
        self.waiting += 1
        try:
            # Granted by _release, with the slot already counted as busy.
            await asyncio.wait_for(asyncio.shield(turn), self.wait_s)
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self._release(tenant)  # granted, then cancelled before it ran: pass it on
            else:
                turn.cancel()
                self._forget(tenant, turn)
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    f"waited {self.wait_s:.0f} s for {self.name} threads; try again shortly",
                    retry_after_s=1.0,
                ) from None
            raise

    def _release(self, tenant: str | None) -> None:
        """`tenant`'s request is done and its thread free: the thread goes to the first
        request of the next line whose tenant may run one more, else it idles."""
        left = self._running[tenant] - 1
        if left:
            self._running[tenant] = left
        else:
            del self._running[tenant]
        while True:
            runnable = [t for t in self._lines if self._may_run(t)]
            if not runnable:
                self.busy -= 1
                return
            waiting = runnable[0]
            line = self._lines[waiting]
            turn = line.popleft()
            self.waiting -= 1
            if line:
                self._lines.move_to_end(waiting)  # its next request waits for the others'
            else:
                del self._lines[waiting]
            if not turn.done():  # (one cancelled while it waited: on to the next)
                self._start(waiting)
                turn.set_result(None)  # the slot passes on: busy stays as it is
                return

    def _forget(self, tenant: str | None, turn: asyncio.Future[None]) -> None:
        line = self._lines.get(tenant)
        if line is not None and turn in line:
            line.remove(turn)
            self.waiting -= 1
            if not line:
                del self._lines[tenant]


class Pools:
    def __init__(self, settings: ApiSettings) -> None:
        queue, mine = settings.advanced.thread_queue, settings.advanced.tenant_queue
        share = settings.advanced.tenant_threads or max(1, cpu_count() // 2)
        self.search = Pool("search", settings.advanced.search_threads, queue, mine, share)
        self.db = Pool("database", settings.advanced.db_threads, queue, mine, share)
        # Lines by key prefix, unknown keys in one (rag.auth.KeyCache.line_of): no line takes
        # more than half the threads, so made-up keys never hold every lookup thread.
        self.auth = Pool(
            "key lookup", settings.advanced.auth_threads, queue, mine,
            tenant_threads=max(1, settings.advanced.auth_threads // 2),
        )  # fmt: skip
        self.max_long_polls = settings.max_long_polls
        self.long_polls = 0
        self.jobs: JobWatch[Any] = JobWatch(
            settings.advanced.long_poll_first_s, settings.advanced.long_poll_every_s
        )

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
