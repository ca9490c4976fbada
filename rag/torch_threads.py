"""Torch work that is not the engine's runs in a thread that ends with it.

torch runs its CPU kernels on an OpenMP team of the calling thread, and the team lives as long
as that thread. libgomp throttles every team of the process once it holds more OpenMP threads
than there are CPUs: between two kernels a worker no longer spins but sleeps, and each kernel
then pays a wake-up, as long as the small kernels of a ~100-token prefill chunk themselves on
a 2-core machine. A model loaded on the main thread, or an ingest batch embedded on a worker's
thread, left a team behind that slowed every later step of the engine, whose thread keeps the
one team that should last (`bench/ttft.py --contention` measures a fully cached prompt's first
token with and without such a team). So the one-off torch work of a service
(loading the embedder and the generator, embedding ingest batches) goes through
`in_passing_thread`, and its team goes with the thread. The query lane (rag.embed.lane) keeps
a one-thread team, which has no workers; the engine's step thread keeps a team of
`engine.threads` (by default the process's). Both start through `team_thread`.

Each thread sizes its team once, on its first parallel call, from the process-wide default
that `torch.set_num_threads` sets; `team_thread` sizes the new thread's team and puts the
default back, so that the threads started later (an ingest batch's) are not sized by it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(fn: Callable[[], T], name: str = "torch-work") -> T:
    """`fn()` in a new thread, waited for until the thread has ended: its result, or its
    exception raised here."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as pool:
        return pool.submit(fn).result()


def team_thread(
    target: Callable[[], object], threads: int | None, name: str,
    init: Callable[[], object] | None = None,
) -> threading.Thread:  # fmt: skip
    """Start a long-lived daemon thread running `target` whose torch team has `threads`
    threads (None: the process-wide default), and return it once the team is sized. `init`
    (in the new thread, while the default is `threads`): what else sizes its team on its
    own first call, a compiled extension's inline copy of torch's lazy start
    (rag.engine.kernels' `init_threads`)."""
    ready = threading.Event()

    def run() -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
            torch.get_num_threads()  # the team is sized now, before the default goes back
            if init is not None:
                init()
        ready.set()
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    if not threads:
        thread.start()
        return thread
    import torch

    # Read and put back from threads of their own: the caller's team is not touched, and what
    # a new thread is given is the default itself, whatever the caller's team is.
    before = in_passing_thread(torch.get_num_threads)
    thread.start()
    ready.wait()
    in_passing_thread(lambda: torch.set_num_threads(before))
    return thread


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
