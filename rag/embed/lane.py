"""The query lane: one long-lived thread that embeds search queries, several at a time."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt

from rag.embed.base import split_rows


class QueryLane:
    """One long-lived thread that embeds short requests (search queries), several at a time.

    Why not the caller's thread: torch runs its CPU kernels on an OpenMP team per calling
    thread, and the web server calls from a pool of threads, so every request thread grew a team
    of its own; on a small machine those teams throttle each other and a 12-token query took
    2-3x its single-thread time. The lane keeps one small torch team of `threads` (the
    embedder gives it one: a two-thread team is throttled as soon as any other thread in the
    process has one), never waits behind an ingest batch, and embeds the queries that arrived
    together in one call. With ONNX Runtime (its own thread pool) it still batches and keeps
    queries off the ingest path.
    """

    def __init__(self, encode: Callable[[list[str]], npt.NDArray[np.float32]], threads: int):
        self._encode = encode
        self._inbox: queue.SimpleQueue[tuple[list[str], Future[npt.NDArray[np.float32]]] | None]
        self._inbox = queue.SimpleQueue()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(threads, ready), name="embed-queries", daemon=True
        )
        import torch

        before = torch.get_num_threads()
        self._thread.start()
        ready.wait()
        # set_num_threads in the lane also moved the process-wide default; put it back (the
        # lane's own team keeps its size).
        torch.set_num_threads(before)

    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return self.submit(texts).result()

    def submit(self, texts: list[str]) -> Future[npt.NDArray[np.float32]]:
        done: Future[npt.NDArray[np.float32]] = Future()
        self._inbox.put((texts, done))
        return done

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after what is queued, and wait for the thread: one still inside ONNX Runtime
        or torch when the interpreter exits aborts the process ("terminate called without an
        active exception", seen at the end of `rag ingest`)."""
        self._inbox.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self, threads: int, ready: threading.Event) -> None:
        import torch

        torch.set_num_threads(threads)
        # torch sizes a thread's team lazily, from the process-wide default, on its first
        # parallel call: make that happen now, before the constructor puts the default back.
        torch.get_num_threads()
        ready.set()
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
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            parts = split_rows(vectors, [len(item_texts) for item_texts, _ in batch])
            for (_, fut), part in zip(batch, parts, strict=True):
                fut.set_result(part)
