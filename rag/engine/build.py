"""The composition root of the generator: a local engine (model, KV cache, scheduler, block
manager, runner) or a client of a remote OpenAI-compatible server, from EngineSettings.

Importing this module does not import torch; building a local engine does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rag.engine.blocks import BlockManager
from rag.engine.config import EngineSettings
from rag.engine.engine import Engine
from rag.engine.passages import PassageKVCache, ReuseConfig
from rag.engine.protocol import GenerationBackend, Tokenizer
from rag.engine.scheduler import SchedulerConfig
from rag.engine.spec import SpecConfig
from rag.engine.tokenizer import HFTokenizer
from rag.torch_threads import in_passing_thread

if TYPE_CHECKING:
    import torch

    from rag.engine.model import LlamaModel
    from rag.engine.quant import WeightFormat

logger = logging.getLogger(__name__)


def build_engine(settings: EngineSettings) -> GenerationBackend:
    if settings.backend == "remote":
        from rag.engine.remote import RemoteEngine

        return RemoteEngine(settings)
    return build_local_engine(settings)


def resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_kv_dtype(
    name: str, act_dtype: torch.dtype, device: torch.device, weights: str = "float32"
) -> torch.dtype:
    """auto: bfloat16 on the CPU under int weights (the fast default: a decode step reads half
    the context's bytes, the cache holds twice the tokens, for a perplexity cost that
    bench/engine_accuracy.py measures), else the activations' dtype (float32 weights stay the
    exact reference). A KV format of its own is for the CPU's kernels (they read bfloat16 into
    float32); on CUDA the cache keeps the activations' dtype."""
    import torch

    if name == "auto":
        int_weights = weights in ("int4", "int8", "w8a8")
        if device.type == "cpu" and int_weights and act_dtype == torch.float32:
            return torch.bfloat16
        return act_dtype
    kv = resolve_dtype(name, device)
    if kv != act_dtype and device.type != "cpu":
        raise ValueError(
            f"kv_dtype {name} differs from the activations' {act_dtype}: only on the CPU"
        )
    return kv


def resolve_weights(name: str, device: torch.device, kernels: Any | None) -> WeightFormat:
    """auto, on a CPU with the compiled kernels: w8a8 where its integer kernel has a vector
    path (VNNI or AVX2; 8-bit activations too, so prefill and batched decode steps are faster
    than int4's: bench/engine_matmul.py; its perplexity cost: bench/engine_accuracy.py), else
    int4 (the bundled GGUF's own groups, weight-only); bfloat16 elsewhere."""
    if name != "auto":
        return name  # type: ignore[return-value]
    if device.type != "cpu" or kernels is None:
        return "bfloat16"
    return "w8a8" if kernels.i8_simd() else "int4"


def build_local_engine(settings: EngineSettings) -> Engine:
    """Load the configured model and assemble an engine around it, in a thread of its own:
    the load's torch team must not outlive it, or it would slow every step of the engine's
    thread (rag.torch_threads)."""
    return in_passing_thread(lambda: _load(settings), "engine-build")


def _load(settings: EngineSettings) -> Engine:
    from rag.engine.kernels import kernels
    from rag.engine.loader import load_model

    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.advanced.dtype, device)
    compiled = kernels() if device.type == "cpu" else None
    weights = resolve_weights(settings.advanced.weights, device, compiled)
    loaded = load_model(settings.model_path, settings.cache_dir, device, dtype, weights, compiled)
    return assemble(
        loaded.model, HFTokenizer(loaded.tokenizer), loaded.eos_token_ids, settings, compiled
    )


def engine_for_model(
    model: LlamaModel,
    tokenizer: Tokenizer,
    eos_token_ids: tuple[int, ...],
    settings: EngineSettings,
) -> Engine:
    """An engine around a model built in memory (float32, on the CPU): put in the configured
    weight format, dtype and device. For checks that bring their own weights (a random model
    of a known shape on a GPU machine, tests)."""
    import torch

    from rag.engine.kernels import kernels
    from rag.engine.loader import prepare_model

    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.advanced.dtype, device)
    compiled = kernels() if device.type == "cpu" else None
    weights = resolve_weights(settings.advanced.weights, device, compiled)
    from rag.engine.w8a8 import calibration_for

    hf = getattr(tokenizer, "tok", None)  # an HFTokenizer's own (none: no smoothing)
    calibration = calibration_for(weights, hf) if hf is not None else None
    with torch.no_grad():
        model = prepare_model(model, device, dtype, weights, compiled, calibration)
    return assemble(model, tokenizer, eos_token_ids, settings, compiled)


def assemble(
    model: LlamaModel,
    tokenizer: Tokenizer,
    eos_token_ids: tuple[int, ...],
    settings: EngineSettings,
    compiled: Any | None,
) -> Engine:
    """Size the KV cache and wire scheduler, block manager and runner around a prepared model."""
    from rag.engine.quant import fused_decode
    from rag.engine.runner import KVCacheSpec, ModelRunner, kv_bytes_per_block

    device = next(iter(model.buffers())).device
    dtype = model.act_dtype
    kv_dtype = resolve_kv_dtype(settings.advanced.kv_dtype, dtype, device, model.weight_format)
    if settings.advanced.fused_decode:
        model.fuse_decode(fused_decode(model, compiled))
    cfg = model.cfg
    max_model_len = min(settings.max_model_len or 8192, cfg.max_position_embeddings)
    bs = settings.advanced.block_size
    num_blocks = settings.advanced.num_kv_blocks or max(
        2, settings.kv_cache_mb * 2**20 // kv_bytes_per_block(model, bs, kv_dtype)
    )
    # A lone sequence of max_model_len must always fit, or it could never finish.
    max_model_len = min(max_model_len, num_blocks * bs - 1)
    logger.info(
        "engine: %s, activations %s, weights %s, KV %s, %d KV blocks of %d tokens, context %d",
        device, dtype, model.weight_format, kv_dtype, num_blocks, bs, max_model_len,
    )  # fmt: skip
    passages = None
    if settings.passage_cache_mb:
        import torch

        stored = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
            settings.advanced.passage_cache_dtype, kv_dtype
        )
        passages = PassageKVCache(settings.passage_cache_mb * 2**20, stored, device)
    runner = ModelRunner(
        model,
        KVCacheSpec(num_blocks, bs, kv_dtype),
        device,
        attention_kernel=settings.advanced.cpu_attention_kernel,
        cuda_graphs=settings.advanced.cuda_graphs,
        passages=passages,
        token_texts=tokenizer.token_texts,
    )
    bm = BlockManager(num_blocks, bs, settings.advanced.enable_prefix_caching)
    spec = (
        SpecConfig(k_max=settings.advanced.spec_k_max, max_batch=settings.advanced.spec_max_batch)
        if settings.advanced.speculative
        else None
    )
    sched = SchedulerConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=max_model_len,
        spec=spec,
        itl_target_ms=settings.itl_target_ms,
        reuse=ReuseConfig(
            recompute_first=settings.advanced.recompute_first,
            recompute=settings.advanced.recompute,
            recompute_ratio=settings.advanced.recompute_ratio,
            recompute_last=settings.advanced.recompute_last,
        ),
    )
    return Engine(
        runner, tokenizer, sched, bm, eos_token_ids, settings.max_waiting, passages=passages,
        threads=settings.threads,
        init_threads=None if compiled is None else compiled.init_threads,
    )  # fmt: skip
