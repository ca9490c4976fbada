"""int8 query encoders: ONNX Runtime's dynamic quantization of the (fused) float32 graph.

Weights become int8, one scale per output channel; activations are quantized per call from
their own range (no calibration set). bench/quality.py measures what it costs on docfaq (the
query formats: nDCG@10 against float32 queries over the same float32 document vectors, and
the time of one query at a time); the figures that chose it are in docs/decisions.md. One
scale per tensor instead was as fast and lost more, so it is not offered.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

# An int8 graph is used only when its vectors for the sample texts below are this close to
# float32's (cosine, every text): docfaq's 322 queries came out at >= 0.981.
MIN_COSINE = 0.97

# Texts the int8 graph is checked on: questions and statements of a few lengths, code-ish and
# plain (the model's own vocabulary; no data set is read).
SAMPLES = [
    "how do I read a file line by line in python",
    "What is the difference between a list and a tuple?",
    "perl regular expression to match a date",
    "The ferry to the island leaves from pier four every morning at nine, except on Sundays "
    "when the first boat leaves at ten and the harbour office stays closed.",
    "tar: Removing leading '/' from member names",
    "def main(argv: list[str] | None = None) -> int: parse the arguments and run the command",
]


def quantize_int8(graph: bytes) -> bytes:
    """The graph with its MatMul and Attention weights in int8 (per channel), in memory: the
    quantizer wants a file to write, which lives in a temporary folder for the call only."""
    import onnx

    model = onnx.load_from_string(graph)
    # The fused graph uses ONNX Runtime's own operators (Attention, SkipLayerNormalization)
    # without declaring their domain, and the quantizer's shape inference refuses it.
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    # The quantizer reports every tensor through the root logger at INFO (hundreds of
    # lines); a filter on the root logger drops those records only (records of named loggers
    # reach the handlers without passing it).
    root = logging.getLogger()
    quiet = _FromOnnxRuntime()
    root.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory(prefix="rag-int8-") as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _quantize_into(model, os.path.join(tmp, "int8.onnx"))
    finally:
        root.removeFilter(quiet)


def _quantize_into(model: Any, out: str) -> bytes:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        model,
        out,
        per_channel=True,
        weight_type=QuantType.QInt8,
        # Shape inference cannot type the outputs of ONNX Runtime's fused operators; they
        # are all float32.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    with open(out, "rb") as f:
        return f.read()


class _FromOnnxRuntime(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname


def agreement(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """The lowest cosine between matching rows of two arrays of unit vectors."""
    return float(np.min(np.sum(a * b, axis=1)))
