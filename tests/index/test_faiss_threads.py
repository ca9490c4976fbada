"""A faiss search of a request's few queries runs on the calling thread alone; big batches
and the caller's own thread count are left as they were."""

from __future__ import annotations

import threading

import faiss
import numpy as np
import pytest

from rag.index import Knobs, build_index


@pytest.mark.parametrize("kind", ["faiss_flat", "faiss_hnsw", "faiss_ivf"])
def test_few_queries_run_without_an_openmp_team(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    params = {
        "faiss_flat": {"use_gpu": False},
        "faiss_ivf": {"use_gpu": False, "min_train": 500},
    }.get(kind, {})
    index = build_index(kind, 32, params)
    index.add(np.arange(2000, dtype=np.int64), vectors)

    seen: list[int] = []
    real_set = faiss.omp_set_num_threads

    def recording_set(n: int) -> None:
        seen.append(n)
        real_set(n)

    def run() -> None:
        real_set(2)  # this thread's own setting, as a build would want it
        monkeypatch.setattr(faiss, "omp_set_num_threads", recording_set)
        one = index.search(vectors[:1], Knobs(k=5))
        assert int(one[0].ids[0]) == 0
        assert seen == [1, 2]  # one thread for the search, then the caller's count again
        assert faiss.omp_get_max_threads() == 2
        seen.clear()
        many = index.search(vectors[:64], Knobs(k=5))
        assert len(many) == 64 and seen == []  # a batch keeps its team

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            run()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=guarded)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
