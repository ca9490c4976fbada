// A whole decode step's decoder layers in one call: for each layer, RMSNorm -> q/k/v
// (quantized) -> RoPE -> K/V into the paged cache -> paged attention -> output projection ->
// residual -> RMSNorm -> gate/up (quantized) -> SiLU * up -> down (quantized) -> residual.
//
// The same computation as rag.engine.model in float32, for steps where every sequence brings
// one token and the weights are in a 4- or 8-bit format: there the model's thirty layers of
// small torch ops cost more than their arithmetic (about 4 ms of a 13 ms step on 2 cores), and
// here they are plain loops between the matmuls.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

namespace {

// Where a layer's tensors lie in `layers` (see decode_layers), for weight-only formats and for
// w8a8 (a linear is 3 or 4 tensors).
struct Layout {
  int64_t per_layer, in_norm, qkv, qkv_bias, o, post_norm, gu, down;
};
constexpr Layout kWeightOnly{15, 0, 1, 4, 5, 8, 9, 12};
constexpr Layout kA8{19, 0, 1, 5, 6, 10, 11, 15};

// The threads of one step meet here between stages. OpenMP's own barrier would do, but
// libgomp spins only ~100 times before sleeping once the process has more OpenMP threads than
// cores (the engine's team, the ingest worker's, the main thread's), and a step has ~240
// stages: a futex wake at each cost ~6 ms a step on 2 cores. This one spins, and yields to
// the scheduler only after a long wait (another thread on the same core).
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < (1 << 14)) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};  // tensors per layer in `layers` (see decode_layers)

void rms_norm(const float* x, const float* w, float* out, int64_t B, int64_t E, float eps) {
  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * E;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t e = 0; e < E; ++e) ss += xb[e] * xb[e];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(E) + eps);
    float* ob = out + b * E;
#pragma omp simd
    for (int64_t e = 0; e < E; ++e) ob[e] = w[e] * (xb[e] * r);
  }
}

// In place on `heads` heads of D: v * cos + rotate_half(v) * sin, rotate_half(v) = (-v2, v1).
void rope(float* v, const float* cos, const float* sin, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* x = v + h * D;
    for (int64_t d = 0; d < half; ++d) {
      const float a = x[d], b = x[d + half];
      x[d] = a * cos[d] - b * sin[d];
      x[d + half] = b * cos[d + half] + a * sin[d + half];
    }
  }
}

// One linear of a layer in either kind of weights: 4- or 8-bit weight-only groups (float
// products, `bits` 4 or 8) or w8a8 (8-bit activations too, `bits` 0; rag.engine.w8a8).
struct Linear {
  ragserve::QWeight q{};
  ragserve::I8Weight a8{};
  bool is_a8 = false;

  int64_t k() const { return is_a8 ? a8.k : q.k; }
  // What the matmul needs of its input, made once by one thread: the groups' sums (4 bits)
  // or the quantized rows and their scales (w8a8).
  void prepare(const float* x, int64_t B, float* xsum, uint8_t* xq, float* xs) const {
    if (is_a8) {
      ragserve::i8_quantize(x, 0, B, a8, xq, xs);
    } else {
      ragserve::group_sums(x, B, q, xsum);
    }
  }
  void rows(const float* x, int64_t B, const float* xsum, const uint8_t* xq, const float* xs,
            float* out, int64_t part, int64_t parts) const {
    if (is_a8) {
      ragserve::i8_gemm_rows(xq, xs, B, a8, out, part, parts);
    } else {
      ragserve::qgemm_rows(x, B, q, xsum, out, part, parts);
    }
  }
};

// The tensors of one linear at `at` in `t`: 3 weight-only (packed, scales, mins) or 4 w8a8
// (packed, wsum, ws, smooth; the bias, where there is one, right after: `bias_at`).
Linear linear(const std::vector<torch::Tensor>& t, int64_t at, int64_t bits, int64_t group4,
              int64_t bias_at = -1) {
  Linear lin;
  if (bits == 0) {
    const torch::Tensor none = torch::empty({0});
    lin.is_a8 = true;
    lin.a8 = ragserve::i8weight(t[at], t[at + 1], t[at + 2], t[at + 3],
                                bias_at >= 0 ? t[bias_at] : none);
    return lin;
  }
  const torch::Tensor& q = t[at];
  const int64_t k = bits == 4 ? q.size(1) * 2 : q.size(1);
  lin.q = ragserve::qweight(q, t[at + 1], t[at + 2], bits, bits == 4 ? group4 : k);
  return lin;
}

}  // namespace

// x [B, E] float32: the step's embeddings in, its hidden states out (before the final norm).
// cos, sin [B, D]; kv_caches [L, 2, NB, Hkv, BS, D] float32 or bfloat16; kv_rows [B * Hkv]: the
// row of each (token, KV head) in a layer's cache viewed as [NB * Hkv * BS, D]; block_tables
// [B, MB]; context_lens [B]. `layers` holds a layer's tensors one layer after another:
// - bits 4 or 8 (weight-only), 15 a layer: input norm; q/k/v packed, scales, mins; q/k/v bias
//   (empty if none); output packed, scales, mins; post norm; gate/up packed, scales, mins;
//   down packed, scales, mins. 8-bit weights have a scale per row.
// - bits 0 (w8a8), 19 a layer: input norm; q/k/v packed, wsum, ws, smooth; q/k/v bias (empty
//   if none); output packed, wsum, ws, smooth; post norm; gate/up the four; down the four.
torch::Tensor decode_layers(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                            torch::Tensor kv_caches, torch::Tensor kv_rows,
                            torch::Tensor block_tables, torch::Tensor context_lens,
                            std::vector<torch::Tensor> layers, int64_t bits, int64_t group,
                            int64_t H, int64_t Hkv, int64_t D, double eps, double scale) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2,
              "x is [B, E] contiguous float32");
  const bool bf16 = kv_caches.scalar_type() == torch::kBFloat16;
  TORCH_CHECK((bf16 || kv_caches.scalar_type() == torch::kFloat32) && kv_caches.is_contiguous(),
              "a contiguous float32 or bfloat16 KV cache");
  TORCH_CHECK(bits == 0 || bits == 4 || bits == 8, "bits: 4, 8 or 0 (w8a8)");
  const Layout lay = bits == 0 ? kA8 : kWeightOnly;
  const int64_t L = kv_caches.size(0);
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == L * lay.per_layer, "tensors per layer");
  const int64_t B = x.size(0), E = x.size(1);
  const int64_t QKV = (H + 2 * Hkv) * D;
  // Every layer's linears, checked here, before any thread starts.
  std::vector<Linear> lin_qkv, lin_o, lin_gu, lin_down;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t at = l * lay.per_layer;
    lin_qkv.push_back(linear(layers, at + lay.qkv, bits, group, at + lay.qkv_bias));
    lin_o.push_back(linear(layers, at + lay.o, bits, group));
    lin_gu.push_back(linear(layers, at + lay.gu, bits, group));
    lin_down.push_back(linear(layers, at + lay.down, bits, group));
  }
  const int64_t I = (bits == 0 ? lin_gu[0].a8.n : lin_gu[0].q.n) / 2;
  TORCH_CHECK(lin_gu[0].k() == E && lin_qkv[0].k() == E, "weights do not match the hidden size");
  TORCH_CHECK((bits == 0 ? lin_qkv[0].a8.n : lin_qkv[0].q.n) == QKV, "q/k/v do not match heads");
  const float feps = static_cast<float>(eps);
  auto opts = x.options();
  auto h = torch::empty({B, E}, opts);
  auto qkv = torch::empty({B, QKV}, opts);
  auto q = torch::empty({B, H, D}, opts);
  auto attn = torch::empty({B, H * D}, opts);
  auto proj = torch::empty({B, E}, opts);
  auto gu = torch::empty({B, 2 * I}, opts);
  auto act = torch::empty({B, I}, opts);
  float* xp = x.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* qkvp = qkv.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* ap = attn.data_ptr<float>();
  float* pp = proj.data_ptr<float>();
  float* gup = gu.data_ptr<float>();
  float* actp = act.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t* rows = kv_rows.data_ptr<int64_t>();
  // What a matmul's input becomes first (the largest input being I wide): the sums of its
  // groups (4 bits), or its rows quantized and their scales (w8a8).
  const int64_t widest = std::max(E, std::max(I, H * D));
  std::vector<float> xsum(B * widest / 32 + 1);
  std::vector<uint8_t> xq(bits == 0 ? B * widest : 0);
  std::vector<float> xs(B);
  std::unique_ptr<ragserve::PagedDecode> plan;
  torch::Tensor k_cache, v_cache;
  const int threads = static_cast<int>(at::get_num_threads());

  // One parallel region for the whole step: the threads go through every layer together,
  // meeting at a barrier between stages (each stage's small serial part runs on one of them).
  // Forking a team per matmul would cost more than the small matmuls themselves.
  std::unique_ptr<SpinBarrier> barrier;
#pragma omp parallel num_threads(threads)
  {
    const int64_t tid = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp single
    barrier = std::make_unique<SpinBarrier>(static_cast<int>(nt));
    auto sync = [&] { barrier->wait(); };
    std::vector<float> scores;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t at = l * lay.per_layer;
      const Linear &w_qkv = lin_qkv[l], &w_o = lin_o[l], &w_gu = lin_gu[l],
                   &w_down = lin_down[l];
      if (tid == 0) {
        k_cache = kv_caches.select(0, l).select(0, 0);  // [NB, Hkv, BS, D]
        v_cache = kv_caches.select(0, l).select(0, 1);
        rms_norm(xp, layers[at + lay.in_norm].data_ptr<float>(), hp, B, E, feps);
        w_qkv.prepare(hp, B, xsum.data(), xq.data(), xs.data());
      }
      sync();
      w_qkv.rows(hp, B, xsum.data(), xq.data(), xs.data(), qkvp, tid, nt);
      sync();
      if (tid == 0) {
        if (!w_qkv.is_a8 && layers[at + lay.qkv_bias].numel()) {  // w8a8 adds it in its matmul
          const float* bias = layers[at + lay.qkv_bias].data_ptr<float>();
          for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < QKV; ++j) qkvp[b * QKV + j] += bias[j];
        }
        for (int64_t b = 0; b < B; ++b) {
          float* row = qkvp + b * QKV;
          rope(row, cp + b * D, sp + b * D, H + Hkv, D);  // q and k heads are adjacent
          std::copy(row, row + H * D, qp + b * H * D);
          for (int64_t kh = 0; kh < Hkv; ++kh) {
            const int64_t r = rows[b * Hkv + kh];
            const float* kr = row + (H + kh) * D;
            const float* vr = row + (H + Hkv + kh) * D;
            if (bf16) {  // rounded to nearest as torch's .to(bfloat16) does
              c10::BFloat16* kc = k_cache.data_ptr<c10::BFloat16>() + r * D;
              c10::BFloat16* vc = v_cache.data_ptr<c10::BFloat16>() + r * D;
              for (int64_t d = 0; d < D; ++d) kc[d] = c10::BFloat16(kr[d]);
              for (int64_t d = 0; d < D; ++d) vc[d] = c10::BFloat16(vr[d]);
            } else {
              std::copy(kr, kr + D, k_cache.data_ptr<float>() + r * D);
              std::copy(vr, vr + D, v_cache.data_ptr<float>() + r * D);
            }
          }
        }
        plan = std::make_unique<ragserve::PagedDecode>(q, k_cache, v_cache, block_tables,
                                                       context_lens, scale, ap, nt);
      }
      sync();
      scores.resize(plan->scratch());
      for (int64_t item = tid; item < plan->items(); item += nt) plan->run(item, scores.data());
      sync();
      for (int64_t bh = tid; bh < plan->heads(); bh += nt) plan->merge(bh);
      sync();
      if (tid == 0) w_o.prepare(ap, B, xsum.data(), xq.data(), xs.data());
      sync();
      w_o.rows(ap, B, xsum.data(), xq.data(), xs.data(), pp, tid, nt);
      sync();
      if (tid == 0) {
        for (int64_t j = 0; j < B * E; ++j) xp[j] += pp[j];
        rms_norm(xp, layers[at + lay.post_norm].data_ptr<float>(), hp, B, E, feps);
        w_gu.prepare(hp, B, xsum.data(), xq.data(), xs.data());
      }
      sync();
      w_gu.rows(hp, B, xsum.data(), xq.data(), xs.data(), gup, tid, nt);
      sync();
      if (tid == 0) {
        for (int64_t b = 0; b < B; ++b) {
          const float* g = gup + b * 2 * I;
          const float* u = g + I;
          float* a = actp + b * I;
          for (int64_t j = 0; j < I; ++j) a[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
        }
        w_down.prepare(actp, B, xsum.data(), xq.data(), xs.data());
      }
      sync();
      w_down.rows(actp, B, xsum.data(), xq.data(), xs.data(), pp, tid, nt);
      sync();
      // The residual, then (next layer) the norm: one thread, no barrier between them.
      if (tid == 0) for (int64_t j = 0; j < B * E; ++j) xp[j] += pp[j];
    }
  }
  return x;
}
