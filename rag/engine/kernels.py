"""The engine's CPU kernels (C++ in rag/engine/csrc), compiled on first use.

- `paged_decode`: decode attention. In torch a decode step would gather every sequence's
  blocks into one tensor (`index_select`) and attend them with thousands of tiny matmuls; the
  kernel reads each block where it lies, once, with an online softmax, on torch's own thread
  pool (one work item per sequence, the query heads of a GQA group together).
- `qgemm`: x @ W^T with W in 4-bit (asymmetric, GGUF's Q4_1 shape) or 8-bit (symmetric)
  groups, dequantized in registers and multiplied in float32. Decode reads every weight once
  a step, so its time is the weights' bytes: 4 bits read an eighth of float32's.
- `q8_rows`: rows of an 8-bit table (the embedding tied to the output matrix).
- `decode_layers`: every decoder layer of a decode step in one call (rag.engine.model's
  computation for steps of one token a sequence with int weights), instead of thirty layers of
  small torch ops.

They are compiled with torch's C++ extension loader the first time an engine starts on CPU
(tens of seconds, then cached under torch's extensions folder; `make setup` does it ahead).
With no compiler, or any failure, `kernels()` returns None and the engine keeps torch's own
ops, which compute the same thing (slower).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("module.cpp", "paged_attention.cpp", "qgemm.cpp", "decode.cpp", "i8gemm.cpp")
# Bump when a source changes: the extensions folder caches builds by name. The build is
# -march=native, so the name carries the CPU's vector class too (AVX2, AVX512, ...): a cache
# carried to another CPU builds anew instead of loading instructions it lacks.
NAME = f"ragserve_engine_kernels_v5_{torch.backends.cpu.get_cpu_capability().lower()}"

PagedDecode = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def kernels() -> Any | None:
    """The compiled module (paged_decode, qgemm, q8_rows), or None where it cannot be built."""
    with _lock:
        if "module" not in _loaded:
            _loaded["module"] = _build()
        return _loaded["module"]


def paged_decode_kernel() -> PagedDecode | None:
    """The decode-attention kernel, or None (the torch path is used)."""
    module = kernels()
    return None if module is None else module.paged_decode  # type: ignore[no-any-return]


def _build() -> Any | None:
    try:
        from torch.utils.cpp_extension import load

        module = load(
            name=NAME,
            sources=[str(CSRC / s) for s in SOURCES],
            # -fopenmp: at::parallel_for is OpenMP inside ATen's headers (without it the loop
            # runs on one thread). The libgomp it links is the one torch has already loaded.
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no headers: the torch path still works
        log.warning("engine kernels unavailable (%s); using the torch path", exc)
        return None
    log.info("engine kernels loaded")
    return module


if __name__ == "__main__":  # `python -m rag.engine.kernels`: build now (make setup does)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kernels()  # a failed build is logged, not fatal: the torch path remains
