"""The real embedder: queries through the query lane (ONNX Runtime, or torch), batches on the
caller's thread with torch; all give the same vectors (int8 queries close to them:
test_embed_formats.py)."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from rag.embed import QueryLane, SentenceTransformerEmbedder
from rag.embed.base import bounded
from rag.embed.sentence import PIECE_CHARS, PIECES_PER_CALL


def test_queries_and_batches_give_the_same_vectors(minilm: SentenceTransformerEmbedder) -> None:
    texts = [f"how do I read file number {i} in python" for i in range(12)]
    batch = minilm.embed(texts)  # 12 texts: the caller's thread
    one_by_one = np.vstack([minilm.embed([t]) for t in texts])  # the query lane
    assert batch.shape == (12, minilm.dim)
    # The lane runs int8 by default: close to torch's float32, not equal.
    assert np.sum(one_by_one * batch, axis=1).min() >= 0.97
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert minilm._onnx is not None  # queries went through ONNX Runtime, batches through torch
    assert minilm._onnx.fused  # on ONNX Runtime's fused attention and layer-norm kernels
    assert minilm._onnx.format == "int8"


def test_the_torch_query_backend_gives_the_same_vectors(
    minilm: SentenceTransformerEmbedder,
) -> None:
    plain = SentenceTransformerEmbedder(device="cpu", query_backend="torch")
    texts = ["what is a closure in perl", "rome"]
    for t in texts:
        np.testing.assert_allclose(plain.embed([t]), minilm._encode([t]), atol=1e-5)
    assert plain._onnx is None and plain.query_format_used == "torch"
    plain.close()


def test_concurrent_queries_each_get_their_own_vector(
    minilm: SentenceTransformerEmbedder,
) -> None:
    texts = [f"question {i}: where is passage {i * 7}?" for i in range(24)]
    expected = {t: minilm.embed([t])[0] for t in texts}
    got: dict[str, np.ndarray] = {}
    barrier = threading.Barrier(len(texts))

    def ask(t: str) -> None:
        barrier.wait()
        got[t] = minilm.embed([t])[0]

    threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in texts:
        np.testing.assert_allclose(got[t], expected[t], atol=1e-5)


def test_the_lane_batches_what_arrives_together_and_passes_errors_on() -> None:
    calls: list[list[str]] = []
    started, gate = threading.Event(), threading.Event()

    def encode(texts: list[str]) -> np.ndarray:
        if texts == ["block"]:  # holds the lane while the others queue up behind it
            started.set()
            gate.wait(10)
        calls.append(texts)
        if "boom" in texts:
            raise ValueError("bad text")
        return np.array([[float(len(t))] for t in texts], dtype=np.float32)

    lane = QueryLane(encode, threads=1)
    results: dict[str, float] = {}

    def ask(t: str) -> None:
        results[t] = float(lane.embed([t])[0, 0])

    blocker = threading.Thread(target=ask, args=("block",))
    blocker.start()
    assert started.wait(10)
    threads = [threading.Thread(target=ask, args=("x" * n,)) for n in range(1, 6)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 10
    while lane._inbox.qsize() < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for th in [blocker, *threads]:
        th.join(10)
    assert results == {"block": 5.0, **{"x" * n: float(n) for n in range(1, 6)}}
    assert calls[0] == ["block"]
    assert sorted(calls[1]) == ["x" * n for n in range(1, 6)]  # the waiting five, one call
    with pytest.raises(ValueError, match="bad text"):
        lane.embed(["boom"])
    assert lane.embed(["ok"])[0, 0] == 2.0  # the lane survived
    lane.close()


def test_the_lane_runs_its_own_thread_count_and_leaves_the_process_default() -> None:
    import torch

    before = torch.get_num_threads()
    lane = QueryLane(lambda texts: np.array([[float(torch.get_num_threads())]] * len(texts)), 1)
    assert lane.embed(["q"])[0, 0] == 1.0  # the lane's own team: one thread
    assert torch.get_num_threads() == before  # everyone else keeps theirs
    seen: list[int] = []
    fresh = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert seen == [before]  # and threads started later too
    lane.close()


def test_the_onnx_encoder_declines_what_it_cannot_export(
    minilm: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag.embed import OnnxQueryEncoder

    # Not transformer + mean pooling + normalize: torch it is.
    assert OnnxQueryEncoder.build([minilm._model[0]], threads=1) is None

    # The exporter fails: logged, and torch it is.
    import torch

    def broken_export(*args: object, **kwargs: object) -> None:
        raise RuntimeError("exporter broke")

    monkeypatch.setattr(torch.onnx, "export", broken_export)
    assert OnnxQueryEncoder.build(minilm._model, threads=1) is None


def test_the_onnx_encoder_runs_unfused_when_fusion_does_not_apply(
    minilm: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rag.embed.onnx
    from rag.embed import OnnxQueryEncoder

    monkeypatch.setattr(rag.embed.onnx, "_fuse", lambda graph, config: None)
    plain = OnnxQueryEncoder.build(minilm._model, threads=1)
    assert plain is not None and not plain.fused
    texts = ["what is a closure in perl", "the longest river in europe"]
    np.testing.assert_allclose(plain(texts), minilm._encode(texts), atol=1e-5)  # torch


def test_a_fused_graph_that_disagrees_is_not_used(
    minilm: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy

    import torch

    import rag.embed.onnx
    from rag.embed.onnx import OnnxQueryEncoder, _export

    # A "fused" graph from other weights: its vectors are not the model's.
    other = copy.deepcopy(minilm._model[0].auto_model)
    with torch.no_grad():
        for p in other.encoder.layer[0].parameters():
            p.add_(torch.randn_like(p) * 0.5)
    wrong = _export(other, minilm._model.tokenizer)
    monkeypatch.setattr(rag.embed.onnx, "_fuse", lambda graph, config: wrong)
    encoder = OnnxQueryEncoder.build(minilm._model, threads=1)
    assert encoder is not None and not encoder.fused
    texts = ["what is a closure in perl"]
    np.testing.assert_allclose(encoder(texts), minilm._encode(texts), atol=1e-5)


def test_ingest_gives_way_while_the_lane_has_queries() -> None:
    """On a small machine an ingest batch and a query share the cores: ingest embeds one model
    batch at a time and, before each, waits while queries are in the lane."""
    from rag.embed.lane import in_turns

    events: list[str] = []
    query_started, release = threading.Event(), threading.Event()

    def encode_query(texts: list[str]) -> np.ndarray:
        events.append("query")
        query_started.set()
        release.wait(10)
        return np.zeros((len(texts), 2), np.float32)

    def encode_batch(texts: list[str]) -> np.ndarray:
        events.append(f"ingest {len(texts)}")
        return np.array([[len(t), 0] for t in texts], np.float32)

    lane = QueryLane(encode_query, threads=1)
    try:
        pending = lane.submit(["a question"])
        assert query_started.wait(10) and lane.busy
        texts = ["x" * n for n in (3, 9, 1, 7, 5)]
        out: list[np.ndarray] = []
        ingest = threading.Thread(
            target=lambda: out.append(in_turns(texts, encode_batch, 2, lane, 30))
        )
        ingest.start()
        ingest.join(0.3)
        assert events == ["query"]  # the first ingest batch waits for the query
        release.set()
        pending.result(10)
        ingest.join(10)
        assert events == ["query", "ingest 2", "ingest 2", "ingest 1"]
        # Batched longest first, handed back in the caller's order.
        assert out[0][:, 0].tolist() == [3, 9, 1, 7, 5]
        assert not lane.busy and lane.wait_idle(0)
    finally:
        release.set()
        lane.close()


def test_a_steady_stream_of_queries_slows_ingest_but_cannot_stop_it() -> None:
    from rag.embed.lane import in_turns

    release = threading.Event()
    lane = QueryLane(lambda texts: (release.wait(10), np.zeros((len(texts), 1), np.float32))[1], 1)
    try:
        stuck = lane.submit(["a query that never ends"])
        batches: list[int] = []

        def encode_batch(texts: list[str]) -> np.ndarray:
            batches.append(len(texts))
            return np.ones((len(texts), 1), np.float32)

        vectors = in_turns(["a", "b", "c"], encode_batch, 2, lane, max_wait_s=0.01)
        assert batches == [2, 1] and vectors.shape == (3, 1) and lane.busy
    finally:
        release.set()
        stuck.result(10)
        lane.close()


def test_a_closed_lane_refuses_at_once_and_a_wait_keeps_the_deadline() -> None:
    """Issue 31: once closed (the server's shutdown), submit queued and its future never
    resolved: every later search waited forever."""
    from concurrent.futures import Future

    from rag.deadline import Deadline
    from rag.errors import Unavailable

    release = threading.Event()
    lane = QueryLane(lambda texts: (release.wait(10), np.zeros((len(texts), 1), np.float32))[1], 1)
    stuck: Future[np.ndarray] = lane.submit(["busy"])  # the lane is inside the encoder
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="budget"):
        lane.embed(["late"], Deadline.after_ms(100))
    assert time.monotonic() - t0 < 2
    lane.close(timeout_s=0)  # queued: "late"; still encoding: "busy"
    with pytest.raises(Unavailable, match="closed"):
        lane.submit(["after"])
    release.set()
    assert stuck.result(timeout=5).shape == (1, 1)
    lane.close()
    with pytest.raises(Unavailable, match="closed"):
        lane.embed(["after"])


def test_token_spans_in_pieces_are_the_whole_texts_tokens(
    minilm: SentenceTransformerEmbedder,
) -> None:
    rng = random.Random(7)
    words = ["the", "Ålesund", "river's", "1,204", "naïve", "東京", "[x]", "e.g.", "well-known"]
    seps = [" ", "\n", "  ", "\t", "\n\n"]
    text = "".join(rng.choice(words) + rng.choice(seps) for _ in range(30_000))
    assert len(text) > 4 * PIECE_CHARS
    tokenizer = minilm._tokenizer
    whole = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    assert minilm.token_spans(text) == [tuple(s) for s in whole["offset_mapping"]]


def test_token_spans_never_tokenize_more_than_a_piece_at_once(
    minilm: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A megabyte of one-character tokens: one call would turn a million offsets into Python
    # objects while holding the GIL, stopping the event loop of the API it runs in.
    read: list[int] = []
    tokenizer = minilm._tokenizer

    class Counting:
        def __call__(self, texts: list[str], **kwargs: object) -> object:
            read.append(sum(len(t) for t in texts))
            return tokenizer(texts, **kwargs)

    monkeypatch.setattr(minilm, "_tokenizer", Counting())
    text = "[" * (1 << 20)
    spans = minilm.token_spans(text)
    assert len(spans) == len(text) and spans[-1] == (len(text) - 1, len(text))
    assert max(read) <= PIECES_PER_CALL * PIECE_CHARS and len(read) > 10


def test_bounded_pieces_cut_at_spaces_and_cover_the_text() -> None:
    text = ("word " * 10 + "x" * 50) * 20
    for size in (7, 16, 64):
        pieces = bounded(text, 0, len(text), size)
        assert pieces[0][0] == 0 and pieces[-1][1] == len(text)
        assert all(a < b <= a + size for a, b in pieces)
        assert all(pieces[k][1] == pieces[k + 1][0] for k in range(len(pieces) - 1))
    # where the second half of a piece has a space, the piece ends at it
    assert all(text[b] == " " or "x" * 8 in text[b - 8 : b]
               for _, b in bounded(text, 0, len(text), 16)[:-1])  # fmt: skip
    assert bounded("", 0, 0, 16) == [(0, 0)]
