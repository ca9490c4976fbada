"""The passage KV cache: rotated keys are the keys at the new position, a full recompute is
full prefill, the cache stays within its bytes, deletes drop entries, and a passage's KV is
reused across prompts in any order."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from rag.engine.build import engine_for_model  # noqa: E402
from rag.engine.config import EngineSettings  # noqa: E402
from rag.engine.model import AttentionMetadata, rotate_keys  # noqa: E402
from rag.engine.passages import Entry, PassageKVCache  # noqa: E402
from rag.engine.protocol import Segment, SegmentedPrompt  # noqa: E402
from rag.engine.sequence import SamplingParams  # noqa: E402

from .conftest import CharTokenizer  # noqa: E402
from .test_quant import tiny  # noqa: E402


def test_keys_rotated_to_a_new_position_are_the_keys_computed_there():
    """RoPE is relative: the same tokens shifted by d positions give the same hidden states,
    and keys that are the originals rotated by d (every layer, to float32 rounding)."""
    model = tiny()
    cfg = model.cfg
    tokens = torch.tensor([5, 9, 17, 3, 44, 8, 21, 60])
    n, d = len(tokens), 37

    def keys(offset: int) -> torch.Tensor:
        cache = torch.zeros(cfg.num_layers, 2, 16, cfg.num_kv_heads, 4, cfg.head_dim)
        slots = torch.arange(offset, offset + n)
        heads = torch.arange(cfg.num_kv_heads)
        rows = ((slots[:, None] // 4) * cfg.num_kv_heads + heads) * 4 + slots[:, None] % 4
        blocks = torch.arange(16)
        meta = AttentionMetadata(
            kv_rows=rows.flatten(), num_decodes=0, decode_block_tables=None, decode_bias=None,
            prefills=[(0, n, offset + n, blocks)],
            prefill_biases=[torch.arange(offset + n)[None, :] >= offset],
        )  # fmt: skip
        # Positions before `offset` hold nothing: the bias lets each token see only the
        # shifted sequence, causally.
        meta.prefill_biases[0] = meta.prefill_biases[0] & (
            torch.arange(offset + n)[None, :] <= (offset + torch.arange(n))[:, None]
        )
        with torch.inference_mode():
            model(tokens, torch.arange(offset, offset + n), cache, meta)
        k = cache[:, 0].reshape(cfg.num_layers, -1, cfg.head_dim)[:, rows.flatten()]
        return k.view(cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim)

    at_zero, at_d = keys(0), keys(d)
    torch.testing.assert_close(rotate_keys(at_zero, d, model.inv_freq), at_d, rtol=1e-5, atol=1e-5)


def test_the_cache_keeps_within_its_bytes_least_recently_used_out():
    def entry(chunk: int) -> Entry:
        return Entry(torch.zeros(2, 1, 10, 4), torch.zeros(2, 1, 10, 4), 0, chunk)

    size = entry(0).nbytes
    cache = PassageKVCache(capacity_bytes=3 * size)
    for i in range(3):
        cache.put(f"k{i}", entry(i))
    assert cache.get("k0") is not None  # now the most recently used
    cache.put("k3", entry(3))
    assert cache.tokens_of("k1") is None and cache.tokens_of("k0") == 10
    assert cache.used_bytes <= cache.capacity_bytes and cache.stats.evictions == 1
    assert cache.drop_chunks({0, 3}) == 2 and len(cache) == 1


PASSAGES = ["alpha bravo charlie delta echo foxtrot", "golf hotel india juliet kilo", "lima mike"]


def prompt(order: list[int], mode: str) -> SegmentedPrompt:
    text = "sys: answer. " + " ".join(f"[{n}] {PASSAGES[i]}" for n, i in enumerate(order, 1))
    text += " q: what?"
    segs = tuple(Segment(PASSAGES[i], f"t:{i}", chunk_id=i) for i in order)
    return SegmentedPrompt([{"role": "user", "content": text}], segs, mode)  # type: ignore[arg-type]


def run(engine, p: SegmentedPrompt, n: int = 10):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        ids, last = [], None
        async for ev in engine.submit(p, SamplingParams(max_tokens=n, ignore_eos=True)):
            ids += ev.token_ids
            last = ev
        return ids, last.usage

    return asyncio.run(go())


def make(recompute_first: int = 4):  # type: ignore[no-untyped-def]
    settings = EngineSettings(
        device="cpu", dtype="float32", weights="float32", speculative=False, num_kv_blocks=64,
        block_size=4, max_model_len=400, recompute_first=recompute_first, passage_cache_mb=16,
    )  # fmt: skip
    return engine_for_model(tiny(), CharTokenizer(), (), settings)


def test_passages_are_reused_in_another_order_and_counted():
    engine = make()
    try:
        _, first = run(engine, prompt([0, 1, 2], "blend"))
        assert first.reused_prompt_tokens == 0  # all new: computed exactly, then stored
        _, again = run(engine, prompt([2, 0, 1], "blend"))
        total = sum(len(p) for p in PASSAGES)
        assert again.reused_prompt_tokens + again.recomputed_prompt_tokens == total
        assert again.recomputed_prompt_tokens == 3 * 4
        m = engine.metrics().passages
        assert m.hits == 3 and m.misses == 3 and m.entries == 3
        engine.drop_chunks({0})
        assert engine.metrics().passages.entries == 2
        _, after = run(engine, prompt([2, 0, 1], "blend"))
        assert after.reused_prompt_tokens + after.recomputed_prompt_tokens == total - len(
            PASSAGES[0]
        )
    finally:
        engine.close()


def test_recomputing_everything_is_full_prefill():
    """With every token of a reused passage recomputed, blend is the exact computation: the
    same tokens as computing the prompt with no reuse at all."""
    engine = make(recompute_first=1000)
    try:
        run(engine, prompt([0, 1, 2], "blend"))  # fills the cache
        blended, usage = run(engine, prompt([1, 2, 0], "blend"), n=16)
        assert usage.recomputed_prompt_tokens == sum(len(p) for p in PASSAGES)
        exact, _ = run(engine, prompt([1, 2, 0], "off"), n=16)
        assert blended == exact
    finally:
        engine.close()


def test_prefix_mode_reuses_no_passage():
    engine = make()
    try:
        run(engine, prompt([0, 1, 2], "blend"))
        _, usage = run(engine, prompt([2, 0, 1], "prefix"))
        assert usage.reused_prompt_tokens == 0 and usage.recomputed_prompt_tokens == 0
    finally:
        engine.close()
