"""rag.torch_threads: torch work in a thread that ends with it leaves no OpenMP team behind; a
lasting thread keeps the team it was given, and the default of the threads after it is left
as it was (through the engine's compiled kernels: tests/engine/test_engine_smollm.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from rag.torch_threads import in_passing_thread, team_thread


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


def _sizes_in(threads: int) -> list[int]:
    """The team size a team thread sees before and after a parallel kernel, and how many
    workers of its team showed up beside it."""
    seen: list[int] = []
    release = threading.Event()
    before = _tasks()

    def run() -> None:
        seen.append(torch.get_num_threads())
        _parallel_kernel()
        seen.append(torch.get_num_threads())
        # Its team's workers, once the passing threads team_thread used have gone.
        own = str(threading.get_native_id())
        seen.append(len(_settled(before | {own}, timeout_s=2.0) - before - {own}))
        release.set()

    thread = team_thread(run, threads, "team-test")
    release.wait(30)
    thread.join(30)
    return seen


def _default() -> int:
    """The team a new thread is given (the process-wide default, whatever this thread's is)."""
    return in_passing_thread(torch.get_num_threads)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_team_thread_keeps_its_size_and_leaves_the_default_as_it_was() -> None:
    default = _default()
    mine = torch.get_num_threads()
    assert _sizes_in(1) == [1, 1, 0]  # no worker beside it
    # Threads started after it are sized by the default, not by it; the caller is untouched.
    assert _default() == default
    assert torch.get_num_threads() == mine
