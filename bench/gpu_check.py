"""The engine alone on a CUDA GPU: parity with transformers in float32, then tokens/s in
bfloat16 at batch 1, 16 and 64 against transformers' `generate` on the same GPU.

    bash bench/gpu_check.sh            # or: python bench/gpu_check.py [--quick]

No model file is needed (the GGUF cannot travel to a GPU machine): a model of SmolLM2-135M's
shape (30 layers, 576 wide, 9 heads on 3 KV heads, vocabulary 49,152) with random weights
(seeded), and a byte tokenizer. No API, no database. Needs torch with CUDA, transformers and
pydantic (rag.engine.config's settings); nothing else of ragserve's dependencies. Under 5
minutes on an H200. Ends with FIGURE lines.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

SMOLLM2_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)  # fmt: skip


# The device checked; `--device cpu` runs the same script on a CPU (slowly: a smoke test).
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class ByteTokenizer:
    """Text as its UTF-8 bytes (ids 3..258): enough to drive the engine without a model."""

    def encode_prompt(self, prompt: object) -> list[int]:
        return self.encode_segments(prompt)[0]

    def encode_segments(self, prompt: object) -> tuple[list[int], list[object]]:
        """The ids and no segment spans: the check's prompts are plain text."""
        messages = getattr(prompt, "messages", prompt)
        text = messages if isinstance(messages, str) else " ".join(m["content"] for m in messages)  # type: ignore[union-attr]
        return [b + 3 for b in text.encode()], []

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t - 3 for t in token_ids if 3 <= t < 259).decode(errors="replace")

    def token_texts(self) -> list[str]:
        """Each id's text, as the runner's citation mask reads it (ids 0..2 have none)."""
        return ["", "", ""] + [bytes([b]).decode("latin-1") for b in range(256)]


def random_models(seed: int = 0):  # type: ignore[no-untyped-def]
    import transformers

    from rag.engine.model import LlamaModel
    from rag.engine.model_config import ModelConfig

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**SMOLLM2_SHAPE)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    ours = LlamaModel(ModelConfig.from_hf(cfg.to_dict()))
    ours.load_hf_state_dict({k: v.detach().clone() for k, v in hf.state_dict().items()})
    return hf, ours.eval()


def engine(model, dtype: str, weights: str, **kw):  # type: ignore[no-untyped-def]
    from rag.engine.build import engine_for_model
    from rag.engine.config import EngineAdvanced, EngineSettings

    settings = EngineSettings(
        device=DEVICE, max_num_seqs=64, max_num_batched_tokens=8192, kv_cache_mb=8192,
        max_waiting=1024,
        advanced=EngineAdvanced(dtype=dtype, weights=weights, speculative=False, **kw),
    )  # fmt: skip
    return engine_for_model(model, ByteTokenizer(), (), settings)


def prompt_text(n_tokens: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    return "".join(chr(rng.randint(97, 122)) for _ in range(n_tokens))


async def generate_all(eng, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], float]:  # type: ignore[no-untyped-def]
    from rag.engine.sequence import SamplingParams

    async def one(p: str) -> list[int]:
        ids: list[int] = []
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        async for ev in eng.submit(p, params):
            ids += ev.token_ids
        return ids

    t0 = time.perf_counter()
    out = await asyncio.gather(*[one(p) for p in prompts])
    sync()
    return list(out), time.perf_counter() - t0


def parity(hf, ours, n_prompts: int, new_tokens: int) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    """Float32 on CUDA (TF32 off): the largest logit difference on a prefill, and greedy
    tokens equal to transformers' (prompts, of how many)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf = hf.to(DEVICE).float()
    eng = engine(ours, "float32", "float32")
    try:
        tok = ByteTokenizer()
        prompts = [prompt_text(40 + 37 * i, seed=i) for i in range(n_prompts)]
        got, _ = asyncio.run(generate_all(eng, prompts, new_tokens))
        same, max_diff = 0, 0.0
        for p, ids in zip(prompts, got, strict=True):
            x = torch.tensor([tok.encode_prompt(p)], device=DEVICE)
            with torch.inference_mode():
                want = hf.generate(
                    x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                    do_sample=False, min_new_tokens=new_tokens,
                )[0, x.shape[1] :].tolist()  # fmt: skip
                logits = hf(x).logits[0, -1].float()
                runner = eng.runner
                hidden = _prefill_hidden(runner, x[0].tolist())
                mine = runner.model.compute_logits(hidden[-1:])[0]
                max_diff = max(max_diff, float((mine - logits).abs().max()))
            same += int(ids == want)
        return max_diff, same, len(prompts)
    finally:
        eng.close()
        hf.cpu()


def _prefill_hidden(runner, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    from rag.engine.sequence import SamplingParams
    from rag.engine.step import ScheduledChunk

    bs = runner.block_size
    table = list(range(-(-len(ids) // bs)))
    chunk = ScheduledChunk("parity", ids, 0, table, True, SamplingParams(max_tokens=1))
    input_ids, positions, meta, _ = runner._prepare([chunk])
    return runner.model(input_ids, positions, runner.kv_caches, meta)


def hf_tokens_per_s(hf, batch: int, prompt_len: int, new_tokens: int) -> float:  # type: ignore[no-untyped-def]
    x = torch.randint(3, 259, (batch, prompt_len), device=DEVICE)
    with torch.inference_mode():
        hf.generate(x[:, :8], max_new_tokens=4, do_sample=False)  # warm up
        sync()
        t0 = time.perf_counter()
        hf.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False,
        )  # fmt: skip
        sync()
    return batch * new_tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer prompts and tokens")
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a smoke test)")
    ap.add_argument("--batches", default="1,16,64")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: this check needs a GPU")
    new = 16 if args.quick else 32
    gen_tokens = 64 if args.quick else 128
    prompt_len = 256 if args.quick else 512
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}", flush=True)

    hf, ours = random_models()
    t0 = time.perf_counter()
    max_diff, same, total = parity(hf, ours, 3 if args.quick else 6, new)
    print(f"parity float32: max |logit diff| {max_diff:.2e}, greedy equal {same}/{total} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip

    hf, ours = random_models()
    hf = hf.to(DEVICE).to(torch.bfloat16)
    eng = engine(ours, "bfloat16", "bfloat16")
    rows = []
    try:
        asyncio.run(generate_all(eng, [prompt_text(64, 0)], 8))  # warm up, captures graphs
        for batch in [int(b) for b in args.batches.split(",")]:
            prompts = [prompt_text(prompt_len, 100 + i) for i in range(batch)]
            got, seconds = asyncio.run(generate_all(eng, prompts, gen_tokens))
            ours_tps = sum(len(g) for g in got) / seconds
            theirs = hf_tokens_per_s(hf, batch, prompt_len, gen_tokens)
            rows.append((batch, ours_tps, theirs))
            print(f"batch {batch}: ragserve {ours_tps:.0f} tok/s, transformers generate "
                  f"{theirs:.0f} tok/s ({ours_tps / theirs:.2f}x)", flush=True)  # fmt: skip
        graphs = eng.runner.graphs
        print(f"cuda graphs: {'on' if graphs is not None and graphs.enabled else 'off'}, "
              f"decode attention: {'triton' if eng.runner.decode_kernel else 'torch'}")  # fmt: skip
    finally:
        eng.close()
    print("\n| batch | ragserve tok/s | transformers generate tok/s | ratio |")
    print("|---|---|---|---|")
    for batch, a, b in rows:
        print(f"| {batch} | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    print(f"FIGURE gpu_greedy_parity {int(same == total)}")
    print(f"FIGURE gpu_max_logit_diff {max_diff:.2e}")
    for batch, a, b in rows:
        print(f"FIGURE gpu_tokens_per_s_vs_hf_b{batch} {a / b:.2f}")
    sys.stdout.flush()
    os._exit(0)  # skip CUDA teardown of a process that is done


if __name__ == "__main__":
    main()
