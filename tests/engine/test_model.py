"""The paged-attention model against transformers' Llama on a tiny random model (fast)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rag.engine.blocks import BlockManager  # noqa: E402
from rag.engine.model import LlamaModel, ModelConfig  # noqa: E402
from rag.engine.runner import KVCacheSpec, ModelRunner  # noqa: E402
from rag.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402

from .conftest import make_seq  # noqa: E402


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
def test_paged_greedy_matches_transformers(rope_scaling):
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
    runner = ModelRunner(ours, KVCacheSpec(64, 4), torch.device("cpu"))
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
