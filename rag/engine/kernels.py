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

  // One work item per sequence: a block's KV heads lie next to each other ([Hkv, BS, D]), so
  // walking every head of a block together streams K and V block by block; the next block is
  // prefetched while this one is attended (the blocks are scattered: the hardware prefetcher
  // cannot guess the next one).
  const int64_t block_floats = Hkv * BS * D;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(G * BS), acc(H * D), m(H), l(H);
    float* s = scores.data();
    for (int64_t b = begin; b < end; ++b) {
      const int64_t len = lens[b];
      const float* qb = qp + b * H * D;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -1e30f);  // finite: the build allows fast math
      std::fill(l.begin(), l.end(), 0.0f);
      const int64_t nblocks = (len + BS - 1) / BS;
      for (int64_t j = 0; j < nblocks; ++j) {
        const float* kblock = kp + bt[b * MB + j] * block_floats;
        const float* vblock = vp + bt[b * MB + j] * block_floats;
        if (j + 1 < nblocks) {
          const float* kn = kp + bt[b * MB + j + 1] * block_floats;
          const float* vn = vp + bt[b * MB + j + 1] * block_floats;
          for (int64_t off = 0; off < block_floats; off += 16) {  // 64-byte lines
            __builtin_prefetch(kn + off);
            __builtin_prefetch(vn + off);
          }
        }
        const int64_t n = std::min(BS, len - j * BS);
        for (int64_t h = 0; h < Hkv; ++h) {
          const float* kb = kblock + h * BS * D;
          const float* vb = vblock + h * BS * D;
          const float* qh = qb + h * G * D;  // the G query heads of KV head h
          // Scores: each K row is loaded once and dotted with all G query heads.
          for (int64_t t = 0; t < n; ++t) {
            const float* kt = kb + t * D;
            for (int64_t g = 0; g < G; ++g) {
              const float* qg = qh + g * D;
              float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
              for (int64_t d = 0; d < D; ++d) dot += qg[d] * kt[d];
              s[g * BS + t] = dot * sc;
            }
          }
          // Online softmax per query head: rescale what was accumulated, add this block.
          for (int64_t g = 0; g < G; ++g) {
            float* sg = s + g * BS;
            const int64_t head = h * G + g;
            float block_max = -1e30f;
            for (int64_t t = 0; t < n; ++t) block_max = std::max(block_max, sg[t]);
            const float new_max = std::max(m[head], block_max);
            const float correction = std::exp(m[head] - new_max);  // 0 before the first block
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t t = 0; t < n; ++t) {
              sg[t] = std::exp(sg[t] - new_max);
              sum += sg[t];
            }
            float* a = acc.data() + head * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] *= correction;
            m[head] = new_max;
            l[head] = l[head] * correction + sum;
          }
          // Values: each V row is loaded once and added into all G accumulators.
          for (int64_t t = 0; t < n; ++t) {
            const float* vt = vb + t * D;
            for (int64_t g = 0; g < G; ++g) {
              const float p = s[g * BS + t];
              float* a = acc.data() + (h * G + g) * D;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) a[d] += p * vt[d];
            }
          }
        }
      }
      for (int64_t g = 0; g < H; ++g) {
        float* o = op + (b * H + g) * D;
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
            name="ragserve_paged_attention_v5",
            cpp_sources=[_SOURCE],
            functions=["paged_decode"],
            # -fopenmp: at::parallel_for is OpenMP inside ATen's headers (without it the loop
            # runs on one thread). The libgomp it links is the one torch has already loaded.
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"],
            extra_ldflags=["-fopenmp"],
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
