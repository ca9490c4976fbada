"""Search queries through ONNX Runtime: the loaded model exported in memory, then fused, and
in int8 unless asked otherwise (rag.embed.quantize)."""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

import numpy as np
import numpy.typing as npt

import rag.embed.quantize as quantize

log = logging.getLogger(__name__)

# The query formats `build` makes; "auto" picks AUTO_FORMAT.
FORMATS = ("float32", "int8")
# The fastest format whose docfaq nDCG@10 is at least 0.99x float32's, over the same float32
# document vectors (bench/quality.py, its query formats; the figures that chose int8, and the
# OpenVINO formats it beat, are in docs/decisions.md).
AUTO_FORMAT = "int8"

# ONNX Runtime's session option that lets its workers spin between runs ("0": they sleep).
SPINNING = "session.intra_op.allow_spinning"

# torch's exporter keeps its state in module globals: two exports at once (the lane building
# its encoder while a benchmark builds another) fail with "in_onnx_export must be False".
_EXPORTING = threading.Lock()


class OnnxQueryEncoder:
    """The same model as ONNX Runtime runs it: faster than torch on a one-query batch, same
    vectors to 1e-6 in float32; int8 faster again, vectors at cosine >= 0.97 of float32's
    (checked at build). bench/quality.py times the formats one query at a time.

    Built in memory from the loaded model (torch's exporter, then ONNX Runtime's transformer
    fusions, then int8 quantization: seconds at start, on the query lane; no file to cache or go
    stale), for models that are a transformer, mean pooling and normalisation, as the bundled
    one is. `None` from `build` means: use torch. An int8 graph that cannot be made, or whose
    vectors stray, leaves the float32 one in use (logged).
    """

    def __init__(
        self, session: Any, tokenizer: Any, max_length: int, fused: bool, fmt: str = "float32"
    ) -> None:
        self.fused = fused  # running ONNX Runtime's fused transformer kernels
        self.format = fmt  # "float32" or "int8": the weights this session runs
        self._session = session
        self._tokenizer = tokenizer
        self._max_length = max_length
        self._inputs = [i.name for i in session.get_inputs()]

    @classmethod
    def build(
        cls, model: Any, threads: int, fmt: str = "float32", spinning: bool = False
    ) -> OnnxQueryEncoder | None:
        import onnxruntime as ort

        names = [type(m).__name__ for m in model]
        pooling = model[1].get_config_dict().get("pooling_mode") if len(names) > 1 else None
        if names != ["Transformer", "Pooling", "Normalize"] or pooling != "mean":
            log.info("query encoder: torch (no ONNX path for modules %s)", names)
            return None
        if fmt not in FORMATS:
            raise ValueError(f"query format {fmt!r} is not one of {FORMATS}")
        try:
            tokenizer = model.tokenizer
            sample = dict(tokenizer(["a sample query"], return_tensors="np"))
            graph = _export(model[0].auto_model, tokenizer)
            fused = _fuse(graph, model[0].auto_model.config)
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # ONNX Runtime's workers spin after each run, waiting for the next: after a query
            # one kept a core busy into the prefill that follows it (the engine's step wants
            # both cores; `bench/ttft.py --contention`). Asleep instead, a query takes no longer.
            # (`spinning`: runtime's default, for benchmarks that compare.)
            options.add_session_config_entry(SPINNING, "1" if spinning else "0")
            session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
            used_fused = False
            if fused is not None:
                # The fused graph must give the plain graph's vectors, or it is not used.
                faster = ort.InferenceSession(fused, options, providers=["CPUExecutionProvider"])
                feed = {i.name: sample[i.name].astype(np.int64) for i in session.get_inputs()}
                (a,), (b,) = session.run(None, feed), faster.run(None, feed)
                if float(np.sum(a * b)) > 1 - 1e-5:
                    session, used_fused, graph = faster, True, fused
                else:
                    log.warning("query encoder: fused graph disagrees; using the plain one")
        except Exception:
            log.warning("query encoder: ONNX export failed, using torch", exc_info=True)
            return None
        encoder = cls(session, tokenizer, int(model.max_seq_length), used_fused)
        if fmt == "int8":
            encoder = _int8_of(encoder, graph, options) or encoder
        # ONNX Runtime grows its memory arena the first time an input is longer than any
        # before it, which made the first long query after start take several times its time
        # (docs/decisions.md). One query of the longest kind now sizes it.
        encoder(["warm " * encoder._max_length])
        log.info("query encoder: ONNX Runtime %s%s", encoder.format, " (fused)" * used_fused)
        return encoder

    def __call__(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if self.format == "int8" and len(texts) > 1:
            # Dynamic quantization takes each activation's scale from the whole batch, padding
            # included: a query batched with others got a vector (cosine ~0.99) unlike its
            # own. One at a time, a query's vector never depends on who else is asking.
            return np.concatenate([self._run([t]) for t in texts])
        return self._run(texts)

    def _run(self, texts: list[str]) -> npt.NDArray[np.float32]:
        enc = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self._max_length, return_tensors="np"
        )
        feed = {name: enc[name].astype(np.int64) for name in self._inputs}
        (vectors,) = self._session.run(None, feed)
        return np.ascontiguousarray(vectors, dtype=np.float32)


def _int8_of(f32: OnnxQueryEncoder, graph: bytes, options: Any) -> OnnxQueryEncoder | None:
    """The int8 twin of a float32 encoder, or None (logged) when it cannot be made or its
    vectors are not close enough to float32's on the sample texts."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(
            quantize.quantize_int8(graph), options, providers=["CPUExecutionProvider"]
        )
        int8 = OnnxQueryEncoder(session, f32._tokenizer, f32._max_length, f32.fused, "int8")
        close = quantize.agreement(int8(quantize.SAMPLES), f32(quantize.SAMPLES))
    except Exception:
        log.warning("query encoder: int8 quantization failed, using float32", exc_info=True)
        return None
    if close < quantize.MIN_COSINE:
        log.warning(
            "query encoder: int8 vectors at cosine %.3f of float32's (< %.2f); using float32",
            close,
            quantize.MIN_COSINE,
        )
        return None
    return int8


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
    buf: Any = io.BytesIO()  # torch's stubs name only paths; it writes file objects too
    with _EXPORTING, torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
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
    and skip + layer norm each become one fused kernel: faster at every query length
    (docs/decisions.md), the same vectors to 1e-6. None when it does not apply to this model."""
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
