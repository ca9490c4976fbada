"""Weight formats: packing is exact where it must be, the quantized kernel computes the float32
product with the dequantized weights, and the fused decode step is the model's own layers."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rag.engine.model import LlamaModel  # noqa: E402
from rag.engine.model_config import ModelConfig  # noqa: E402
from rag.engine.quant import (  # noqa: E402
    QuantLinear,
    apply_weight_format,
    fused_decode,
    pack_int4,
    pack_int8,
    unpack_int4,
    unpack_int8,
)

from .conftest import greedy_paged as greedy  # noqa: E402


def require_kernels():
    import os

    from rag.engine.kernels import kernels

    module = kernels()
    if module is None:
        if os.environ.get("CI"):
            pytest.fail("the engine kernels did not build (see the log)")
        pytest.skip("the engine kernels could not be built here (no C++ compiler?)")
    return module


def q4_1_weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Weights as a Q4_1 GGUF dequantizes them: d * q + m per 32, d and m float16."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-4).half().float()
    m = (torch.randn(n, k // 32, 1, generator=g) * 0.05).half().float()
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # the quantizer's min and max are always in the group
    return (d * q + m).reshape(n, k)


def test_int4_holds_q4_1_weights_exactly():
    w = q4_1_weights(40, 96)
    assert torch.equal(unpack_int4(*pack_int4(w)), w)


def test_int8_rounds_each_weight_to_its_row_scale():
    w = torch.randn(12, 64, generator=torch.Generator().manual_seed(3))
    q, scales = pack_int8(w, 64)
    err = (unpack_int8(q, scales, 64) - w).abs()
    assert (err <= scales / 2 + 1e-7).all()
    # Q8_0 (a scale per 32) of Q8_0-shaped values is exact.
    s = (torch.rand(12, 2, 1) * 0.01).half().float()
    exact = (s * torch.randint(-127, 128, (12, 2, 32)).float()).reshape(12, 64)
    exact[:, 0], exact[:, 32] = 127 * s[:, 0, 0], -127 * s[:, 1, 0]
    assert torch.equal(unpack_int8(*pack_int8(exact, 32), 32), exact)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, 32), (8, 96)])
def test_qgemm_is_the_float32_product_with_the_dequantized_weights(rows, bits, group):
    kernels = require_kernels()
    n, k = 10, 96  # 10 rows: tiles of 4 with a ragged end
    w = q4_1_weights(n, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7))
    if bits == 4:
        q, scales, mins = pack_int4(w, group)
        reference = unpack_int4(q, scales, mins, group)
    else:
        (q, scales), mins = pack_int8(w, group), torch.empty(0)
        reference = unpack_int8(q, scales, group)
    got = kernels.qgemm(x, q, scales, mins, bits, group)
    torch.testing.assert_close(got, x @ reference.t(), rtol=1e-5, atol=1e-6)


def test_q8_rows_dequantize_the_looked_up_rows():
    kernels = require_kernels()
    q, scales = pack_int8(torch.randn(50, 64), 32)
    ids = torch.tensor([0, 49, 7, 7])
    assert torch.equal(kernels.q8_rows(q, scales, ids, 32), unpack_int8(q[ids], scales[ids], 32))


def tiny(bias: bool = False) -> LlamaModel:
    """A test-sized model whose linears hold Q4_1-shaped weights (GQA: 4 heads on 2)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=True,
        attention_bias=bias,
    )  # fmt: skip
    model = LlamaModel(cfg)
    with torch.no_grad():
        # The tied embedding / output table Q8_0-shaped: int8 with a float16 scale per 32.
        s = (torch.rand(cfg.vocab_size, 2, 1) * 0.02 + 1e-3).half().float()
        q = torch.randint(-127, 128, (cfg.vocab_size, 2, 32)).float()
        q[..., 0] = 127
        model.embed_tokens.weight.copy_((s * q).reshape(cfg.vocab_size, 64))
        for i, module in enumerate(model.modules()):
            if isinstance(module, torch.nn.Linear) and module.weight.shape[0] != cfg.vocab_size:
                module.weight.copy_(q4_1_weights(*module.weight.shape, seed=i))
                if module.bias is not None:
                    module.bias.normal_(0, 0.1)
    return model.eval()


PROMPTS = [[5, 9, 17, 3], list(range(20, 53)), [7] * 11]


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("bias", [False, True], ids=["llama", "qwen2-bias"])
@pytest.mark.parametrize("kv", [None, torch.bfloat16], ids=["kv-float32", "kv-bfloat16"])
def test_decode_through_the_fused_step_is_decode_through_the_layers(fmt, bias, kv):
    """The compiled decode step (every layer in one call) gives the tokens of the same
    quantized model run layer by layer, for single and batched decodes, over a float32 or a
    bfloat16 KV cache (written rounded to nearest by both)."""
    kernels = require_kernels()
    layered, fused = tiny(bias), tiny(bias)
    for model in (layered, fused):
        apply_weight_format(model, fmt, torch.float32, kernels)
    step = fused_decode(fused, kernels)
    assert step is not None and step.bits == (4 if fmt == "int4" else 8)
    fused.fuse_decode(step)
    expected = greedy(layered, PROMPTS, 12, kernel=True, kv_dtype=kv)
    assert greedy(fused, PROMPTS, 12, kernel=True, kv_dtype=kv) == expected


def test_the_fused_step_takes_decode_steps_of_many_rows_alike():
    """Up to fused_rows() sequences decode through the fused step (16 on a CPU without AMX
    tiles): eight at once give the tokens of the layers computing with the same quantized
    kernel."""
    from rag.engine.quant import fused_rows

    kernels = require_kernels()
    layered, fused = tiny(), tiny()
    for model in (layered, fused):
        apply_weight_format(model, "int4", torch.float32, kernels)
    for module in [*layered.modules(), *fused.modules()]:
        if isinstance(module, QuantLinear):
            module.decode_rows = 1 << 30  # through the kernel at any size, prefill included
    step = fused_decode(fused, kernels)
    assert step is not None and step.max_rows == fused_rows() >= 4
    fused.fuse_decode(step)
    prompts = [[3 + i, 9, 17 + i, 3] for i in range(8)]
    calls = []
    original = step.kernels.decode_layers

    def counted(x, *rest):  # type: ignore[no-untyped-def]
        calls.append(x.shape[0])
        return original(x, *rest)

    fused.fuse_decode(replace(step, kernels=SimpleNamespace(decode_layers=counted)))
    expected = greedy(layered, prompts, 8, kernel=True, max_seqs=8)
    assert greedy(fused, prompts, 8, kernel=True, max_seqs=8) == expected
    assert max(calls) == min(8, step.max_rows)


def test_int4_decode_computes_with_exactly_the_models_weights():
    """Decode in int4 of a model whose weights are Q4_1-shaped is the float32 model: the same
    greedy tokens, with prefill routed through the quantized kernel too."""
    kernels = require_kernels()
    reference, quantized = tiny(), tiny()
    apply_weight_format(quantized, "int4", torch.float32, kernels)
    for module in quantized.modules():
        if isinstance(module, QuantLinear):
            module.decode_rows = 1 << 30  # every step through the kernel, prefill included
    quantized.fuse_decode(fused_decode(quantized, kernels))
    expected = greedy(reference, PROMPTS, 12, kernel=True)
    assert greedy(quantized, PROMPTS, 12, kernel=True) == expected


@pytest.mark.parametrize("native", [False, True], ids=["avx2", "avx512-bf16"])
def test_int_formats_prefill_through_bfloat16_only_where_it_is_native(monkeypatch, native):
    """Where torch emulates bfloat16 (a CPU without AVX512-BF16 or AMX: a prefill matmul took
    5-10x float32's time on AMD Zen 3), the dense copy prefill multiplies is float32."""
    from rag.engine import quant

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: native, raising=False)
    want = torch.bfloat16 if native else torch.float32
    assert quant.prefill_dtype(torch.device("cpu")) == want
    assert quant.prefill_dtype(torch.device("cuda")) == torch.bfloat16
    model = tiny()
    apply_weight_format(model, "int4", torch.float32, None)
    copies = {m.dense.dtype for m in model.modules() if isinstance(m, QuantLinear)}
    assert copies == {want}
    on_gpu = tiny()
    apply_weight_format(on_gpu, "int4", torch.float32, None, torch.device("cuda"))
    assert {m.dense.dtype for m in on_gpu.modules() if isinstance(m, QuantLinear)} == {
        torch.bfloat16
    }


def test_without_kernels_int_formats_compute_through_their_dense_copy():
    model = tiny()
    apply_weight_format(model, "int4", torch.float32, None)
    assert fused_decode(model, None) is None
    assert all(m.decode_rows == 0 for m in model.modules() if isinstance(m, QuantLinear))
    assert len(greedy(model, PROMPTS, 4, kernel=False)[0]) == 4
