"""Speculative decoding by prompt lookup: the proposer, the choice of k, verification in the
scheduler (KV rolled back), greedy output unchanged, sampling's distribution kept."""

from __future__ import annotations

import pytest

from rag.engine.blocks import BlockManager
from rag.engine.costs import StepCosts
from rag.engine.scheduler import Scheduler, SchedulerConfig
from rag.engine.sequence import FinishReason
from rag.engine.spec import SpecConfig, SpecState, choose_k, propose
from rag.engine.step import ModelRunnerOutput

from .conftest import make_seq

CONFIG = SpecConfig(k_max=4, min_ngram=2, max_ngram=3)


def test_propose_continues_the_most_recent_earlier_occurrence():
    assert propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 2, CONFIG) == [4, 5]
    # The longest n-gram wins, and the most recent of its occurrences.
    assert propose([7, 8, 1, 2, 6, 1, 2, 5, 8, 1, 2], 3, CONFIG) == [6, 1, 2]
    assert propose([5, 1, 2, 9, 9, 1, 2], 2, CONFIG) == [9, 9]
    assert propose([1, 2, 3, 4], 3, CONFIG) == []  # the tail occurs nowhere earlier
    assert propose([1, 2, 1, 2], 0, CONFIG) == []


def test_the_index_grows_with_the_sequence():
    state, ids = SpecState(), [1, 2, 3, 4, 1, 2]
    assert state.propose(ids, 2, CONFIG) == [3, 4]
    ids += [3, 4, 5]
    assert state.propose(ids, 2, CONFIG) == propose(ids, 2, CONFIG)


def test_drafts_only_when_they_pay_for_their_verification():
    cheap = lambda rows: 10.0 + 1.0 * (rows - 1)  # noqa: E731 (batch 1: rows nearly free)
    dear = lambda rows: 10.0 * rows  # noqa: E731 (each row a whole step)
    sure, unsure = SpecState(alpha=0.9), SpecState(alpha=0.05)
    assert choose_k(sure, 4, 1, 1.0, cheap) == 4
    assert choose_k(unsure, 4, 1, 1.0, cheap) == 0
    assert choose_k(sure, 4, 1, 1.0, dear) == 0
    # A big batch: one more row adds little to what the step already yields.
    assert choose_k(SpecState(alpha=0.6), 4, 16, 16.0, lambda r: 8.0 + 2.0 * r) == 0


def make_scheduler(blocks: int = 64, **kw):
    bm = BlockManager(blocks, 4)
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=1024, watermark=0.0,
        spec=SpecConfig(k_max=3, min_ngram=2, max_ngram=3), **kw,
    )  # fmt: skip
    sched = Scheduler(cfg, bm)
    # Rows cost next to nothing: the scheduler drafts whenever there is a match.
    for rows in range(1, 8):
        sched.costs.observe(rows, 0, 10.0 + 0.1 * rows)
    return sched, bm


def run(sched, answer):
    """One step; the runner's tokens: whatever the `answer` function says per position."""
    out = sched.schedule()
    sampled, accepted = {}, {}
    for c in out.chunks:
        if not c.sample:
            continue
        if c.num_draft:
            drafts = c.token_ids[-c.num_draft :]
            truth = [answer(c.start_pos + 1 + i) for i in range(c.num_draft + 1)]
            n = 0
            while n < len(drafts) and drafts[n] == truth[n]:
                n += 1
            accepted[c.request_id], sampled[c.request_id] = drafts[:n], truth[n]
        else:
            sampled[c.request_id] = answer(c.start_pos + len(c.token_ids))
    return out, sched.postprocess(out, ModelRunnerOutput(sampled, accepted))


def test_accepted_drafts_advance_several_tokens_and_rejected_ones_give_their_blocks_back():
    sched, bm = make_scheduler()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    seq = make_seq("a", prompt, max_tokens=20)
    sched.add(seq)
    # The model "continues" the prompt's pattern: position p gets token prompt[p % 10].
    truth = lambda p: (p % 10) + 1  # noqa: E731
    run(sched, truth)  # prefill: samples 3
    out, results = run(sched, truth)  # [3] + drafts [4, 5, 6]: all right
    (chunk,) = out.chunks
    assert chunk.num_draft == 3 and chunk.token_ids == [3, 4, 5, 6]
    assert results[0].new_token_ids == [4, 5, 6, 7]
    assert seq.num_computed_tokens == seq.num_tokens - 1
    # Now the model disagrees with the pattern from some position on: drafts are rejected.
    wrong = lambda p: 99 if p >= len(seq.token_ids) + 1 else truth(p)  # noqa: E731
    out, results = run(sched, wrong)
    (chunk,) = out.chunks
    assert chunk.num_draft > 0 and results[0].new_token_ids == [*chunk.token_ids[1:2], 99]
    assert seq.num_computed_tokens == seq.num_tokens - 1
    assert len(seq.block_table) == bm.blocks_needed(seq.num_tokens)  # rolled back
    assert sched.num_accepted < sched.num_drafted


def test_drafts_stop_at_max_tokens_and_a_stop_token_mid_draft_finishes():
    sched, bm = make_scheduler()
    seq = make_seq("a", [1, 2, 3, 1, 2], max_tokens=3, eos_token_ids=(3,))
    sched.add(seq)
    run(sched, lambda p: 9)  # prefill -> 9, no match for [2, 9]
    assert seq.output_token_ids == [9]
    sched2, _ = make_scheduler()
    seq2 = make_seq("b", [1, 2, 3, 4, 1, 2], max_tokens=10, eos_token_ids=(4,))
    sched2.add(seq2)
    run(sched2, lambda p: (p % 4) + 1)  # prefill samples 3
    out, results = run(sched2, lambda p: (p % 4) + 1)  # drafts [4, 1, 2]: 4 is EOS
    assert results[0].finish_reason is FinishReason.STOP
    assert seq2.output_token_ids == [3, 4]  # nothing after the stop token is kept
    assert sched2.bm.num_free_blocks == sched2.bm.num_blocks


def test_no_drafts_above_the_batch_cap():
    sched, _ = make_scheduler()
    sched.config = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024, watermark=0.0,
        spec=SpecConfig(max_batch=2),
    )  # fmt: skip
    for i in range(3):
        sched.add(make_seq(f"s{i}", [1, 2, 3, 1, 2], max_tokens=8))
    run(sched, lambda p: 3)
    out, _ = run(sched, lambda p: 3)
    assert all(c.num_draft == 0 for c in out.chunks)


def test_step_costs_learn_and_size_the_prefill_share():
    costs = StepCosts()
    for _ in range(30):
        costs.observe(2, 0, 20.0)
        costs.observe(2, 100, 70.0)  # 50 ms for 100 prompt tokens
    assert costs.decode_ms(2) == pytest.approx(20.0, rel=0.01)
    assert costs.token_ms() == pytest.approx(0.5, rel=0.05)
    assert costs.prefill_budget(2, 100.0, 16, 512) == pytest.approx(160, abs=10)
    assert costs.prefill_budget(2, 10.0, 16, 512) == 16  # over the target: the floor


def test_itl_target_caps_prompt_tokens_while_answers_stream():
    bm = BlockManager(256, 4)
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512, max_model_len=2048, watermark=0.0,
        itl_target_ms=60.0, min_prefill_chunk=16,
    )  # fmt: skip
    sched = Scheduler(cfg, bm)
    for _ in range(10):
        sched.costs.observe(1, 0, 20.0)
        sched.costs.observe(1, 100, 120.0)  # 1 ms a prompt token
    sched.add(make_seq("a", [1, 2, 3]))
    out = sched.schedule()  # nothing streams yet: the whole budget
    sched.postprocess(out, ModelRunnerOutput({"a": 5}))
    sched.add(make_seq("b", list(range(1000))))
    out = sched.schedule()
    prompt = [c for c in out.chunks if c.request_id == "b"]
    assert prompt and len(prompt[0].token_ids) == pytest.approx(40, abs=4)  # (60 - 20) / 1


torch = pytest.importorskip("torch")


def test_greedy_with_drafts_is_greedy_without(tmp_path):
    """On a real (tiny, random) model, through the runner: the same tokens with and without
    drafting, and drafts were in fact verified."""
    from .conftest import generate_drafting
    from .test_quant import tiny

    prompts = [[5, 9, 17, 3] * 4, list(range(20, 40)) * 2, [7, 8] * 6]

    def generate(spec):  # type: ignore[no-untyped-def]
        return generate_drafting(tiny(), prompts, spec, attention_kernel=True)

    plain, _ = generate(None)
    drafted, verified = generate(SpecConfig(k_max=4))
    assert drafted == plain
    assert verified > 0


def test_verifying_drafts_keeps_the_sampling_distribution():
    """Speculative sampling with a sure draft: the first token is distributed as without
    drafts (accepted with p(draft), else drawn from the rest), whatever the draft."""
    from rag.engine.sampler import Sampler
    from rag.engine.sequence import SamplingParams

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    params = SamplingParams(temperature=0.8, seed=123)
    p = Sampler.probs(logits, params)
    n = 20_000
    for draft in (0, 3):
        sampler = Sampler(torch.device("cpu"))
        counts = torch.zeros(5)
        rows = torch.stack([logits, logits])
        for _ in range(n):
            counts[sampler.verify(rows, "r", params, [draft])[0]] += 1
        freq = counts / n
        # Four standard errors of a binomial proportion, per token.
        assert torch.all((freq - p).abs() <= 4 * torch.sqrt(p * (1 - p) / n) + 1e-3), (draft, freq)


def test_step_costs_price_a_prompt_token_by_how_far_into_its_prompt_it_is():
    """Tokens further into a prompt attend to more and cost more: the budget of a chunk that
    starts deep in its prompt is smaller than one at the start, and both follow the line
    through the two averages."""
    costs = StepCosts()
    for _ in range(30):
        costs.observe(2, 0, 20.0)
        costs.observe(2, 100, 70.0, position=100.0)  # 0.5 ms a token near the start
        costs.observe(2, 100, 120.0, position=1100.0)  # 1.0 ms a token further on
    assert costs.token_ms(100.0) == pytest.approx(0.5, rel=0.02)
    assert costs.token_ms(1100.0) == pytest.approx(1.0, rel=0.02)
    assert costs.token_ms(600.0) == pytest.approx(0.75, rel=0.02)
    near = costs.prefill_budget(2, 100.0, 16, 512, start=0)
    far = costs.prefill_budget(2, 100.0, 16, 512, start=1500)
    assert near > far
    assert far == pytest.approx(80 / 1.2, abs=3)  # ~1.2 ms a token around position 1530
    assert costs.prefill_budget(2, 100.0, 16, 512) == pytest.approx(80 / costs.token_ms(), abs=2)


def test_a_steps_prompt_position_is_the_mean_over_its_prompt_tokens():
    from rag.engine.sampler import SamplingParams
    from rag.engine.step import ScheduledChunk, SchedulerOutput

    p = SamplingParams()
    out = SchedulerOutput(
        chunks=[
            ScheduledChunk("d", [7], 500, [0], True, p),  # a decode: not a prompt token
            ScheduledChunk("v", [7, 8, 9], 300, [1], True, p, num_draft=2),  # drafts: neither
            ScheduledChunk("a", [1, 2, 3, 4], 10, [2], False, p),  # positions 10..13
            ScheduledChunk("b", [5, 6], 0, [3], True, p, positions=[40, 60]),
        ]
    )
    assert out.prefill_position == pytest.approx((10 + 11 + 12 + 13 + 40 + 60) / 6)
    assert SchedulerOutput(chunks=out.chunks[:2]).prefill_position is None
