// What the engine's kernels share across files (the Python-facing functions are declared in
// module.cpp).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace ragserve {

// A linear layer's weights in 4- or 8-bit groups (see qgemm.cpp for the layout).
struct QWeight {
  const uint8_t* q;
  const float* scales;
  const float* mins;  // 4 bits only
  int64_t n, k, bits, group;
};

QWeight qweight(const torch::Tensor& q, const torch::Tensor& scales, const torch::Tensor& mins,
                int64_t bits, int64_t group);

// out [M, w.n] = x [M, w.k] @ W^T, on torch's thread pool.
void qgemm_into(const float* x, int64_t M, const QWeight& w, float* out);
// The same, without threads, for part `part` of `parts` of the output rows; `xsum` from
// group_sums (the sums of x's groups, [M, K / group], 4 bits only).
void group_sums(const float* x, int64_t M, const QWeight& w, float* xsum);
void qgemm_rows(const float* x, int64_t M, const QWeight& w, const float* xsum, float* out,
                int64_t part, int64_t parts);

// A linear layer in 8-bit integers with 8-bit activations (see i8gemm.cpp).
struct I8Weight {
  const int8_t* q;  // packed [N/16, K/4, 16, 4]
  const int32_t* wsum;
  const float* ws;
  const float* smooth;
  const float* bias;  // nullptr: none
  int64_t n, k;
};

I8Weight i8weight(const torch::Tensor& packed, const torch::Tensor& wsum, const torch::Tensor& ws,
                  const torch::Tensor& smooth, const torch::Tensor& bias);
// Rows [begin, end) of x [M, w.k] quantized for `w` (bytes [M, w.k], scales [M]), no threads.
void i8_quantize(const float* x, int64_t begin, int64_t end, const I8Weight& w, uint8_t* xq,
                 float* xs);
// out [M, w.n] from quantized rows, part `part` of `parts` of the outputs, no threads.
void i8_gemm_rows(const uint8_t* xq, const float* xs, int64_t M, const I8Weight& w, float* out,
                  int64_t part, int64_t parts);

// Decode attention of B single-token queries over their paged contexts (paged_attention.cpp):
// `items()` work items (a stretch of one sequence's context each) that may run on any thread,
// each with `scratch()` floats of its own, then `heads()` merges.
class PagedDecode {
 public:
  PagedDecode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
              const torch::Tensor& block_tables, const torch::Tensor& context_lens, double scale,
              float* out, int64_t threads);
  int64_t items() const { return first_.back(); }
  int64_t heads() const { return B_ * H_; }
  int64_t scratch() const { return (H_ / Hkv_) * BS_; }
  void run(int64_t item, float* scores);
  void merge(int64_t bh);

 private:
  const float* q_;
  const void* k_;
  const void* v_;
  bool bf16_;
  const int64_t* bt_;
  const int64_t* lens_;
  float* out_;
  int64_t B_, H_, D_, Hkv_, BS_, MB_, stretch_ = 1;
  std::vector<int64_t> first_;  // sequence b's items are first_[b] .. first_[b + 1] - 1
  float sc_;
  std::vector<float> pm_, pl_, pacc_;
};

// Decode attention into `out` [B, H, D], on torch's thread pool.
void paged_decode_into(const torch::Tensor& q, const torch::Tensor& k_cache,
                       const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                       const torch::Tensor& context_lens, double scale, float* out);

}  // namespace ragserve
