"""rag.torch_threads: torch work in a thread that ends with it leaves no OpenMP team behind."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from rag.torch_threads import in_passing_thread


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _parallel_kernel() -> int:
    torch.ones(1 << 22).add_(1)  # large enough for torch to split it across its team
    return threading.get_native_id()


def _settled(expected: set[str], timeout_s: float = 10.0) -> set[str]:
    """The process's threads once only `expected` ones are left, or as they are at timeout
    (a finished team's workers exit just after their thread does)."""
    deadline = time.monotonic() + timeout_s
    while (now := _tasks()) - expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def test_the_result_and_the_error_come_back_to_the_caller() -> None:
    assert in_passing_thread(lambda: 6 * 7) == 42
    assert in_passing_thread(threading.get_native_id) != threading.get_native_id()

    def fail() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        in_passing_thread(fail)


@pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or torch.get_num_threads() < 2,
    reason="counts the process's threads in /proc; needs a torch team of two or more",
)
def test_a_passing_threads_torch_team_ends_with_it_and_a_lasting_threads_does_not() -> None:
    before = _tasks()
    in_passing_thread(_parallel_kernel)
    assert not _settled(before) - before  # the thread and its team's workers are gone

    # The same kernel on a thread that lasts keeps its team's workers (what the engine's
    # step thread must not find beside it).
    release = threading.Event()
    native: list[int] = []

    def lasting() -> None:
        native.append(_parallel_kernel())
        release.wait()

    holder = threading.Thread(target=lasting, daemon=True)
    holder.start()
    try:
        while not native:
            time.sleep(0.01)
        workers = _tasks() - before - {str(native[0])}
        assert workers, "a lasting thread's team had no worker to count"
    finally:
        release.set()
        holder.join()
    assert not _settled(before) - before
