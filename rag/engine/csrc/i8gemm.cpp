// Linear layers in 8-bit integers: y = x @ W^T with x quantized per row (one scale a token,
// after a per-channel smoothing of x that the weights absorb, as SmoothQuant does) and W per
// output row. The products are exact 32-bit integer sums, so a row's result does not depend on
// which other rows share the call (a prompt computes alike however it is cut into chunks, a
// decode alike whatever batch it runs in); only the float epilogue rounds.
//
//   x_u8[m, k] = round(x[m, k] * smooth[k] / xs[m]) + 128   (xs[m] = max_k |x * smooth| / 127)
//   y[m, n]    = (sum_k x_u8[m, k] * w[n, k] - 128 * wsum[n]) * xs[m] * ws[n]
//
// The activations are offset to unsigned bytes because VNNI's VPDPBUSD multiplies unsigned by
// signed bytes; the offset is taken back with the weights' row sums, known when packing.
//
// Packed weights: blocks of 16 output rows; within a block, for every 4 consecutive k, the 16
// rows' 4 bytes (64 bytes, one vector): [N/16][K/4][16][4]. One VPDPBUSD then adds 4 products
// to each of 16 outputs of one input row, with the input's 4 bytes broadcast: no horizontal
// sums. A tile is 6 input rows by 4 blocks (24 accumulators in registers); measured on an
// AVX512-VNNI Xeon without AMX, this kernel is faster than oneDNN's integer matmul
// (torch._int_mm) at every size from 1 to 512 rows, its quantizing included.
// Without VNNI an AVX2 path (below) computes the same sums with VPMADDWD: on an AMD Zen 3 it
// runs one layer's linears 1.7-3.5x faster than float32 matmuls at 16-256 rows.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kVnni = true;
constexpr bool kSimd = true;
constexpr int NR = 4;  // blocks of 16 outputs per tile

// acc += the products of 4 unsigned bytes of u by 4 signed bytes of s, in each 32-bit lane.
// In assembly because GCC 12 copies the accumulator around every _mm512_dpbusd_epi32 (and
// spills the tile's accumulators to the stack at every step): 3x slower at 512 rows.
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

// 128 * wsum, the weight scales and the bias of block n, for the epilogue.
struct Epilogue {
  __m512i off;
  __m512 s, b;
  Epilogue(const int32_t* wsum, const float* ws, const float* bias, int n)
      : off(_mm512_slli_epi32(_mm512_loadu_si512(wsum + 16 * n), 7)),
        s(_mm512_loadu_ps(ws + 16 * n)),
        b(bias ? _mm512_loadu_ps(bias + 16 * n) : _mm512_setzero_ps()) {}
  // acc: sums over the offset activations (128 * wsum too many).
  void store(__m512i acc, float xs, float* out) const {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, off));
    _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_mul_ps(v, s), _mm512_set1_ps(xs), b));
  }
};

// A tile of up to 2 input rows by N_ blocks (at most 8 accumulators: GCC keeps small arrays
// of vectors in registers, larger ones it spills at every step of the loop).
template <int M_, int N_>
inline void tile_small(const uint8_t* x, int64_t ldx, int64_t K4, const int8_t* w, int64_t ldw,
                       const int32_t* wsum, const float* ws, const float* bias, const float* xs,
                       float* out, int64_t ldo) {
  __m512i acc[M_][N_];
  for (int m = 0; m < M_; ++m)
    for (int n = 0; n < N_; ++n) acc[m][n] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K4; ++k) {
    __m512i wv[N_];
    for (int n = 0; n < N_; ++n) wv[n] = _mm512_loadu_si512(w + n * ldw + k * 64);
    for (int m = 0; m < M_; ++m) {
      const __m512i xv =
          _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + m * ldx + k * 4));
      for (int n = 0; n < N_; ++n) acc[m][n] = dpbusd(acc[m][n], xv, wv[n]);
    }
  }
  for (int n = 0; n < N_; ++n) {
    const Epilogue e(wsum, ws, bias, n);
    for (int m = 0; m < M_; ++m) e.store(acc[m][n], xs[m], out + m * ldo + 16 * n);
  }
}

// The full tile, 6 input rows by 4 blocks: 24 accumulators named one by one (see above).
#define RAG_ACC_ROW(m)                                                                  \
  __m512i a##m##0 = _mm512_setzero_si512(), a##m##1 = a##m##0, a##m##2 = a##m##0, \
          a##m##3 = a##m##0;
#define RAG_DOT_ROW(m)                                                                    \
  {                                                                                       \
    const __m512i xv =                                                                    \
        _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x + (m) * ldx + k * 4));      \
    a##m##0 = dpbusd(a##m##0, xv, w0);                                       \
    a##m##1 = dpbusd(a##m##1, xv, w1);                                       \
    a##m##2 = dpbusd(a##m##2, xv, w2);                                       \
    a##m##3 = dpbusd(a##m##3, xv, w3);                                       \
  }
#define RAG_STORE_ROW(m)                                    \
  e0.store(a##m##0, xs[m], out + (m) * ldo);                \
  e1.store(a##m##1, xs[m], out + (m) * ldo + 16);           \
  e2.store(a##m##2, xs[m], out + (m) * ldo + 32);           \
  e3.store(a##m##3, xs[m], out + (m) * ldo + 48);

inline void tile_6x4(const uint8_t* x, int64_t ldx, int64_t K4, const int8_t* w, int64_t ldw,
                     const int32_t* wsum, const float* ws, const float* bias, const float* xs,
                     float* out, int64_t ldo) {
  RAG_ACC_ROW(0) RAG_ACC_ROW(1) RAG_ACC_ROW(2) RAG_ACC_ROW(3) RAG_ACC_ROW(4) RAG_ACC_ROW(5)
  for (int64_t k = 0; k < K4; ++k) {
    const __m512i w0 = _mm512_loadu_si512(w + k * 64);
    const __m512i w1 = _mm512_loadu_si512(w + ldw + k * 64);
    const __m512i w2 = _mm512_loadu_si512(w + 2 * ldw + k * 64);
    const __m512i w3 = _mm512_loadu_si512(w + 3 * ldw + k * 64);
    RAG_DOT_ROW(0) RAG_DOT_ROW(1) RAG_DOT_ROW(2) RAG_DOT_ROW(3) RAG_DOT_ROW(4) RAG_DOT_ROW(5)
  }
  const Epilogue e0(wsum, ws, bias, 0), e1(wsum, ws, bias, 1), e2(wsum, ws, bias, 2),
      e3(wsum, ws, bias, 3);
  RAG_STORE_ROW(0) RAG_STORE_ROW(1) RAG_STORE_ROW(2) RAG_STORE_ROW(3) RAG_STORE_ROW(4)
  RAG_STORE_ROW(5)
}

template <int N_>
inline void rows_small(int64_t m, int64_t M, const uint8_t* x, int64_t Kp, int64_t K4,
                       const int8_t* w, int64_t ldw, const int32_t* wsum, const float* ws,
                       const float* bias, const float* xs, float* out, int64_t N) {
  for (; m + 2 <= M; m += 2)
    tile_small<2, N_>(x + m * Kp, Kp, K4, w, ldw, wsum, ws, bias, xs + m, out + m * N, N);
  if (m < M) tile_small<1, N_>(x + m * Kp, Kp, K4, w, ldw, wsum, ws, bias, xs + m, out + m * N, N);
}

// Outputs of blocks [b0, b1) for every input row.
void gemm_blocks(const uint8_t* x, int64_t M, int64_t Kp, const int8_t* w, const int32_t* wsum,
                 const float* ws, const float* bias, const float* xs, float* out, int64_t N,
                 int64_t b0, int64_t b1) {
  const int64_t K4 = Kp / 4, ldw = K4 * 64;
  for (int64_t b = b0; b < b1; b += NR) {
    const int64_t nr = std::min<int64_t>(NR, b1 - b);
    const int8_t* wb = w + b * ldw;
    const int64_t c = 16 * b;
    const float* bb = bias ? bias + c : nullptr;
    int64_t m = 0;
    if (nr == NR) {
      for (; m + 6 <= M; m += 6)
        tile_6x4(x + m * Kp, Kp, K4, wb, ldw, wsum + c, ws + c, bb, xs + m, out + m * N + c, N);
    }
    switch (nr) {
      case 1: rows_small<1>(m, M, x, Kp, K4, wb, ldw, wsum + c, ws + c, bb, xs, out + c, N); break;
      case 2: rows_small<2>(m, M, x, Kp, K4, wb, ldw, wsum + c, ws + c, bb, xs, out + c, N); break;
      case 3: rows_small<3>(m, M, x, Kp, K4, wb, ldw, wsum + c, ws + c, bb, xs, out + c, N); break;
      default: rows_small<4>(m, M, x, Kp, K4, wb, ldw, wsum + c, ws + c, bb, xs, out + c, N);
    }
  }
}

#elif defined(__AVX2__)
// Without VNNI (AVX2 only: AMD Zen 2/3, most desktop parts): VPMADDWD on 16-bit lanes. The
// bytes' own instruction (VPMADDUBSW) saturates its 16-bit pair sums (255 * 127 * 2 > 32767),
// which would change the result; VPMADDWD sums a pair in 32 bits, exactly, and on these cores
// multiplies as many pairs a cycle as that one. The weights stay bytes in memory (sign-extended
// as they are loaded, 4 outputs by their 4 k at a time), the input rows are widened to 16 bits
// once a call, and a lane holds one output's products of k, k+1 (or k+2, k+3): the two are
// added across lanes once at the end. The sums are the VNNI kernel's, so are the results.
constexpr bool kVnni = false;
constexpr bool kSimd = true;
constexpr int NR = 1;

// 8 outputs (columns c..c+7) of one row from two accumulators of 4 outputs each.
inline void store8(__m256i a, __m256i b, const int32_t* wsum, const float* ws, const float* bias,
                   float xs, float* out) {
  const __m256i sums = _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);
  const __m256i off = _mm256_slli_epi32(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wsum)), 7);
  const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(sums, off));
  const __m256 bv = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_mul_ps(v, _mm256_loadu_ps(ws)),
                                        _mm256_set1_ps(xs), bv));
}

// a0 += products of the row's 4 inputs at xp with the weights w0 (4 outputs), a1 with w1. In
// assembly, two scratch registers named: with intrinsics GCC loads the 6 rows' inputs first and
// keeps the 12 accumulators of the full tile on the stack (2x slower).
inline void madd2(__m256i& a0, __m256i& a1, const uint16_t* xp, __m256i w0, __m256i w1) {
  __m256i t, u;
  asm("vpbroadcastq %4, %2\n\t"
      "vpmaddwd %5, %2, %3\n\t"
      "vpaddd %3, %0, %0\n\t"
      "vpmaddwd %6, %2, %3\n\t"
      "vpaddd %3, %1, %1"
      : "+x"(a0), "+x"(a1), "=&x"(t), "=&x"(u)
      : "m"(*reinterpret_cast<const int64_t*>(xp)), "x"(w0), "x"(w1));
}

inline __m256i wload(const int8_t* w) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}

// 6 rows (16-bit, ldx apart) by 8 outputs (half a block: its bytes start at w in every
// k-step, 64 bytes apart): 12 accumulators, named one by one (see madd2).
#define RAG_ACC2(m) __m256i a##m##0 = _mm256_setzero_si256(), a##m##1 = a##m##0;
#define RAG_MADD2(m) madd2(a##m##0, a##m##1, x + (m) * ldx + 4 * k, w0, w1);
#define RAG_STORE2(m) store8(a##m##0, a##m##1, wsum, ws, bias, xs[m], out + (m) * ldo);

inline void tile_6x8(const uint16_t* x, int64_t ldx, int64_t K4, const int8_t* w,
                     const int32_t* wsum, const float* ws, const float* bias, const float* xs,
                     float* out, int64_t ldo) {
  RAG_ACC2(0) RAG_ACC2(1) RAG_ACC2(2) RAG_ACC2(3) RAG_ACC2(4) RAG_ACC2(5)
  for (int64_t k = 0; k < K4; ++k) {
    const __m256i w0 = wload(w + k * 64), w1 = wload(w + k * 64 + 16);
    RAG_MADD2(0) RAG_MADD2(1) RAG_MADD2(2) RAG_MADD2(3) RAG_MADD2(4) RAG_MADD2(5)
  }
  RAG_STORE2(0) RAG_STORE2(1) RAG_STORE2(2) RAG_STORE2(3) RAG_STORE2(4) RAG_STORE2(5)
}

// R (1 or 2) rows by the block's 16 outputs.
template <int R>
inline void tile_rx16(const uint16_t* x, int64_t ldx, int64_t K4, const int8_t* w,
                      const int32_t* wsum, const float* ws, const float* bias, const float* xs,
                      float* out, int64_t ldo) {
  __m256i acc[R][4];
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_setzero_si256();
  for (int64_t k = 0; k < K4; ++k) {
    const __m256i w0 = wload(w + k * 64), w1 = wload(w + k * 64 + 16);
    const __m256i w2 = wload(w + k * 64 + 32), w3 = wload(w + k * 64 + 48);
    for (int m = 0; m < R; ++m) {
      madd2(acc[m][0], acc[m][1], x + m * ldx + 4 * k, w0, w1);
      madd2(acc[m][2], acc[m][3], x + m * ldx + 4 * k, w2, w3);
    }
  }
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < 4; v += 2)
      store8(acc[m][v], acc[m][v + 1], wsum + 4 * v, ws + 4 * v, bias ? bias + 4 * v : nullptr,
             xs[m], out + m * ldo + 4 * v);
}

// The rows of one block (16 outputs): 6 at a time over each half, what is left over both
// halves at once.
inline void block_avx2(const uint16_t* x, int64_t M, int64_t Kp, const int8_t* wb,
                       const int32_t* wsum, const float* ws, const float* bias, const float* xs,
                       float* out, int64_t N) {
  const int64_t K4 = Kp / 4;
  int64_t m = 0;
  for (; m + 6 <= M; m += 6)
    for (int h = 0; h < 2; ++h)
      tile_6x8(x + m * Kp, Kp, K4, wb + 32 * h, wsum + 8 * h, ws + 8 * h,
               bias ? bias + 8 * h : nullptr, xs + m, out + m * N + 8 * h, N);
  for (; m + 2 <= M; m += 2)
    tile_rx16<2>(x + m * Kp, Kp, K4, wb, wsum, ws, bias, xs + m, out + m * N, N);
  if (m < M) tile_rx16<1>(x + m * Kp, Kp, K4, wb, wsum, ws, bias, xs + m, out + m * N, N);
}

void gemm_blocks(const uint8_t* x, int64_t M, int64_t Kp, const int8_t* w, const int32_t* wsum,
                 const float* ws, const float* bias, const float* xs, float* out, int64_t N,
                 int64_t b0, int64_t b1) {
  thread_local std::vector<uint16_t> xw;  // kept between calls: no allocation a linear
  xw.resize(static_cast<size_t>(M * Kp));
  for (int64_t i = 0; i < M * Kp; ++i) xw[i] = x[i];
  const int64_t ldw = Kp / 4 * 64;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t c = 16 * b;
    block_avx2(xw.data(), M, Kp, w + b * ldw, wsum + c, ws + c, bias ? bias + c : nullptr, xs,
               out + c, N);
  }
}

#else
// Neither: the same integer sums in plain loops (correct, not fast: the engine does not
// choose this format by itself here).
constexpr bool kVnni = false;
constexpr bool kSimd = false;
constexpr int NR = 1;

inline float finish(int32_t exact, float ws, float xs, float b) {
  return std::fma(static_cast<float>(exact) * ws, xs, b);
}

void gemm_blocks(const uint8_t* x, int64_t M, int64_t Kp, const int8_t* w, const int32_t* wsum,
                 const float* ws, const float* bias, const float* xs, float* out, int64_t N,
                 int64_t b0, int64_t b1) {
  const int64_t K4 = Kp / 4;
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* wb = w + b * K4 * 64;
    for (int64_t m = 0; m < M; ++m) {
      int32_t acc[16] = {0};
      const uint8_t* xm = x + m * Kp;
      for (int64_t k = 0; k < K4; ++k)
        for (int j = 0; j < 16; ++j)
          for (int i = 0; i < 4; ++i)
            acc[j] += static_cast<int32_t>(xm[4 * k + i]) * wb[k * 64 + 4 * j + i];
      for (int j = 0; j < 16; ++j) {
        const int64_t c = 16 * b + j;
        out[m * N + c] = finish(acc[j] - 128 * wsum[c], ws[c], xs[m], bias ? bias[c] : 0.0f);
      }
    }
  }
}

#endif

// Rows [begin, end) of x [M, K] float -> bytes [M, K] (q + 128) and their scales xs.
void quantize_range(const float* x, int64_t K, const float* smooth, uint8_t* xq,
                    float* xs, int64_t begin, int64_t end) {
  for (int64_t m = begin; m < end; ++m) {
    const float* xm = x + m * K;
    uint8_t* qm = xq + m * K;
#if defined(__AVX512F__)
    __m512 vmax = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_mul_ps(_mm512_loadu_ps(xm + k),
                                                             _mm512_loadu_ps(smooth + k))));
    float amax = _mm512_reduce_max_ps(vmax);
    for (; k < K; ++k) amax = std::max(amax, std::fabs(xm[k] * smooth[k]));
#else
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(xm[k] * smooth[k]));
#endif
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / scale;
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const __m512i off = _mm512_set1_epi32(128);
    for (; j + 16 <= K; j += 16) {
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xm + j),
                                                   _mm512_loadu_ps(smooth + j)), vinv);
      __m512i q = _mm512_cvtps_epi32(v);  // to nearest, ties to even (as nearbyint)
      q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), off);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qm + j), _mm512_cvtepi32_epi8(q));
    }
#endif
    for (; j < K; ++j) {
      const float v = std::nearbyint(xm[j] * smooth[j] * inv);
      const int32_t q = static_cast<int32_t>(std::clamp(v, -127.0f, 127.0f)) + 128;
      qm[j] = static_cast<uint8_t>(q);
    }
    xs[m] = scale;
  }
}

}  // namespace

namespace ragserve {

I8Weight i8weight(const torch::Tensor& packed, const torch::Tensor& wsum, const torch::Tensor& ws,
                  const torch::Tensor& smooth, const torch::Tensor& bias) {
  const int64_t N = ws.numel(), K = smooth.numel();
  TORCH_CHECK(N % 16 == 0 && K % 4 == 0, "8-bit linears need N % 16 == 0 and K % 4 == 0");
  TORCH_CHECK(packed.is_contiguous() && packed.numel() == N * K &&
                  packed.scalar_type() == torch::kInt8,
              "packed is int8 [N/16, K/4, 16, 4]");
  TORCH_CHECK(wsum.numel() == N && wsum.scalar_type() == torch::kInt32 && wsum.is_contiguous(),
              "wsum is [N] int32");
  TORCH_CHECK(ws.scalar_type() == torch::kFloat32 && ws.is_contiguous(), "ws is [N] float32");
  TORCH_CHECK(smooth.scalar_type() == torch::kFloat32 && smooth.is_contiguous(),
              "smooth is [K] float32");
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.numel() == N && bias.scalar_type() == torch::kFloat32 &&
                            bias.is_contiguous()),
              "bias is [N] float32");
  return I8Weight{packed.data_ptr<int8_t>(), wsum.data_ptr<int32_t>(), ws.data_ptr<float>(),
                  smooth.data_ptr<float>(), has_bias ? bias.data_ptr<float>() : nullptr, N, K};
}

void i8_quantize(const float* x, int64_t begin, int64_t end, const I8Weight& w, uint8_t* xq,
                 float* xs) {
  quantize_range(x, w.k, w.smooth, xq, xs, begin, end);
}

void i8_gemm_rows(const uint8_t* xq, const float* xs, int64_t M, const I8Weight& w, float* out,
                  int64_t part, int64_t parts) {
  const int64_t blocks = w.n / 16, tiles = (blocks + NR - 1) / NR;
  const int64_t b0 = std::min(blocks, tiles * part / parts * NR);
  const int64_t b1 = std::min(blocks, tiles * (part + 1) / parts * NR);
  if (b0 < b1) gemm_blocks(xq, M, w.k, w.q, w.wsum, w.ws, w.bias, xs, out, w.n, b0, b1);
}

}  // namespace ragserve

// x [M, K] float32 -> [M, N] float32 through the 8-bit weights: packed int8 [N/16, K/4, 16, 4],
// wsum [N] int32, ws [N] float32, smooth [K] float32, bias [N] float32 or empty.
torch::Tensor i8_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor wsum,
                        torch::Tensor ws, torch::Tensor smooth, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x is [M, K] contiguous float32");
  const ragserve::I8Weight w = ragserve::i8weight(packed, wsum, ws, smooth, bias);
  TORCH_CHECK(x.size(1) == w.k, "x and W disagree on K");
  const int64_t M = x.size(0), K = w.k, N = w.n;
  auto out = torch::empty({M, N}, x.options());
  if (M == 0) return out;
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kUInt8));
  auto xs = torch::empty({M}, x.options());
  uint8_t* xqp = xq.data_ptr<uint8_t>();
  float* xsp = xs.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    quantize_range(xp, K, w.smooth, xqp, xsp, begin, end);
  });
  float* op = out.data_ptr<float>();
  const int64_t blocks = N / 16;
  const int64_t tiles = (blocks + NR - 1) / NR;
  // Threads split the output blocks: each streams its own share of the weights.
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    gemm_blocks(xqp, M, K, w.q, w.wsum, w.ws, w.bias, xsp, op, N, begin * NR,
                std::min(blocks, end * NR));
  });
  return out;
}

bool i8_fast() { return kVnni; }

bool i8_simd() { return kSimd; }
