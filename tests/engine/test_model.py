"""The paged-attention model against transformers' Llama on a tiny random model (fast)."""

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rag.engine.blocks import BlockManager  # noqa: E402
from rag.engine.model import LlamaModel  # noqa: E402
from rag.engine.model_config import ModelConfig  # noqa: E402
from rag.engine.runner import KVCacheSpec, ModelRunner  # noqa: E402
from rag.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402

from .conftest import greedy_paged, make_seq  # noqa: E402


def require_kernel():
    """The compiled decode kernel; CI must be able to build it, elsewhere a missing
    compiler skips."""
    from rag.engine.kernels import paged_decode_kernel

    kernel = paged_decode_kernel()
    if kernel is None:
        if os.environ.get("CI"):
            pytest.fail("the paged-attention kernel did not build (see the log)")
        pytest.skip("the paged-attention kernel could not be built here (no C++ compiler?)")
    return kernel


def tiny_pair(rope_scaling=None):
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, tie_word_embeddings=True, rope_theta=10000.0,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    if rope_scaling:
        hf_cfg.rope_parameters = {"rope_theta": 10000.0, **rope_scaling}
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    ours = LlamaModel(ModelConfig.from_hf(hf_cfg.to_dict()))
    ours.load_hf_state_dict(hf.state_dict())
    return hf, ours.eval()


@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        },
    ],
)  # fmt: skip
@pytest.mark.parametrize("attention_kernel", [False, True], ids=["torch", "kernel"])
def test_paged_greedy_matches_transformers(rope_scaling, attention_kernel):
    if attention_kernel:
        require_kernel()
    hf, ours = tiny_pair(rope_scaling)
    prompts = [[5, 9, 17, 3], list(range(20, 53)), [7] * 11]
    new = 12
    expected = []
    with torch.inference_mode():
        for p in prompts:
            out = hf.generate(
                torch.tensor([p]), max_new_tokens=new, do_sample=False,
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
            )  # fmt: skip
            expected.append(out[0, len(p) :].tolist())
    # Small blocks and budget: chunked prefill, batched decodes and prefix reuse all happen.
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=256), bm
    )
    runner = ModelRunner(
        ours, KVCacheSpec(64, 4), torch.device("cpu"), attention_kernel=attention_kernel
    )
    assert (runner.decode_kernel is not None) == attention_kernel
    seqs = [make_seq(str(i), p, max_tokens=new) for i, p in enumerate(prompts)]
    seqs.append(make_seq("again", prompts[1], max_tokens=new))
    for s in seqs:
        sched.add(s)
    while sched.has_work:
        out = sched.schedule()
        sched.postprocess(out, runner.execute(out))
    got = [s.output_token_ids for s in seqs]
    assert got == expected + [expected[1]]
    assert seqs[-1].num_cached_tokens > 0 or bm.prefix_cache_hit_rate > 0


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"), [(9, 3, 64, 16), (4, 2, 16, 4), (2, 2, 8, 3)]
)
@pytest.mark.parametrize("batch", ["many", "one-long"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_decode_kernel_matches_the_torch_path(
    heads, kv_heads, head_dim, block_size, batch, kv_dtype
):
    """The compiled kernel and the torch path attend the same paged contexts alike: blocks
    scattered through the cache, padded block tables, lengths that end mid-block, one token;
    and one long context split into stretches over the threads, then merged. A bfloat16 cache
    is read into float32 by both."""
    from rag.engine.model import Attention, AttentionMetadata

    kernel = require_kernel()
    gen = torch.Generator().manual_seed(1)
    lens = [1, block_size, block_size + 1, 5 * block_size - 1, 37]
    if batch == "one-long":
        lens = [40 * block_size + 3]
    max_blocks = max(-(-n // block_size) for n in lens)
    num_blocks = len(lens) * max_blocks + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for i, n in enumerate(lens):
        own = order[i * max_blocks : i * max_blocks + -(-n // block_size)]
        tables.append(own + [0] * (max_blocks - len(own)))
    shape = (num_blocks, kv_heads, block_size, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(getattr(torch, kv_dtype))
    v_cache = torch.randn(shape, generator=gen).to(getattr(torch, kv_dtype))
    q = torch.randn(len(lens), heads, head_dim, generator=gen)
    ctx = torch.tensor(lens)
    visible = torch.arange(max_blocks * block_size)[None, :] < ctx[:, None]
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))[:, None, None, :]
    cfg = ModelConfig(
        vocab_size=8, hidden_size=heads * head_dim, intermediate_size=8, num_layers=1,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
    )  # fmt: skip
    attention = Attention(cfg)

    def meta(**kw):
        return AttentionMetadata(
            kv_rows=torch.zeros(0, dtype=torch.long), num_decodes=len(lens),
            decode_block_tables=torch.tensor(tables), prefills=[], prefill_biases=[], **kw,
        )  # fmt: skip

    with torch.inference_mode():
        torch_out = attention._decode(q, k_cache, v_cache, meta(decode_bias=bias))
        kernel_out = attention._decode(
            q, k_cache, v_cache,
            meta(decode_bias=None, decode_kernel=kernel, decode_context_lens=ctx),
        )  # fmt: skip
    assert kernel_out.shape == torch_out.shape
    torch.testing.assert_close(kernel_out, torch_out, rtol=1e-5, atol=1e-5)


def test_decode_kernel_attends_a_sequence_alike_in_any_batch():
    """Bit for bit: a sequence's attention does not depend on the others in the step (its
    context is cut into stretches by its own length), so a token decodes the same alone, in a
    batch, or with speculative drafts beside it."""
    kernel = require_kernel()
    gen = torch.Generator().manual_seed(3)
    lens = [700, 130, 1, 260, 999]
    bs, nb = 16, sum(-(-n // 16) for n in [700, 130, 1, 260, 999])
    k_cache = torch.randn(nb, 3, bs, 64, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(nb, 3, bs, 64, generator=gen).to(torch.bfloat16)
    q = torch.randn(len(lens), 9, 64, generator=gen)
    tables, at = [], 0
    for n in lens:
        tables.append(list(range(at, at + -(-n // bs))))
        at += -(-n // bs)
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    together = kernel(q, k_cache, v_cache, padded, torch.tensor(lens), 0.125)
    for i, n in enumerate(lens):
        alone = kernel(q[i : i + 1].contiguous(), k_cache, v_cache,
                       torch.tensor([tables[i]]), torch.tensor([n]), 0.125)  # fmt: skip
        assert torch.equal(alone[0], together[i])


@pytest.mark.parametrize("attention_kernel", [False, True], ids=["torch", "kernel"])
def test_a_bfloat16_kv_cache_computes_alike_however_the_prompt_is_cut(attention_kernel):
    """float32 activations over a bfloat16 KV cache: a prompt attends to its K/V as the cache
    holds them whether they came from the cache (a later chunk, a prefix hit) or from the
    chunk itself, so chunked prefill, batching and prefix reuse give the tokens of one prompt
    at a time in one chunk; and the cache holds bfloat16."""
    if attention_kernel:
        require_kernel()
    _, ours = tiny_pair()
    prompts = [[5, 9, 17, 3], list(range(20, 53)), [7] * 11, list(range(20, 53))]
    alone = [
        greedy_paged(ours, [p], 12, budget=256, prefix=False, kernel=attention_kernel,
                   kv_dtype=torch.bfloat16)[0]
        for p in prompts
    ]  # fmt: skip
    together = greedy_paged(
        ours, prompts, 12, budget=10, prefix=True, kernel=attention_kernel,
        kv_dtype=torch.bfloat16,
    )  # fmt: skip
    assert together == alone


def prefill_hidden(model, kv, ids, start):
    """The hidden states of `ids` at positions start.. (block i of the sequence is block i of
    `kv`, 4 tokens each), attending to what the cache holds before them."""
    from rag.engine.model import AttentionMetadata

    n, bs, hkv = len(ids), 4, model.cfg.num_kv_heads
    slots = torch.arange(start, start + n)
    heads = torch.arange(hkv)
    rows = ((slots[:, None] // bs) * hkv + heads[None, :]) * bs + slots[:, None] % bs
    blocks = torch.arange(-(-(start + n) // bs))
    meta = AttentionMetadata(
        kv_rows=rows.flatten(), num_decodes=0, decode_block_tables=None, decode_bias=None,
        prefills=[(0, n, start + n, blocks)],
        prefill_runs=[None if start == 0 else ((0, n, start + n),)],
    )  # fmt: skip
    with torch.inference_mode():
        return model(torch.tensor(ids), slots, kv, meta)


def test_a_prompt_attends_to_its_kv_as_a_bfloat16_cache_holds_it():
    """A prompt in one chunk and the same prompt in two (the second reading the first's K/V
    from a bfloat16 cache) agree to float32 rounding, not merely to bfloat16's: the one-chunk
    path attends to its K/V rounded as the cache holds them."""
    _, ours = tiny_pair()
    ids = list(range(20, 53))
    cfg = ours.cfg

    def cache():
        return torch.zeros(cfg.num_layers, 2, 16, cfg.num_kv_heads, 4, cfg.head_dim,
                           dtype=torch.bfloat16)  # fmt: skip

    whole = prefill_hidden(ours, cache(), ids, 0)
    kv = cache()
    prefill_hidden(ours, kv, ids[:13], 0)
    second = prefill_hidden(ours, kv, ids[13:], 13)
    torch.testing.assert_close(second, whole[13:], rtol=1e-5, atol=1e-5)


def test_a_kernel_that_cannot_build_leaves_the_torch_path(monkeypatch, caplog):
    """No compiler (or any build failure): a warning, no kernel, and a runner that asked for
    one attends with torch instead."""
    import torch.utils.cpp_extension as cpp_extension

    from rag.engine import kernels

    def no_compiler(**_kw):
        raise RuntimeError("g++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(kernels, "_loaded", {})  # forget a kernel built earlier
    with caplog.at_level("WARNING", logger="rag.engine.kernels"):
        assert kernels.paged_decode_kernel() is None
    assert "g++: not found" in caplog.text and "torch path" in caplog.text
    _, ours = tiny_pair()
    runner = ModelRunner(ours, KVCacheSpec(8, 4), torch.device("cpu"), attention_kernel=True)
    assert runner.decode_kernel is None


def test_sparse_prefill_runs_attend_as_the_explicit_causal_mask():
    """A chunk of scattered positions over a cached context: attended as runs of consecutive
    positions with the lower-right causal kernel, the same as with the [q, ctx] mask."""
    from rag.engine.model import Attention, AttentionMetadata
    from rag.engine.model_config import ModelConfig
    from rag.engine.rope import position_runs

    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, head_dim, block_size, num_blocks = 6, 2, 8, 4, 16
    cfg = ModelConfig(
        vocab_size=8, hidden_size=heads * head_dim, intermediate_size=8, num_layers=1,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
    )  # fmt: skip
    attention = Attention(cfg)
    positions = [0, 1, 2, 9, 10, 11, 12, 30, 31, 40]
    assert position_runs(positions) == ((0, 3, 3), (3, 4, 13), (7, 2, 32), (9, 1, 41))
    ctx = positions[-1] + 1
    blocks = torch.arange(-(-ctx // block_size))
    x = torch.randn(len(positions), cfg.hidden_size, generator=gen)
    pos = torch.tensor(positions)
    angles = pos[:, None].float() * torch.rand(head_dim // 2, generator=gen)[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    slots = pos
    heads_t = torch.arange(kv_heads)
    rows = ((slots[:, None] // block_size) * kv_heads + heads_t) * block_size + slots[:, None] % 4

    def run(**kw):  # type: ignore[no-untyped-def]
        cache = torch.randn(
            2, num_blocks, kv_heads, block_size, head_dim, generator=gen.manual_seed(7)
        )
        meta = AttentionMetadata(
            kv_rows=rows.flatten(), num_decodes=0, decode_block_tables=None, decode_bias=None,
            prefills=[(0, len(positions), ctx, blocks)], **kw,
        )  # fmt: skip
        with torch.inference_mode():
            return attention(x, cos, sin, cache, meta)

    mask = torch.arange(ctx)[None, :] <= pos[:, None]
    by_runs = run(prefill_runs=[position_runs(positions)])
    by_mask = run(prefill_biases=[mask])
    torch.testing.assert_close(by_runs, by_mask, rtol=1e-5, atol=1e-5)


def test_a_runs_mask_is_built_once_a_step_and_attends_as_torchs_causal_bias():
    """On CPU the runs' lower-right causal masks are built once a step and shared by every
    layer; attention with them equals attention with torch's own CausalBias bit for bit."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import CausalBias, causal_lower_right

    from rag.engine.model import AttentionMetadata

    meta = AttentionMetadata(
        kv_rows=torch.zeros(0, dtype=torch.long), num_decodes=0, decode_block_tables=None,
        decode_bias=None, prefills=[],
    )  # fmt: skip
    first = meta.run_mask(4, 13, torch.device("cpu"))
    assert meta.run_mask(4, 13, torch.device("cpu")) is first  # the next layer's call
    assert not isinstance(first, CausalBias) and first.shape == (4, 13)
    assert isinstance(meta.run_mask(3, 3, torch.device("cpu")), CausalBias)  # plain causal
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 6, 4, 8, generator=gen)
    k, v = torch.randn(1, 2, 13, 8, generator=gen), torch.randn(1, 2, 13, 8, generator=gen)
    ours = F.scaled_dot_product_attention(q, k, v, attn_mask=first, enable_gqa=True)
    torchs = F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(4, 13), enable_gqa=True
    )
    assert torch.equal(ours, torchs)
    # The query at offset i sees positions up to 13 - 4 + i, and none after.
    assert first.sum(dim=1).tolist() == [10, 11, 12, 13]
