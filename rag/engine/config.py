"""Settings of the generator engine (no torch here: the app's Settings imports this)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rag.deprecated import Upgrading


class EngineAdvanced(BaseModel):
    """Weight and cache formats, kernels, speculation and passage blending: research switches
    chosen by measurement (bench/engine_*.py, bench/ttft.py; docs/decisions.md). The defaults are
    what the benches chose; a deployment needs none of them."""

    model_config = ConfigDict(extra="forbid")

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Activations and KV cache. auto = float32 on CPU, bfloat16 on CUDA.",
    )
    kv_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="The KV cache's format, apart from the activations'. bfloat16 halves what "
        "a decode step reads of the context and holds twice the tokens in kv_cache_mb; "
        "activations stay in dtype. auto = bfloat16 on CPU under int4/int8/w8a8 weights "
        "(its perplexity cost: bench/generate.py), else as dtype (float32 weights stay exact).",
    )
    weights: Literal["auto", "float32", "bfloat16", "int8", "int4", "w8a8"] = Field(
        default="auto",
        description="The linears' weight format (rag.engine.quant). auto = w8a8 on a CPU with "
        "VNNI or AVX2 (8-bit weights and activations, multiplied as integers: rag.engine.w8a8), "
        "int4 on older CPUs (the bundled GGUF's own Q4_1 groups: decode reads an eighth of "
        "float32's bytes, prefill a dense copy: bfloat16 with AVX512-BF16 or AMX, float32 where "
        "bfloat16 is emulated), bfloat16 on CUDA.",
    )
    block_size: int = Field(default=16, ge=1, le=1024)
    num_kv_blocks: int | None = Field(
        default=None, ge=2, description="None = sized from kv_cache_mb."
    )
    enable_prefix_caching: bool = True
    passage_cache_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="How the passage cache stores KV: auto = as the paged KV cache does; "
        "bfloat16 holds twice the passages in the same memory (copies are turned back into "
        "the KV cache's format).",
    )
    recompute_first: int = Field(
        default=8,
        ge=0,
        description="Tokens at the start of each reused passage recomputed in place (what "
        "repairs the attention its cached KV could not have to this prompt's other passages).",
    )
    recompute: Literal["first", "deviation"] = Field(
        default="first",
        description="Which tokens of a reused passage are recomputed: its first "
        "recompute_first tokens (EPIC), or those whose values deviate most from the cached "
        "ones after the first layer, recompute_ratio of them (CacheBlend): every token of "
        "the prompt goes through the first layer, the chosen ones through the rest.",
    )
    recompute_ratio: float = Field(
        default=0.15, ge=0.0, le=1.0, description="The share recomputed by deviation."
    )
    recompute_last: int = Field(
        default=0,
        ge=0,
        description="The last passages of a blend prompt (those nearest the question) computed "
        "whole in place even when cached: the question reads them most closely, and their "
        "cached KV, computed without the passages before them, costs the most fidelity "
        "(fidelity and cost: bench/ttft.py).",
    )
    speculative: bool = Field(
        default=True,
        description="Speculative decoding by prompt lookup: draft the tokens that followed the "
        "last few in the prompt or the answer so far, verify them in one pass (greedy output "
        "unchanged; sampling keeps its distribution).",
    )
    spec_k_max: int = Field(default=4, ge=1, le=16, description="Draft tokens per step, at most.")
    spec_max_batch: int = Field(
        default=4, ge=1, description="No drafting above this many running sequences."
    )
    fused_decode: bool = Field(
        default=True,
        description="On CPU with int weights and float32 activations, run the decoder layers "
        "of a step of single tokens in one compiled call (rag/engine/csrc/decode.cpp) rather "
        "than as thirty layers of small torch ops.",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="On CUDA, capture decode steps as CUDA graphs by batch size and context "
        "length bucket (replayed instead of launching each kernel); checked against the eager "
        "step at capture, and turned off if they disagree.",
    )
    cpu_attention_kernel: bool = Field(
        default=True,
        description="On CPU in float32, attend decode tokens with ragserve's compiled "
        "paged-attention kernel (built on first start, needs a C++ compiler; without one the "
        "torch path is used).",
    )


class EngineSettings(Upgrading):
    """How the generator runs: a local paged-KV engine or a remote OpenAI-compatible server."""

    model_config = ConfigDict(extra="forbid")

    path = "engine"

    backend: Literal["local", "remote"] = "local"
    load_at_start: bool = Field(
        default=True,
        description="The API builds the generator in the background as it starts (/readyz "
        "reports it loading), so the first question does not wait for the model; false: "
        "built on the first question.",
    )

    # Local backend.
    model_path: str | None = Field(
        default=None,
        description="None = the bundled SmolLM2-135M-Instruct GGUF; else a GGUF file or a "
        "Hugging Face safetensors folder (Llama family).",
    )
    cache_dir: str | None = Field(
        default=None, description="Converted-weights cache; None = ~/.cache/ragserve/engine."
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(
        default=None, ge=1,
        description="Threads of the engine's steps on the CPU; None = the process's default.",
    )  # fmt: skip
    kv_cache_mb: int = Field(default=1024, ge=1)
    max_num_seqs: int = Field(default=32, ge=1, description="Cap on running sequences.")
    max_num_batched_tokens: int = Field(
        default=512, ge=1, description="Token budget of one step (prefill chunks + decodes)."
    )
    itl_target_ms: float | None = Field(
        default=None,
        gt=0,
        description="Time between two tokens of a streaming answer to aim for: while answers "
        "stream, each step admits only as many prompt tokens as fit (the cost per token is "
        "measured as the engine runs). None: every step takes the whole token budget.",
    )
    max_waiting: int = Field(
        default=256, ge=0, description="Bounded waiting queue; beyond it submit() refuses."
    )
    max_model_len: int | None = Field(
        default=None, ge=2, description="Context length; None = the model's (capped at 8192)."
    )
    kv_reuse: Literal["blend", "prefix", "off"] = Field(
        default="prefix",
        description="How grounded answers reuse prompt KV when neither the request nor the "
        "collection says: blend = each passage's cached KV at its new position (the passage "
        "cache: a faster first token, answers not token-identical to full prefill), prefix = "
        "only an identical prompt prefix (exact), off = compute every prompt whole. Prefix "
        "until blend's fidelity meets the bar (token F1 within 0.01 of full prefill, "
        "bench/ttft.py).",
    )
    passage_cache_mb: int = Field(
        default=1024,
        ge=0,
        description="The passage KV cache (rag.engine.passages): each passage's KV kept for "
        "reuse in later prompts (what a token costs: the model's layers x KV heads x head "
        "size x 2 x the stored format's bytes). 0 turns it off.",
    )

    advanced: EngineAdvanced = EngineAdvanced()

    # Remote backend (an OpenAI-compatible server such as vLLM).
    remote_url: str | None = Field(default=None, description="e.g. http://vllm:8000/v1")
    remote_model: str | None = None
    remote_api_key: str | None = Field(default=None, repr=False)
    remote_timeout_s: float = Field(default=120.0, gt=0)
    remote_max_concurrency: int = Field(default=64, ge=1)
