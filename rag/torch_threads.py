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
a one-thread team, which has no workers.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(fn: Callable[[], T], name: str = "torch-work") -> T:
    """`fn()` in a new thread, waited for until the thread has ended: its result, or its
    exception raised here."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as pool:
        return pool.submit(fn).result()
