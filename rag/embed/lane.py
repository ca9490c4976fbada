"""The query lane: one long-lived thread that embeds search queries, several at a time, and
the rule that gives its work priority over ingest's (`in_turns`)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import numpy.typing as npt

from rag.deadline import Deadline
from rag.embed.base import split_rows
from rag.errors import Unavailable
from rag.torch_threads import team_thread


class QueryLane:
    """One long-lived thread that embeds short requests (search queries), several at a time.

    Why not the caller's thread: torch runs its CPU kernels on an OpenMP team per calling
    thread, and the web server calls from a pool of threads, so every request thread grew a team
    of its own; on a small machine those teams throttle each other and a 12-token query took
    longer than on one thread (docs/decisions.md). The lane keeps one small torch team of
    `threads` (the embedder gives it one: a two-thread team is throttled as soon as any other
    thread in the process has one), never waits behind an ingest batch, and embeds the queries
    that arrived together in one call. With ONNX Runtime (its own thread pool) it still batches
    and keeps queries off the ingest path.
    """

    def __init__(self, encode: Callable[[list[str]], npt.NDArray[np.float32]], threads: int):
        self._encode = encode
        self._inbox: queue.SimpleQueue[tuple[list[str], Future[npt.NDArray[np.float32]]] | None]
        self._inbox = queue.SimpleQueue()
        # Queries submitted and not answered yet: ingest waits while there are any.
        self._pending = 0
        self._idle = threading.Condition()
        self._closed = False
        self._thread = team_thread(self._run, threads, "embed-queries")

    def embed(self, texts: list[str], deadline: Deadline | None = None) -> npt.NDArray[np.float32]:
        """The texts' vectors; Unavailable when the lane is closed or the deadline passes
        first (the query is still embedded, and its answer dropped)."""
        done = self.submit(texts)
        timeout = None if deadline is None or not deadline.bounded else deadline.remaining_ms()
        try:
            return done.result(None if timeout is None else max(timeout, 0.0) / 1000.0)
        except FutureTimeout:
            raise Unavailable("the query was not embedded within the request's budget") from None

    def submit(self, texts: list[str]) -> Future[npt.NDArray[np.float32]]:
        """Queue the texts; Unavailable at once once the lane is closed."""
        done: Future[npt.NDArray[np.float32]] = Future()
        with self._idle:
            # Checked and queued under the lock close() takes: nothing is queued after the
            # stop, where no thread would ever answer it.
            if self._closed:
                raise Unavailable("the query embedder is closed (the service is stopping)")
            self._pending += 1
            self._inbox.put((texts, done))
        return done

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no query is waiting or being embedded, for at most `timeout_s`; False
        when queries were still there."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _answered(self, n: int) -> None:
        with self._idle:
            self._pending -= n
            if not self._pending:
                self._idle.notify_all()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after what is queued, and wait for the thread: one still inside ONNX Runtime
        or torch when the interpreter exits aborts the process ("terminate called without an
        active exception", seen at the end of `rag ingest`)."""
        with self._idle:
            if not self._closed:
                self._closed = True
                self._inbox.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._refuse_queued()

    def _refuse_queued(self) -> None:
        """Whatever was queued behind the stop is answered: refused, never left waiting."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._answered(1)
                item[1].set_exception(Unavailable("the query embedder is closed"))

    def _serve(self) -> None:
        while True:
            first = self._inbox.get()
            if first is None:
                return
            batch = [first]
            while True:  # whatever else is waiting goes in the same call
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._inbox.put(None)
                    break
                batch.append(item)
            texts = [t for item_texts, _ in batch for t in item_texts]
            try:
                vectors = self._encode(texts)
            except BaseException as exc:  # handed to every waiting caller
                self._answered(len(batch))
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            self._answered(len(batch))
            parts = split_rows(vectors, [len(item_texts) for item_texts, _ in batch])
            for (_, fut), part in zip(batch, parts, strict=True):
                fut.set_result(part)


def in_turns(
    texts: Sequence[str],
    encode: Callable[[list[str]], npt.NDArray[np.float32]],
    batch: int,
    lane: QueryLane,
    max_wait_s: float,
) -> npt.NDArray[np.float32]:
    """Embed a long list (an ingest batch) one model batch at a time, giving way to queries:
    before each batch, wait while the lane has queries to embed (at most `max_wait_s` a
    batch, so that a steady stream of queries slows ingest but cannot stop it). On a small
    machine the two would otherwise share the cores, and a query embedded beside an ingest
    batch takes several times as long.

    Texts go in batches of similar length, longest first, as sentence-transformers orders
    them itself, so the batches pad no more than one call over the whole list would."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    parts: list[npt.NDArray[np.float32]] = []
    for start in range(0, len(order), batch):
        lane.wait_idle(max_wait_s)
        parts.append(encode([texts[i] for i in order[start : start + batch]]))
    vectors = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    out = np.empty_like(vectors)
    out[np.array(order, dtype=np.int64)] = vectors
    return out
