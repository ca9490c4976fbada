// Weight-only quantized matrix multiply for the engine's decode steps: y = x @ W^T with W
// stored in groups of G weights along K, each group with its own scale (and, for 4 bits, its
// own minimum), dequantized in registers and multiplied in float32.
//
//   4 bits (asymmetric, the shape of GGUF's Q4_1): w = scale * q + min, q in 0..15. A group's
//     32-weight blocks are 16 bytes: byte j holds q[j] in its low nibble, q[j + 16] in its high.
//   8 bits (symmetric, GGUF's Q8_0 when G = 32, per output channel when G = K): w = scale * q,
//     q in -127..127, 32 bytes a block.
//
// Decode multiplies a handful of rows by every weight once, so the time is reading the
// weights: 4 bits read an eighth of float32's bytes. The product is the float32 product with
// the dequantized weights up to rounding: y = sum_k x_k * scale_g * q_k + sum_g min_g * sum(x_g).
//
// Shape of the loop: a tile of NB output rows by MB input rows. Each weight block is decoded
// once per tile and used by the MB input rows, and the NB * MB accumulators are independent
// chains, so the FMAs run at throughput rather than waiting on one another.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;  // weights per packed block
constexpr int64_t NB = 4;       // output rows per tile
constexpr int64_t MB = 4;       // input rows per tile (at most)

template <int BITS>
constexpr int64_t block_bytes() {
  return BITS == 4 ? kBlock / 2 : kBlock;
}

#if defined(__AVX512F__)
// The 32 weights of one block as two vectors of 16 floats, unscaled.
template <int BITS>
inline void decode_block(const uint8_t* wb, __m512& lo, __m512& hi) {
  if (BITS == 4) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb));
    lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, low)));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), low)));
  } else {
    lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb))));
    hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 16))));
  }
}

// One tile: out[m][r] = x[m] . W[n0 + r] (scaled, without the minimums) for m < MB_, r < nb.
template <int BITS, int MB_>
inline void tile(const float* x, int64_t K, int64_t mb, const uint8_t* w, int64_t row_bytes,
                 const float* scale, int64_t groups, int64_t group, int64_t nb, float* out,
                 int64_t ldo) {
  __m512 acc[MB_][NB];
  for (int64_t m = 0; m < MB_; ++m)
    for (int64_t r = 0; r < NB; ++r) acc[m][r] = _mm512_setzero_ps();
  const int64_t blocks_per_group = group / kBlock;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < blocks_per_group; ++b) {
      const int64_t blk = g * blocks_per_group + b;
      __m512 xlo[MB_], xhi[MB_];
      for (int64_t m = 0; m < MB_; ++m) {
        xlo[m] = _mm512_loadu_ps(x + m * K + blk * kBlock);
        xhi[m] = _mm512_loadu_ps(x + m * K + blk * kBlock + 16);
      }
      for (int64_t r = 0; r < nb; ++r) {
        __m512 lo, hi;
        decode_block<BITS>(w + r * row_bytes + blk * block_bytes<BITS>(), lo, hi);
        const __m512 s = _mm512_set1_ps(scale[r * groups + g]);
        lo = _mm512_mul_ps(lo, s);
        hi = _mm512_mul_ps(hi, s);
        for (int64_t m = 0; m < MB_; ++m) {
          acc[m][r] = _mm512_fmadd_ps(xlo[m], lo, acc[m][r]);
          acc[m][r] = _mm512_fmadd_ps(xhi[m], hi, acc[m][r]);
        }
      }
    }
  }
  for (int64_t m = 0; m < mb; ++m)
    for (int64_t r = 0; r < nb; ++r) out[m * ldo + r] = _mm512_reduce_add_ps(acc[m][r]);
}

template <int BITS>
inline void tile_any(const float* x, int64_t K, int64_t mb, const uint8_t* w, int64_t row_bytes,
                     const float* scale, int64_t groups, int64_t group, int64_t nb, float* out,
                     int64_t ldo) {
  switch (mb) {
    case 1: return tile<BITS, 1>(x, K, mb, w, row_bytes, scale, groups, group, nb, out, ldo);
    case 2: return tile<BITS, 2>(x, K, mb, w, row_bytes, scale, groups, group, nb, out, ldo);
    case 3: return tile<BITS, 3>(x, K, mb, w, row_bytes, scale, groups, group, nb, out, ldo);
    default: return tile<BITS, 4>(x, K, mb, w, row_bytes, scale, groups, group, nb, out, ldo);
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 (no AVX512: AMD Zen 2/3, most desktop CPUs): 8 floats a vector and 16 registers. On
// such CPUs decode is bound by the arithmetic of dequantizing, not by memory, so a weight is
// decoded once for up to 4 input rows: output rows go by pairs (4 x 2 accumulators, the 4
// vectors of one decoded block, the scale), and the inputs are read from L1 by the FMAs.
inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The 32 weights of one block as four vectors of 8 floats (weights 0-7, 8-15, 16-23, 24-31),
// unscaled. 4 bits: bytes widened to 32-bit lanes straight from memory, the low nibble
// masked and the high one shifted down.
template <int BITS>
inline void decode_block(const uint8_t* wb, __m256 v[4]) {
  if (BITS == 4) {
    const __m256i low = _mm256_set1_epi32(0x0F);
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb)));
    const __m256i b =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb + 8)));
    v[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, low));
    v[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
    v[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    v[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  } else {
    for (int j = 0; j < 4; ++j) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb + 8 * j));
      v[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    }
  }
}

// Output rows r0 .. r0 + R_ - 1 of the tile, for MB_ input rows. Each (input, output) pair
// has J accumulators, taken in turn by a block's four vectors, so that at least 8 FMA chains
// are in flight (one chain would wait on the FMA latency).
template <int BITS, int MB_, int R_>
inline void rows(const float* x, int64_t K, const uint8_t* w, int64_t row_bytes,
                 const float* scale, int64_t groups, int64_t group, float* out, int64_t ldo) {
  constexpr int J = MB_ == 1 ? 4 : (MB_ == 2 ? 2 : 1);
  __m256 acc[MB_][R_][J];
  for (int m = 0; m < MB_; ++m)
    for (int r = 0; r < R_; ++r)
      for (int j = 0; j < J; ++j) acc[m][r][j] = _mm256_setzero_ps();
  const int64_t blocks_per_group = group / kBlock;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < blocks_per_group; ++b) {
      const int64_t blk = g * blocks_per_group + b;
      for (int r = 0; r < R_; ++r) {
        __m256 v[4];
        decode_block<BITS>(w + r * row_bytes + blk * block_bytes<BITS>(), v);
        const __m256 s = _mm256_set1_ps(scale[r * groups + g]);
        for (int j = 0; j < 4; ++j) {
          const __m256 ws = _mm256_mul_ps(v[j], s);
          for (int m = 0; m < MB_; ++m)
            acc[m][r][j % J] = _mm256_fmadd_ps(
                _mm256_loadu_ps(x + m * K + blk * kBlock + 8 * j), ws, acc[m][r][j % J]);
        }
      }
    }
  }
  for (int m = 0; m < MB_; ++m) {
    for (int r = 0; r < R_; ++r) {
      __m256 sum = acc[m][r][0];
      for (int j = 1; j < J; ++j) sum = _mm256_add_ps(sum, acc[m][r][j]);
      out[m * ldo + r] = hsum(sum);
    }
  }
}

template <int BITS, int MB_>
inline void tile(const float* x, int64_t K, const uint8_t* w, int64_t row_bytes,
                 const float* scale, int64_t groups, int64_t group, int64_t nb, float* out,
                 int64_t ldo) {
  int64_t r = 0;
  for (; r + 2 <= nb; r += 2)
    rows<BITS, MB_, 2>(x, K, w + r * row_bytes, row_bytes, scale + r * groups, groups, group,
                       out + r, ldo);
  if (r < nb)
    rows<BITS, MB_, 1>(x, K, w + r * row_bytes, row_bytes, scale + r * groups, groups, group,
                       out + r, ldo);
}

template <int BITS>
inline void tile_any(const float* x, int64_t K, int64_t mb, const uint8_t* w, int64_t row_bytes,
                     const float* scale, int64_t groups, int64_t group, int64_t nb, float* out,
                     int64_t ldo) {
  switch (mb) {
    case 1: return tile<BITS, 1>(x, K, w, row_bytes, scale, groups, group, nb, out, ldo);
    case 2: return tile<BITS, 2>(x, K, w, row_bytes, scale, groups, group, nb, out, ldo);
    case 3: return tile<BITS, 3>(x, K, w, row_bytes, scale, groups, group, nb, out, ldo);
    default: return tile<BITS, 4>(x, K, w, row_bytes, scale, groups, group, nb, out, ldo);
  }
}
#else
template <int BITS>
inline void tile_any(const float* x, int64_t K, int64_t mb, const uint8_t* w, int64_t row_bytes,
                 const float* scale, int64_t groups, int64_t group, int64_t nb, float* out,
                 int64_t ldo) {
  const int64_t blocks_per_group = group / kBlock;
  for (int64_t m = 0; m < mb; ++m) {
    for (int64_t r = 0; r < nb; ++r) {
      float y = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float dot = 0.0f;
        for (int64_t b = 0; b < blocks_per_group; ++b) {
          const int64_t blk = g * blocks_per_group + b;
          const uint8_t* wb = w + r * row_bytes + blk * block_bytes<BITS>();
          const float* xb = x + m * K + blk * kBlock;
          for (int64_t j = 0; j < 16; ++j) {
            float qlo, qhi;
            if (BITS == 4) {
              qlo = static_cast<float>(wb[j] & 0x0F);
              qhi = static_cast<float>(wb[j] >> 4);
            } else {
              qlo = static_cast<float>(static_cast<int8_t>(wb[j]));
              qhi = static_cast<float>(static_cast<int8_t>(wb[j + 16]));
            }
            dot += xb[j] * qlo + xb[j + 16] * qhi;
          }
        }
        y += scale[r * groups + g] * dot;
      }
      out[m * ldo + r] = y;
    }
  }
}
#endif

// Output rows [begin, end) of out [M, w.n] = x @ W^T (begin a multiple of NB), no threads.
template <int BITS>
void qgemm_rows(const float* xp, int64_t M, const ragserve::QWeight& w, const float* xsum,
                float* op, int64_t begin, int64_t end) {
  const int64_t K = w.k, N = w.n, group = w.group;
  const int64_t groups = K / group;
  const int64_t row_bytes = BITS == 4 ? K / 2 : K;
  float tmp[MB * NB];
  for (int64_t n0 = begin; n0 < end; n0 += NB) {
    const int64_t nb = std::min(NB, end - n0);
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t mb = std::min(MB, M - m0);
      tile_any<BITS>(xp + m0 * K, K, mb, w.q + n0 * row_bytes, row_bytes, w.scales + n0 * groups,
                     groups, group, nb, tmp, NB);
      for (int64_t m = 0; m < mb; ++m) {
        for (int64_t r = 0; r < nb; ++r) {
          float y = tmp[m * NB + r];
          if (BITS == 4) {
            const float* mn = w.mins + (n0 + r) * groups;
            const float* xs = xsum + (m0 + m) * groups;
            for (int64_t g = 0; g < groups; ++g) y += mn[g] * xs[g];
          }
          op[(m0 + m) * N + n0 + r] = y;
        }
      }
    }
  }
}

}  // namespace

namespace ragserve {

QWeight qweight(const torch::Tensor& q, const torch::Tensor& scales, const torch::Tensor& mins,
                int64_t bits, int64_t group) {
  TORCH_CHECK(q.dim() == 2 && scales.dim() == 2, "bad ranks");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32, "float32 scales only");
  TORCH_CHECK(q.is_contiguous() && scales.is_contiguous(), "contiguous only");
  const int64_t n = q.size(0), k = bits == 4 ? q.size(1) * 2 : q.size(1);
  TORCH_CHECK(group % kBlock == 0 && k % group == 0, "group must divide K and be a multiple of 32");
  TORCH_CHECK(scales.size(0) == n && scales.size(1) == k / group, "scales do not match");
  if (bits == 4) {
    TORCH_CHECK(mins.sizes() == scales.sizes() && mins.is_contiguous() &&
                    mins.scalar_type() == torch::kFloat32,
                "4-bit weights need mins like scales");
  } else {
    TORCH_CHECK(bits == 8, "4 or 8 bits");
  }
  return QWeight{reinterpret_cast<const uint8_t*>(q.data_ptr()), scales.data_ptr<float>(),
                 bits == 4 ? mins.data_ptr<float>() : nullptr, n, k, bits, group};
}

void group_sums(const float* x, int64_t M, const QWeight& w, float* xsum) {
  if (w.bits != 4) return;
  const int64_t groups = w.k / w.group;
  std::fill(xsum, xsum + M * groups, 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < w.k; ++k) xsum[m * groups + k / w.group] += x[m * w.k + k];
}

void qgemm_rows(const float* x, int64_t M, const QWeight& w, const float* xsum, float* out,
                int64_t part, int64_t parts) {
  // Whole tiles of NB rows per part.
  const int64_t tiles = (w.n + NB - 1) / NB;
  const int64_t begin = std::min(w.n, tiles * part / parts * NB);
  const int64_t end = std::min(w.n, tiles * (part + 1) / parts * NB);
  if (begin >= end) return;
  if (w.bits == 4) {
    ::qgemm_rows<4>(x, M, w, xsum, out, begin, end);
  } else {
    ::qgemm_rows<8>(x, M, w, xsum, out, begin, end);
  }
}

void qgemm_into(const float* x, int64_t M, const QWeight& w, float* out) {
  std::vector<float> xsum(w.bits == 4 ? M * (w.k / w.group) : 0);
  group_sums(x, M, w, xsum.data());
  // Parts of the output rows: each thread streams its own share of the weights.
  const int64_t parts = 4 * at::get_num_threads();
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) qgemm_rows(x, M, w, xsum.data(), out, p, parts);
  });
}

}  // namespace ragserve

// x [M, K] float32; w [N, K/2] uint8 (bits 4) or [N, K] int8 (bits 8); scales (and mins, for
// 4 bits) [N, K/group] float32. Returns [M, N] float32.
torch::Tensor qgemm(torch::Tensor x, torch::Tensor w, torch::Tensor scales, torch::Tensor mins,
                    int64_t bits, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x is [M, K] contiguous float32");
  const ragserve::QWeight qw = ragserve::qweight(w, scales, mins, bits, group);
  TORCH_CHECK(x.size(1) == qw.k, "x and W disagree on K");
  auto out = torch::empty({x.size(0), qw.n}, x.options());
  ragserve::qgemm_into(x.data_ptr<float>(), x.size(0), qw, out.data_ptr<float>());
  return out;
}

// Rows of an 8-bit table (an embedding stored like its tied output matrix), dequantized.
torch::Tensor q8_rows(torch::Tensor w, torch::Tensor scales, torch::Tensor ids, int64_t group) {
  TORCH_CHECK(w.dim() == 2 && ids.dim() == 1 && ids.scalar_type() == torch::kInt64, "bad args");
  const int64_t T = ids.size(0), K = w.size(1), groups = K / group;
  auto out = torch::empty({T, K}, scales.options());
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const int64_t* ip = ids.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = ip[t];
    for (int64_t k = 0; k < K; ++k) {
      op[t * K + k] = sp[r * groups + k / group] * static_cast<float>(wp[r * K + k]);
    }
  }
  return out;
}
