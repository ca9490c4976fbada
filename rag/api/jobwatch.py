"""Long polls of one job share one look at the database.

`GET /v1/jobs/{id}?wait=` holds the request until the job is done. Each waiter used to look
at the job itself, ten times a second at first: n waiters on one job were n database
reads on the worker threads and n disconnect checks on the event loop a tick, and the
threads' turns for the GIL made every tenant's requests wait. Now the first waiter on a job
starts one watch, which looks at the job first after `first_s`, then less and less often
(x1.5 a time) up to `every_s`, and ends when the job is done, or nobody waits for it any
more, or the last waiter's deadline has passed. Every waiter of that job (and tenant) reads
the watch's latest look. A waiter that comes while the watch runs starts from that look,
and waiters that come together before it starts share one first read: a burst of n
waiters on one job is one read, not n (each on the database threads, most of them refused
there with a 429 after the full cost of the request).

A waiter returns when the job is done, when its own deadline passes (with the latest look),
or when its client goes away (noticed from the connection, not by asking each tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from starlette.types import Receive


class _Job(Protocol):
    @property
    def done(self) -> bool: ...


J = TypeVar("J", bound=_Job)

# Where the watch sleeps (tests put a clock of their own here).
_sleep = asyncio.sleep


class _Watch(Generic[J]):
    def __init__(self, latest: J) -> None:
        self.latest = latest
        self.waiters = 0
        self.until = 0.0  # the latest deadline of its waiters
        self.error: BaseException | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None  # held: the loop keeps only weak ones


class JobWatch(Generic[J]):
    def __init__(self, first_s: float, every_s: float) -> None:
        self.first_s = first_s
        self.every_s = every_s
        self._watches: dict[tuple[str, str], _Watch[J]] = {}
        self._reads: dict[tuple[str, str], asyncio.Future[J]] = {}

    @property
    def watching(self) -> int:
        """Jobs being watched now."""
        return len(self._watches)

    async def first_look(self, key: tuple[str, str], load: Callable[[], Awaitable[J]]) -> J:
        """A new waiter's look at the job `key` names: the watch's latest when the job is
        watched, else one read shared with every waiter that comes while it runs (it
        finishes for them even if the waiter that started it goes away)."""
        watch = self._watches.get(key)
        if watch is not None and watch.error is None:
            return watch.latest
        read = self._reads.get(key)
        if read is None:
            read = self._reads[key] = asyncio.ensure_future(load())

            def done(f: asyncio.Future[J]) -> None:
                self._reads.pop(key, None)
                if not f.cancelled():
                    f.exception()  # taken, so a read that ends with no one waiting is quiet

            read.add_done_callback(done)
        return await asyncio.shield(read)

    async def wait(
        self,
        key: tuple[str, str],
        job: J,
        load: Callable[[], Awaitable[J]],
        deadline: float,
        receive: Receive,
    ) -> J:
        """The job (`job`, just read) once it is done, or as last seen when `deadline`
        (time.monotonic) passes or the client (`receive`) goes away. `key` is (tenant, job
        id); `load` reads the job."""
        watch = self._watches.get(key)
        if watch is None:
            watch = _Watch(job)
            self._watches[key] = watch
            watch.task = asyncio.create_task(self._run(key, watch, load))
        watch.waiters += 1
        watch.until = max(watch.until, deadline)
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            left = deadline - time.monotonic()
            if left > 0:
                await asyncio.wait(
                    (watch.ended, gone), timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            watch.waiters -= 1
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if watch.error is not None:
            raise watch.error
        return watch.latest

    async def _run(
        self, key: tuple[str, str], watch: _Watch[J], load: Callable[[], Awaitable[J]]
    ) -> None:
        pause = self.first_s
        try:
            while watch.waiters > 0 and not watch.latest.done:
                left = watch.until - time.monotonic()
                if left <= 0:
                    break  # every waiter's deadline has passed
                await _sleep(min(pause, left))
                if watch.waiters == 0:
                    break
                pause = min(pause * 1.5, self.every_s)
                watch.latest = await load()
        except Exception as exc:  # every waiter of this job answers with it
            watch.error = exc
        finally:
            del self._watches[key]
            watch.ended.set_result(None)


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (the request's body, if any, is read and dropped:
    a long poll is a GET)."""
    while (await receive())["type"] != "http.disconnect":
        pass
