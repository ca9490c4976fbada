"""The real SmolLM2-135M against transformers' greedy generate (float32, CPU)."""

import asyncio
import os

import pytest

from rag.engine import EngineAdvanced, EngineSettings, FinishReason, SamplingParams, build_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NEW_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    [{"role": "user", "content": "Write a short poem about the sea, the wind and home."}],
    [
        {"role": "system", "content": "Answer from the passages. Cite them as [n]."},
        {
            "role": "user",
            "content": "[1] The Nile is a major north-flowing river in northeastern Africa. "
            "It flows into the Mediterranean Sea and is about 6,650 km long. "
            "[2] The Amazon River in South America is the largest river by discharge. "
            "Question: Where does the Nile flow?",
        },
    ],
]


async def run_all(engine, prompts, max_tokens=NEW_TOKENS):
    async def one(p):
        ids, last = [], None
        async for ev in engine.submit(p, SamplingParams(max_tokens=max_tokens)):
            ids += ev.token_ids
            last = ev
        return ids, last

    return await asyncio.gather(*[one(p) for p in prompts])


@pytest.fixture(scope="module")
def expected(smollm, hf_reference):
    return [hf_reference(smollm.tokenizer.encode_prompt(p), NEW_TOKENS) for p in PROMPTS]


def test_greedy_matches_transformers_concurrently_and_with_prefix_hits(smollm, expected):
    if os.environ.get("CI"):  # CI builds the decode kernel: this test is its parity check
        assert smollm.runner.decode_kernel is not None
    first = asyncio.run(run_all(smollm, PROMPTS))
    assert [ids for ids, _ in first] == expected
    again = asyncio.run(run_all(smollm, PROMPTS))  # now served from the prefix cache
    assert [ids for ids, _ in again] == expected
    assert sum(last.usage.cached_prompt_tokens for _, last in again) > 0
    assert smollm.metrics().prefix_cache_hit_rate > 0
    assert smollm.metrics().kv_blocks_used == 0
    # Speculative decoding was on (the default) and drafts were verified along the way.
    assert smollm.metrics().draft_tokens > 0


def test_greedy_matches_transformers_across_preemption(smollm, expected):
    # Room for the longest request alone plus a little: the others must be preempted.
    longest = max(len(smollm.tokenizer.encode_prompt(p)) for p in PROMPTS) + NEW_TOKENS
    tiny = build_engine(
        EngineSettings(
            device="cpu",
            max_num_batched_tokens=64,
            advanced=EngineAdvanced(
                dtype="float32",
                weights="float32",
                num_kv_blocks=-(-longest // 4) + 2,
                block_size=4,
                enable_prefix_caching=False,
            ),
        )
    )
    try:
        got = asyncio.run(run_all(tiny, PROMPTS))
        assert tiny.metrics().preemptions > 0
        assert [ids for ids, _ in got] == expected
    finally:
        tiny.close()


def test_cancel_mid_stream_on_the_real_model(smollm):
    async def main():
        stream = smollm.submit(PROMPTS[1], SamplingParams(max_tokens=200))
        n = 0
        async for ev in stream:
            n += 1
            if n == 3:
                smollm.cancel(stream.request_id)
            if ev.finished:
                assert ev.finish_reason is FinishReason.CANCELLED
        for _ in range(200):
            if smollm.metrics().kv_blocks_used == 0:
                break
            await asyncio.sleep(0.01)
        assert smollm.metrics().kv_blocks_used == 0

    asyncio.run(main())


def test_greedy_matches_transformers_on_the_torch_attention_path(smollm, expected):
    """The fallback where the decode kernel cannot be built gives the same tokens."""
    torch_path = build_engine(
        EngineSettings(
            device="cpu",
            max_num_batched_tokens=64,
            advanced=EngineAdvanced(
                dtype="float32", weights="float32", num_kv_blocks=256, cpu_attention_kernel=False
            ),
        )
    )
    try:
        assert torch_path.runner.decode_kernel is None
        got = asyncio.run(run_all(torch_path, PROMPTS))
        assert [ids for ids, _ in got] == expected
    finally:
        torch_path.close()


def test_int4_computes_with_the_ggufs_own_weights(smollm, expected):
    """The bundled GGUF is Q4_1 (its embedding Q8_0): in int4 the engine holds those groups
    exactly, so with every step through the quantized kernel (prefill too) the greedy tokens
    are float32's, which are transformers'. The default routes prefill through a bfloat16 copy
    instead (faster; bench/engine_accuracy.py measures what that costs)."""
    from rag.engine.kernels import kernels
    from rag.engine.quant import QuantLinear

    if kernels() is None:
        pytest.skip("the engine kernels could not be built here")
    int4 = build_engine(
        EngineSettings(
            device="cpu",
            max_num_batched_tokens=64,
            advanced=EngineAdvanced(dtype="float32", weights="int4", num_kv_blocks=256),
        )
    )
    try:
        assert int4.runner.model._fused is not None  # decode steps in one compiled call
        for module in int4.runner.model.modules():
            if isinstance(module, QuantLinear):
                module.decode_rows = 1 << 30
        got = asyncio.run(run_all(int4, PROMPTS))
        assert [ids for ids, _ in got] == expected
    finally:
        int4.close()


def test_markers_the_real_model_writes_point_to_passages_it_was_given(smollm):
    """With the real tokenizer's vocabulary: where the model would cite a passage [7] it
    was never given, with the mask it may write only [1] or [2]."""
    import re

    prompt = [
        {"role": "system", "content": "Answer from the passages. Cite them as [n]."},
        {"role": "user", "content": "[1] Cats sleep a lot. [2] Dogs bark. [7] The Nile flows "
         "into the Mediterranean Sea. Question: Where does the Nile flow? Cite the passage "
         "number."},
    ]  # fmt: skip

    async def answer(params: SamplingParams) -> str:
        text = ""
        async for ev in smollm.submit(prompt, params):
            text += ev.text
        return text

    free = asyncio.run(answer(SamplingParams(max_tokens=40)))
    masked = asyncio.run(answer(SamplingParams(max_tokens=40, cite_passages=2)))
    assert "[7]" in free  # the test would catch a mask that does nothing
    numbers = [int(n) for m in re.findall(r"\[([\d, ]+)\]", masked) for n in m.split(",")]
    assert numbers and all(n in (1, 2) for n in numbers), masked


@pytest.mark.parametrize("init", [True, False])
def test_the_step_thread_keeps_the_team_it_was_given(smollm, init):
    """`threads: 1` sizes the step thread's team alone (the default stays the process's), and
    it stays so through the compiled kernels: their own inline start of torch's threads resized
    it to the default at the first step until the engine called their init_threads."""
    import torch

    from rag.engine.build import assemble
    from rag.engine.kernels import kernels
    from rag.torch_threads import in_passing_thread

    compiled = kernels()
    if compiled is None:
        if os.environ.get("CI"):
            pytest.fail("the engine kernels did not build (see the log)")
        pytest.skip("the engine kernels could not be built here")
    settings = EngineSettings(
        device="cpu", threads=1, max_num_batched_tokens=64, passage_cache_mb=0,
        advanced=EngineAdvanced(dtype="float32", weights="float32", num_kv_blocks=64,
                                fused_decode=False),
    )  # fmt: skip
    # The fixture's model, with a KV cache and a step thread of this engine's own.
    engine = assemble(
        smollm.runner.model, smollm.tokenizer, smollm.eos_token_ids, settings, compiled
    )
    if not init:
        engine._init_threads = None
    teams: list[int] = []
    step = engine._step

    def watched():  # type: ignore[no-untyped-def]
        out = step()
        teams.append(torch.get_num_threads())  # on the step thread
        return out

    engine._step = watched
    default = in_passing_thread(torch.get_num_threads)
    in_passing_thread(lambda: torch.set_num_threads(2))
    try:
        asyncio.run(run_all(engine, PROMPTS[:1], max_tokens=2))
        assert in_passing_thread(torch.get_num_threads) == 2  # the default is left as it was
    finally:
        engine.close()
        in_passing_thread(lambda: torch.set_num_threads(default))
    if init:
        assert teams and set(teams) == {1}, teams
    else:  # resized at the step that first called the kernels (the decode's)
        assert 2 in teams, teams
