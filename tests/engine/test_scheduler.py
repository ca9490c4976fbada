"""Scheduler tests with hand-built runner outputs (no model, no torch)."""

from rag.engine.blocks import BlockManager
from rag.engine.scheduler import Scheduler, SchedulerConfig
from rag.engine.sequence import FinishReason, SequenceStatus
from rag.engine.step import ModelRunnerOutput, SchedulerOutput

from .conftest import make_seq


def make_scheduler(num_blocks=64, block_size=4, budget=16, max_num_seqs=8):
    bm = BlockManager(num_blocks, block_size)
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=1024,
        watermark=0.0,
    )  # fmt: skip
    return Scheduler(cfg, bm), bm


def step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    out = sched.schedule()
    sampled = {c.request_id: token for c in out.chunks if c.sample}
    sched.postprocess(out, ModelRunnerOutput(sampled=sampled))
    return out


def shape(out: SchedulerOutput):
    return [(c.request_id, c.start_pos, len(c.token_ids), c.sample) for c in out.chunks]


def test_chunked_prefill_respects_budget_and_order():
    sched, _ = make_scheduler(budget=16)
    sched.add(make_seq("long", list(range(40))))
    sched.add(make_seq("short", list(range(100, 105))))
    assert shape(step(sched)) == [("long", 0, 16, False)]
    assert shape(step(sched)) == [("long", 16, 16, False)]
    # The long prompt's last chunk, then the short prompt fills the rest of the budget.
    assert shape(step(sched)) == [("long", 32, 8, True), ("short", 0, 5, True)]
    # Both decode now.
    assert shape(step(sched)) == [("long", 40, 1, True), ("short", 5, 1, True)]


def test_decodes_keep_going_while_a_long_prompt_prefills():
    sched, _ = make_scheduler(budget=8)
    sched.add(make_seq("a", [1, 2, 3]))
    step(sched)
    sched.add(make_seq("b", list(range(30))))
    for _ in range(3):
        out = step(sched)
        assert out.chunks[0].request_id == "a" and len(out.chunks[0].token_ids) == 1
        assert out.num_tokens <= 8


def test_max_tokens_finishes_and_frees():
    sched, bm = make_scheduler()
    seq = make_seq("a", [1, 2, 3], max_tokens=3)
    sched.add(seq)
    for _ in range(3):
        step(sched)
    assert seq.status is SequenceStatus.FINISHED and seq.finish_reason is FinishReason.LENGTH
    assert seq.output_token_ids == [7, 7, 7]
    assert bm.num_free_blocks == bm.num_blocks and not sched.has_work


def test_eos_and_stop_token_ids_finish_with_stop():
    sched, _ = make_scheduler()
    a = make_seq("a", [1, 2], eos_token_ids=(7,))
    sched.add(a)
    step(sched, token=7)
    assert a.finish_reason is FinishReason.STOP and a.output_token_ids == [7]


def test_cap_on_running_sequences():
    sched, _ = make_scheduler(max_num_seqs=2, budget=64)
    for i in range(4):
        sched.add(make_seq(f"r{i}", [1, 2, 3]))
    out = step(sched)
    assert [c.request_id for c in out.chunks] == ["r0", "r1"]
    assert len(sched.running) == 2 and len(sched.waiting) == 2


def test_preemption_by_recompute_and_resume():
    # 5 blocks of 4 tokens: two sequences of 8 prompt tokens fill 4 blocks.
    sched, bm = make_scheduler(num_blocks=5, block_size=4, budget=64)
    a = make_seq("a", list(range(8)), max_tokens=8)
    b = make_seq("b", list(range(100, 108)), max_tokens=8)
    sched.add(a)
    sched.add(b)
    step(sched)  # both prefilled: 2 + 2 blocks; 8 tokens computed, 1 sampled each
    out = step(sched)  # a needs a 3rd block (takes the last), b needs one too -> b preempted
    assert out.preempted == ["b"]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_preemptions == 1
    assert b.num_computed_tokens == 0 and b.output_token_ids == [7]  # tokens kept
    while a.status is not SequenceStatus.FINISHED:
        step(sched)
    # b resumes: its prompt plus its generated token are recomputed in one chunk.
    out = step(sched)
    assert shape(out)[0][0] == "b" and shape(out)[0][3] is True
    while b.status is not SequenceStatus.FINISHED:
        step(sched)
    assert b.output_token_ids == [7] * 8 and a.output_token_ids == [7] * 8
    assert bm.num_free_blocks == bm.num_blocks and sched.num_preemptions == 1


def test_resume_after_preemption_reuses_prefix_cache():
    sched, bm = make_scheduler(num_blocks=5, block_size=4, budget=64)
    a = make_seq("a", list(range(8)), max_tokens=8)
    b = make_seq("b", list(range(100, 108)), max_tokens=8)
    sched.add(a)
    sched.add(b)
    step(sched)
    step(sched)  # b preempted; its 2 full prompt blocks stay cached (evictable)
    hits, n = bm.get_computed_blocks(b)
    assert n in (4, 8)  # whatever a's growth did not evict


def test_cancel_frees_every_block_at_once():
    sched, bm = make_scheduler(budget=8)
    a = make_seq("a", list(range(20)))
    b = make_seq("b", list(range(50, 60)))
    sched.add(a)
    sched.add(b)
    step(sched)  # a partially prefilled
    assert bm.num_used_blocks > 0
    assert sched.abort("a") and sched.abort("b")
    assert bm.num_free_blocks == bm.num_blocks and not sched.has_work
    assert a.finish_reason is FinishReason.CANCELLED
    assert not sched.abort("a")  # already gone
    assert sched.schedule().finished == ["a", "b"]  # tells the runner to drop their state


def test_abort_during_step_is_ignored_by_postprocess():
    sched, bm = make_scheduler()
    sched.add(make_seq("a", [1, 2, 3]))
    out = sched.schedule()
    sched.abort("a")
    assert sched.postprocess(out, ModelRunnerOutput(sampled={"a": 5})) == []
    assert bm.num_free_blocks == bm.num_blocks


def test_prefix_hit_skips_computed_tokens():
    sched, bm = make_scheduler(budget=64)
    prompt = list(range(10))
    a = make_seq("a", prompt, max_tokens=1)
    sched.add(a)
    step(sched)
    b = make_seq("b", prompt, max_tokens=1)
    sched.add(b)
    out = step(sched)
    assert shape(out) == [("b", 8, 2, True)]
    assert b.num_cached_tokens == 8 and bm.prefix_cache_hit_rate > 0
