"""A CPU paged-attention kernel for decode steps, compiled on first use.

A decode step attends one new token per sequence over that sequence's paged context. In
torch this needs the context's blocks gathered into one tensor first (`index_select`), then
thousands of tiny matmuls, one per (sequence, block, KV head): the cache is read three times
and the matmul overhead dominates. The kernel below reads each block where it lies, once,
with an online softmax (running max and sum, rescaled per block), on torch's own thread
pool: one work item per (sequence, KV head), the query heads of a GQA group together.

It is compiled with torch's C++ extension loader the first time an engine starts on CPU
(tens of seconds, then cached under torch's extensions folder). With no compiler, or any
failure, `paged_decode_kernel()` returns None and the engine keeps its torch path, which
computes the same thing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

// q [B, H, D]; k_cache, v_cache [NB, Hkv, BS, D]; block_tables [B, MB] (int64);
// context_lens [B] (int64, positions 0..len-1 are attended). Returns [B, H, D].
// Query heads g*G .. g*G+G-1 share KV head g (the layout transformers' repeat_kv assumes).
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens,
                           double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4, "bad ranks");
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32 &&
              v_cache.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              block_tables.is_contiguous() && context_lens.is_contiguous(), "contiguous only");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = k_cache.size(1), BS = k_cache.size(2);
  const int64_t G = H / Hkv, MB = block_tables.size(1);
  TORCH_CHECK(H % Hkv == 0 && k_cache.size(3) == D, "head shapes do not match");
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);

  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(BS), acc(G * D), m(G), l(G);
    float* s = scores.data();
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / Hkv, h = w % Hkv;
      const int64_t len = lens[b];
      const float* qh = qp + (b * H + h * G) * D;  // G query heads, D each
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -1e30f);  // finite: the build allows fast math
      std::fill(l.begin(), l.end(), 0.0f);
      const int64_t nblocks = (len + BS - 1) / BS;
      for (int64_t j = 0; j < nblocks; ++j) {
        const int64_t block = bt[b * MB + j];
        const float* kb = kp + (block * Hkv + h) * BS * D;
        const float* vb = vp + (block * Hkv + h) * BS * D;
        const int64_t n = std::min(BS, len - j * BS);
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qh + g * D;
          float block_max = -1e30f;
          for (int64_t t = 0; t < n; ++t) {
            const float* kt = kb + t * D;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qg[d] * kt[d];
            s[t] = dot * sc;
            block_max = std::max(block_max, s[t]);
          }
          const float new_max = std::max(m[g], block_max);
          const float correction = std::exp(m[g] - new_max);  // 0 before the first block
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = 0; t < n; ++t) {
            s[t] = std::exp(s[t] - new_max);  // vectorised (libmvec) under fast math
            sum += s[t];
          }
          float* a = acc.data() + g * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] *= correction;
          for (int64_t t = 0; t < n; ++t) {
            const float p = s[t];
            const float* vt = vb + t * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] += p * vt[d];
          }
          m[g] = new_max;
          l[g] = l[g] * correction + sum;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* o = op + (b * H + h * G + g) * D;
        const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
        for (int64_t d = 0; d < D; ++d) o[d] = acc[g * D + d] * inv;
      }
    }
  });
  return out;
}
"""

PagedDecode = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def paged_decode_kernel() -> PagedDecode | None:
    """The compiled kernel, or None where it cannot be built (the torch path is used)."""
    with _lock:
        if "fn" not in _loaded:
            _loaded["fn"] = _build()
        return _loaded["fn"]  # type: ignore[no-any-return]


def _build() -> PagedDecode | None:
    try:
        from torch.utils.cpp_extension import load_inline

        module = load_inline(
            name="ragserve_paged_attention_v2",
            cpp_sources=[_SOURCE],
            functions=["paged_decode"],
            extra_cflags=["-O3", "-march=native", "-fopenmp-simd", "-ffast-math"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no headers: the torch path still works
        log.warning("paged-attention kernel unavailable (%s); using the torch path", exc)
        return None
    log.info("paged-attention kernel loaded")
    return module.paged_decode  # type: ignore[no-any-return]


if __name__ == "__main__":  # `python -m rag.engine.kernels`: build now (make setup does)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    paged_decode_kernel()  # a failed build is logged, not fatal: the torch path remains
