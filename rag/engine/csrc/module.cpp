// The engine's compiled CPU kernels, as one Python module (built by rag.engine.kernels).
#include <torch/extension.h>

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale);
torch::Tensor qgemm(torch::Tensor x, torch::Tensor w, torch::Tensor scales, torch::Tensor mins,
                    int64_t bits, int64_t group);
torch::Tensor i8_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor wsum,
                        torch::Tensor ws, torch::Tensor smooth, torch::Tensor bias);
bool i8_fast();
bool i8_simd();
torch::Tensor q8_rows(torch::Tensor w, torch::Tensor scales, torch::Tensor ids, int64_t group);
torch::Tensor decode_layers(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                            torch::Tensor kv_caches, torch::Tensor kv_rows,
                            torch::Tensor block_tables, torch::Tensor context_lens,
                            std::vector<torch::Tensor> layers, int64_t bits, int64_t group,
                            int64_t H, int64_t Hkv, int64_t D, double eps, double scale);

// A thread's OpenMP team is sized once, on its first parallel call, from torch's process-wide
// default, and this module keeps its own note of whether that happened (the inline
// at::internal::lazy_init_num_threads): a thread that sized its team through torch
// (rag.torch_threads.team_thread) and then, after the default moved, made its first call
// here was resized to the default. Called while the default is the team's size.
void init_threads() { at::internal::lazy_init_num_threads(); }

// The kernels run without the GIL (arguments are converted before, the result after): a
// prefill's matmuls or a whole decode step must not stop the server's event loop and the
// other threads for as long as they take. They touch no Python object.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using nogil = py::call_guard<py::gil_scoped_release>;
  m.def("paged_decode", &paged_decode, "decode attention over paged KV blocks", nogil());
  m.def("qgemm", &qgemm, "x @ W^T with W in 4- or 8-bit groups", nogil());
  m.def("i8_linear", &i8_linear, "x @ W^T in 8-bit integers (x per row, W per output row)",
        nogil());
  m.def("i8_fast", &i8_fast, "whether i8_linear was built with VNNI");
  m.def("i8_simd", &i8_simd, "whether i8_linear was built with VNNI or AVX2 (else plain loops)");
  m.def("q8_rows", &q8_rows, "rows of an 8-bit table, dequantized", nogil());
  m.def("decode_layers", &decode_layers, "every decoder layer of a decode step", nogil());
  m.def("init_threads", &init_threads, "size the calling thread's team as torch's default is");
}
