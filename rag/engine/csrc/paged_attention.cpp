// Paged attention for decode steps: one new token per sequence attends over its context,
// read block by block where the KV cache holds it (no gather), with an online softmax.
//
// The work is split over (sequence, stretch of its context), flash-decoding style: with one
// or two sequences there would otherwise be one or two work items for all the cores. Each
// item keeps a running max, sum and weighted value per query head over its stretch; the
// stretches of a sequence are then merged, each rescaled by exp(its max - the overall max).
// A stretch is a fixed number of tokens (kStretchTokens), whatever else the step holds, so a
// sequence's attention sums in the same order alone or in any batch: a token decodes the
// same with and without speculative drafts beside it (8-bit activations would turn the last
// bit of a different order into a different rounding step, rag.engine.w8a8).
#include "kernels.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

namespace ragserve {

namespace {

constexpr int64_t kStretchTokens = 128;

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

// Attend query heads `qb` [H, D] over blocks [j0, j1) of one sequence; partial results per
// head: running max m[h], sum l[h], unnormalised output acc[h, D]. kD > 0 fixes the head size
// at compile time (64: SmolLM2; 128: larger Llamas): the loops over D unroll and a head's
// output stays in registers across a block's tokens instead of a load and store per token
// (which had cost half the kernel's time). kD = 0 takes D as given.
template <typename KV, int kD>
void attend_stretch(const float* qb, const KV* kp, const KV* vp, const int64_t* table,
                    int64_t len, int64_t j0, int64_t j1, int64_t H, int64_t Hkv, int64_t BS,
                    int64_t D_arg, float sc, float* m, float* l, float* acc, float* scores) {
  const int64_t D = kD > 0 ? kD : D_arg;
  const int64_t G = H / Hkv;
  const int64_t block_elems = Hkv * BS * D;
  std::fill(acc, acc + H * D, 0.0f);
  std::fill(m, m + H, -1e30f);  // finite: the build allows fast math
  std::fill(l, l + H, 0.0f);
  for (int64_t j = j0; j < j1; ++j) {
    const KV* kblock = kp + table[j] * block_elems;
    const KV* vblock = vp + table[j] * block_elems;
    if (j + 1 < j1) {  // the blocks are scattered: the hardware prefetcher cannot guess
      const char* kn = reinterpret_cast<const char*>(kp + table[j + 1] * block_elems);
      const char* vn = reinterpret_cast<const char*>(vp + table[j + 1] * block_elems);
      for (int64_t off = 0; off < block_elems * int64_t(sizeof(KV)); off += 64) {
        __builtin_prefetch(kn + off);
        __builtin_prefetch(vn + off);
      }
    }
    const int64_t n = std::min(BS, len - j * BS);
    for (int64_t h = 0; h < Hkv; ++h) {
      const KV* kb = kblock + h * BS * D;
      const KV* vb = vblock + h * BS * D;
      const float* qh = qb + h * G * D;  // the G query heads of KV head h
      // Scores: each K row is loaded once and dotted with all G query heads.
      for (int64_t t = 0; t < n; ++t) {
        const KV* kt = kb + t * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qh + g * D;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qg[d] * to_float(kt[d]);
          scores[g * BS + t] = dot * sc;
        }
      }
      // Online softmax per query head: rescale what was accumulated, add this block.
      for (int64_t g = 0; g < G; ++g) {
        float* sg = scores + g * BS;
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
        m[head] = new_max;
        l[head] = l[head] * correction + sum;
        // Values: the head's output, rescaled, gains each of the block's V rows.
        float* a = acc + head * D;
        if constexpr (kD > 0) {
          float r[kD];
#pragma omp simd
          for (int64_t d = 0; d < kD; ++d) r[d] = a[d] * correction;
          for (int64_t t = 0; t < n; ++t) {
            const float p = sg[t];
            const KV* vt = vb + t * kD;
#pragma omp simd
            for (int64_t d = 0; d < kD; ++d) r[d] += p * to_float(vt[d]);
          }
#pragma omp simd
          for (int64_t d = 0; d < kD; ++d) a[d] = r[d];
        } else {
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] *= correction;
          for (int64_t t = 0; t < n; ++t) {
            const float p = sg[t];
            const KV* vt = vb + t * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] += p * to_float(vt[d]);
          }
        }
      }
    }
  }
}

// The stretch with the head size fixed at compile time where it is a common one.
template <typename KV>
void attend(const float* qb, const KV* kp, const KV* vp, const int64_t* table, int64_t len,
            int64_t j0, int64_t j1, int64_t H, int64_t Hkv, int64_t BS, int64_t D, float sc,
            float* m, float* l, float* acc, float* scores) {
  if (D == 64) {
    attend_stretch<KV, 64>(qb, kp, vp, table, len, j0, j1, H, Hkv, BS, D, sc, m, l, acc, scores);
  } else if (D == 128) {
    attend_stretch<KV, 128>(qb, kp, vp, table, len, j0, j1, H, Hkv, BS, D, sc, m, l, acc, scores);
  } else {
    attend_stretch<KV, 0>(qb, kp, vp, table, len, j0, j1, H, Hkv, BS, D, sc, m, l, acc, scores);
  }
}

}  // namespace

PagedDecode::PagedDecode(const torch::Tensor& q, const torch::Tensor& k_cache,
                         const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                         const torch::Tensor& context_lens, double scale, float* out,
                         int64_t threads)
    : q_(q.data_ptr<float>()),
      k_(k_cache.data_ptr()),
      v_(v_cache.data_ptr()),
      bf16_(k_cache.scalar_type() == torch::kBFloat16),
      bt_(block_tables.data_ptr<int64_t>()),
      lens_(context_lens.data_ptr<int64_t>()),
      out_(out),
      B_(q.size(0)),
      H_(q.size(1)),
      D_(q.size(2)),
      Hkv_(k_cache.size(1)),
      BS_(k_cache.size(2)),
      MB_(block_tables.size(1)),
      sc_(static_cast<float>(scale)) {
  (void)threads;  // the split depends on each sequence's own length only (see above)
  stretch_ = std::max<int64_t>(1, kStretchTokens / BS_);
  first_.resize(B_ + 1, 0);
  for (int64_t b = 0; b < B_; ++b) {
    const int64_t nblocks = (lens_[b] + BS_ - 1) / BS_;
    first_[b + 1] = first_[b] + std::max<int64_t>(1, (nblocks + stretch_ - 1) / stretch_);
  }
  pm_.resize(first_[B_] * H_);
  pl_.resize(first_[B_] * H_);
  pacc_.resize(first_[B_] * H_ * D_);
}

void PagedDecode::run(int64_t item, float* scores) {
  const int64_t b = std::upper_bound(first_.begin(), first_.end(), item) - first_.begin() - 1;
  const int64_t s = item - first_[b];
  const int64_t nblocks = (lens_[b] + BS_ - 1) / BS_;
  const int64_t j0 = std::min(nblocks, s * stretch_), j1 = std::min(nblocks, (s + 1) * stretch_);
  float* m = pm_.data() + item * H_;
  float* l = pl_.data() + item * H_;
  float* acc = pacc_.data() + item * H_ * D_;
  const float* qb = q_ + b * H_ * D_;
  const int64_t* table = bt_ + b * MB_;
  if (bf16_) {
    attend<c10::BFloat16>(qb, static_cast<const c10::BFloat16*>(k_),
                          static_cast<const c10::BFloat16*>(v_), table, lens_[b], j0, j1, H_, Hkv_,
                          BS_, D_, sc_, m, l, acc, scores);
  } else {
    attend<float>(qb, static_cast<const float*>(k_), static_cast<const float*>(v_), table,
                  lens_[b], j0, j1, H_, Hkv_, BS_, D_, sc_, m, l, acc, scores);
  }
}

void PagedDecode::merge(int64_t bh) {
  const int64_t b = bh / H_, h = bh % H_;
  float mx = -1e30f;
  for (int64_t item = first_[b]; item < first_[b + 1]; ++item)
    mx = std::max(mx, pm_[item * H_ + h]);
  float total = 0.0f;
  float* o = out_ + bh * D_;
  std::fill(o, o + D_, 0.0f);
  for (int64_t item = first_[b]; item < first_[b + 1]; ++item) {
    const float w = std::exp(pm_[item * H_ + h] - mx);
    total += pl_[item * H_ + h] * w;
    const float* a = pacc_.data() + (item * H_ + h) * D_;
    for (int64_t d = 0; d < D_; ++d) o[d] += a[d] * w;
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int64_t d = 0; d < D_; ++d) o[d] *= inv;
}

void paged_decode_into(const torch::Tensor& q, const torch::Tensor& k_cache,
                       const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& context_lens, double scale, float* out) {
  PagedDecode attn(q, k_cache, v_cache, block_tables, context_lens, scale, out,
                   at::get_num_threads());
  at::parallel_for(0, attn.items(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(attn.scratch());
    for (int64_t item = begin; item < end; ++item) attn.run(item, scores.data());
  });
  for (int64_t bh = 0; bh < attn.heads(); ++bh) attn.merge(bh);
}

}  // namespace ragserve

// q [B, H, D] float32; k_cache, v_cache [NB, Hkv, BS, D] float32 or bfloat16; block_tables
// [B, MB] (int64); context_lens [B] (int64, positions 0..len-1 are attended). Returns
// [B, H, D] float32. Query heads g*G .. g*G+G-1 share KV head g (transformers' repeat_kv).
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens,
                           double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4, "bad ranks");
  TORCH_CHECK(q.scalar_type() == torch::kFloat32, "float32 queries only");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() &&
                  (k_cache.scalar_type() == torch::kFloat32 ||
                   k_cache.scalar_type() == torch::kBFloat16),
              "a float32 or bfloat16 KV cache only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              block_tables.is_contiguous() && context_lens.is_contiguous(), "contiguous only");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0 && k_cache.size(3) == q.size(2),
              "head shapes do not match");
  auto out = torch::empty_like(q);
  ragserve::paged_decode_into(q, k_cache, v_cache, block_tables, context_lens, scale,
                              out.data_ptr<float>());
  return out;
}
