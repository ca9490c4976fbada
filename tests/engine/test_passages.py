"""The passage KV cache: rotated keys are the keys at the new position, a full recompute is
full prefill, the cache stays within its bytes, deletes drop entries, and a passage's KV is
reused across prompts in any order."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from rag.engine.build import engine_for_model  # noqa: E402
from rag.engine.config import EngineAdvanced, EngineSettings  # noqa: E402
from rag.engine.model import AttentionMetadata  # noqa: E402
from rag.engine.passages import Entry, PassageKVCache  # noqa: E402
from rag.engine.protocol import Segment, SegmentedPrompt  # noqa: E402
from rag.engine.rope import rotate_keys, rotated_into  # noqa: E402
from rag.engine.sequence import SamplingParams, Sequence  # noqa: E402

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
    # The copy-in's form (into a buffer, from bfloat16 storage too) rotates the same way.
    into = rotated_into(torch.empty_like(at_zero), at_zero, d, model.inv_freq)
    torch.testing.assert_close(into, at_d, rtol=1e-5, atol=1e-5)
    stored = at_zero.bfloat16()
    into = rotated_into(torch.empty_like(at_zero), stored, d, model.inv_freq)
    torch.testing.assert_close(into, rotate_keys(stored.float(), d, model.inv_freq))


def test_the_cache_keeps_within_its_bytes_least_recently_used_out():
    def entry(chunk: int) -> Entry:
        return Entry(torch.zeros(2, 2, 10, 4), 0, chunk)

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


def make(recompute_first: int = 4, stored: str = "auto", **kw):  # type: ignore[no-untyped-def]
    settings = EngineSettings(
        device="cpu",
        max_model_len=400,
        passage_cache_mb=16,
        advanced=EngineAdvanced(
            dtype="float32",
            weights="float32",
            speculative=False,
            num_kv_blocks=64,
            block_size=4,
            recompute_first=recompute_first,
            passage_cache_dtype=stored,
            **kw,
        ),
    )
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
        # (An order of its own: [2, 0, 1] again would find its own blend's blocks.)
        _, after = run(engine, prompt([1, 2, 0], "blend"))
        assert after.reused_prompt_tokens + after.recomputed_prompt_tokens == total - len(
            PASSAGES[0]
        )
    finally:
        engine.close()


def test_a_blend_prompt_asked_again_finds_its_own_blocks_and_exact_prompts_never_do():
    """The blocks a blend computed are cached as approximate: the same blend prompt again
    hits all of them (nothing copied or recomputed, the same answer), while a prefix prompt
    of the same tokens finds only the exact blocks before the first reused passage."""
    engine = make()
    try:
        run(engine, prompt([0, 1, 2], "blend"))  # the passages stored
        first, blended = run(engine, prompt([2, 0, 1], "blend"))
        assert blended.reused_prompt_tokens > 0
        again, repeat = run(engine, prompt([2, 0, 1], "blend"))
        assert again == first
        assert repeat.cached_prompt_tokens >= repeat.prompt_tokens - 4
        assert repeat.reused_prompt_tokens == repeat.recomputed_prompt_tokens == 0
        text = prompt([2, 0, 1], "prefix").messages[0]["content"]
        exact_part = text.index(PASSAGES[2])  # one token a character
        _, exact = run(engine, prompt([2, 0, 1], "prefix"))
        assert exact.cached_prompt_tokens <= exact_part
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


def test_the_last_passages_are_computed_in_place_and_all_of_them_is_full_prefill():
    """recompute_last: the passages nearest the question are computed whole even when
    cached (the others still copied in); with as many as the prompt has, nothing is copied
    and the answer is full prefill's."""
    engine = make(recompute_last=1)
    try:
        run(engine, prompt([0, 1, 2], "blend"))  # fills the cache
        _, usage = run(engine, prompt([1, 2, 0], "blend"), n=16)
        reused = len(PASSAGES[1]) + len(PASSAGES[2])  # passage 0 is last: computed
        assert usage.reused_prompt_tokens + usage.recomputed_prompt_tokens == reused
        assert engine.metrics().passages.entries == 3
    finally:
        engine.close()
    engine = make(recompute_last=3)
    try:
        run(engine, prompt([0, 1, 2], "blend"))
        blended, usage = run(engine, prompt([2, 0, 1], "blend"), n=16)
        assert usage.reused_prompt_tokens == usage.recomputed_prompt_tokens == 0
        exact, _ = run(engine, prompt([2, 0, 1], "off"), n=16)
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


def test_a_delete_drops_the_prefix_blocks_holding_the_chunks_text():
    """Prefix-cached blocks remember the chunks they quote: a delete wipes those blocks (and
    what the prompt after them chained on), while blocks before the passage stay cached."""
    engine = make()
    try:
        run(engine, prompt([0, 1, 2], "prefix"))
        _, warm = run(engine, prompt([0, 1, 2], "prefix"))
        assert warm.cached_prompt_tokens > len("sys: answer. [1] ") + len(PASSAGES[0])
        engine.drop_chunks({1})
        held = [b for b in engine.block_manager.blocks if b.block_hash is not None]
        assert held and all(1 not in b.chunk_ids for b in held)
        assert any(0 in b.chunk_ids for b in held)  # the passage before it stays
        _, after = run(engine, prompt([0, 1, 2], "prefix"))
        start_of_1 = prompt([0, 1, 2], "prefix").messages[0]["content"].index(PASSAGES[1])
        assert 0 < after.cached_prompt_tokens <= start_of_1 + 2  # + the template's "user:"
    finally:
        engine.close()


def test_a_prompt_in_flight_stores_nothing_of_a_chunk_deleted_meanwhile():
    """A delete that lands between two steps of a prompt's prefill: the prompt still runs,
    but stores no KV of the deleted chunk and caches no block from it on."""
    engine = make()
    try:
        ids, spans = engine.tokenizer.encode_segments(prompt([0, 1, 2], "blend"))
        seq = Sequence("r", ids, SamplingParams(max_tokens=4), 400, (), segments=spans,
                       kv_reuse="blend")  # fmt: skip
        engine.scheduler.add(seq)
        engine.scheduler.schedule()  # admitted and planned: all three passages to store
        assert seq.plan is not None and {st[3] for st in seq.plan.stores} == {0, 1, 2}
        engine._apply_drops({2})
        assert {st[3] for st in seq.plan.stores} == {0, 1}
        assert seq.cache_until == next(s.start for s in spans if s.chunk_id == 2)
    finally:
        engine.close()


def test_a_prompt_after_a_delete_computes_the_passage_again():
    engine = make()
    try:
        run(engine, prompt([0, 1, 2], "blend"))
        engine.drop_chunks({2})
        assert engine.passages is not None and len(engine.passages) == 2
        _, usage = run(engine, prompt([2, 1, 0], "blend"))
        assert usage.reused_prompt_tokens + usage.recomputed_prompt_tokens == len(
            PASSAGES[0]
        ) + len(PASSAGES[1])
        assert engine.metrics().passages.entries == 3  # stored again
    finally:
        engine.close()


def test_bfloat16_storage_is_the_float32_kv_rounded():
    """Stored in bfloat16, an entry is its float32 KV to bfloat16 rounding (relative 2^-8),
    half the bytes; reuse from it still runs."""
    exact, half = make(), make(stored="bfloat16")
    try:
        for engine in (exact, half):
            run(engine, prompt([0, 1, 2], "blend"))
        assert exact.passages is not None and half.passages is not None
        a, b = exact.passages.get("t:1"), half.passages.get("t:1")
        assert a is not None and b is not None and b.kv.dtype == torch.bfloat16
        assert b.nbytes * 2 == a.nbytes
        err = (b.kv.float() - a.kv).abs()
        assert bool((err <= a.kv.abs() * 2**-8 + 1e-6).all())
        _, usage = run(half, prompt([2, 1, 0], "blend"))
        assert usage.reused_prompt_tokens > 0
    finally:
        exact.close()
        half.close()


def test_a_bfloat16_kv_cache_holds_twice_the_blocks_and_passages_follow_it():
    """kv_dtype=bfloat16 under float32 activations: kv_cache_mb holds twice the blocks, the
    passage cache stores what the KV cache holds (auto), and reuse copies it back in."""
    from rag.engine.build import resolve_kv_dtype

    sizes = {}
    for kv in ("float32", "bfloat16"):
        settings = EngineSettings(
            device="cpu",
            kv_cache_mb=1,
            max_model_len=400,
            passage_cache_mb=16,
            advanced=EngineAdvanced(
                dtype="float32", weights="float32", speculative=False, kv_dtype=kv, block_size=4
            ),
        )
        engine = engine_for_model(tiny(), CharTokenizer(), (), settings)
        try:
            cache = engine.runner.kv_caches
            assert cache.dtype == getattr(torch, kv)
            sizes[kv] = engine.block_manager.num_blocks
            run(engine, prompt([0, 1, 2], "blend"))
            _, usage = run(engine, prompt([2, 1, 0], "blend"))
            assert usage.reused_prompt_tokens > 0
            entry = engine.passages.get("t:1") if engine.passages is not None else None
            assert entry is not None and entry.kv.dtype == cache.dtype
        finally:
            engine.close()
    assert sizes["bfloat16"] == 2 * sizes["float32"]
    with pytest.raises(ValueError, match="only on the CPU"):
        resolve_kv_dtype("float32", torch.bfloat16, torch.device("cuda"))
    # auto: bfloat16 under int weights on the CPU; float32 weights keep the exact cache.
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_kv_dtype("auto", torch.float32, cpu, "int4") == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32, cpu, "int8") == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32, cpu, "float32") == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16, cuda, "int4") == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32, cuda, "int4") == torch.float32


def test_blend_prompts_survive_preemption_and_cancellation():
    """Too little KV for four blend answers at once: some are preempted (their copies and
    stores planned again when they come back), one is cancelled; every other one finishes
    at its length, and every block is given back."""
    settings = EngineSettings(
        device="cpu",
        max_model_len=200,
        passage_cache_mb=16,
        advanced=EngineAdvanced(
            dtype="float32",
            weights="float32",
            speculative=False,
            num_kv_blocks=64,
            block_size=4,
            recompute_first=4,
        ),
    )
    engine = engine_for_model(tiny(), CharTokenizer(), (), settings)
    try:
        run(engine, prompt([0, 1, 2], "blend"))  # the passages are cached

        async def go() -> list[object]:
            async def one(order: list[int], rid: str) -> object:
                last = None
                params = SamplingParams(max_tokens=40, ignore_eos=True)
                async for ev in engine.submit(prompt(order, "blend"), params, rid):
                    last = ev
                    if rid == "c" and len(ev.token_ids) and last is not None:
                        engine.cancel("c")
                return last.finish_reason if last is not None else None

            orders = [[2, 0, 1], [1, 2, 0], [0, 2, 1], [2, 1, 0]]
            return await asyncio.gather(*[one(o, r) for o, r in zip(orders, "abcd", strict=True)])

        reasons = asyncio.run(go())
        assert [str(r) for r in reasons] == ["length", "length", "cancelled", "length"]
        m = engine.metrics()
        assert m.preemptions > 0 and m.kv_blocks_used == 0
    finally:
        engine.close()


def test_recomputing_by_deviation_everything_is_full_prefill_and_a_share_is_a_share():
    """CacheBlend's choice: with a ratio of 1 every reused token is carried past the first
    layer (the exact computation); with 0.25 a quarter of them are, the rest keep their
    cached KV, and the answer still runs."""
    engine = make(recompute="deviation", recompute_ratio=1.0)
    try:
        run(engine, prompt([0, 1, 2], "blend"))
        blended, usage = run(engine, prompt([1, 2, 0], "blend"), n=16)
        assert usage.recomputed_prompt_tokens == sum(len(p) for p in PASSAGES)
        exact, _ = run(engine, prompt([1, 2, 0], "off"), n=16)
        assert blended == exact
    finally:
        engine.close()
    engine = make(recompute="deviation", recompute_ratio=0.25)
    try:
        run(engine, prompt([0, 1, 2], "blend"))
        tokens, usage = run(engine, prompt([2, 0, 1], "blend"), n=16)
        expected = sum(round(0.25 * len(p)) for p in PASSAGES)
        assert usage.recomputed_prompt_tokens == expected and len(tokens) == 16
        assert usage.reused_prompt_tokens == sum(len(p) for p in PASSAGES) - expected
    finally:
        engine.close()
