"""The passage reuse planner on its own: what a "blend" prompt copies from the passage cache,
recomputes in place and stores, planned from a hand-built cache index (no model, no torch)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rag.engine.blocks import BlockManager
from rag.engine.passages import ReuseConfig, ReusePlanner
from rag.engine.scheduler import Scheduler, SchedulerConfig
from rag.engine.sequence import SegmentSpan, Sequence
from rag.engine.step import ModelRunnerOutput

from .conftest import make_seq

# A prompt of 30 tokens: a header [0, 4), passage "a" [4, 12), a header [12, 14), passage "b"
# [14, 24), the question [24, 30).
A = SegmentSpan(4, 12, "a", chunk_id=1)
B = SegmentSpan(14, 24, "b", chunk_id=2)
HELD = {"a": 8, "b": 10}


def blend(segments: list[SegmentSpan] | None = None, kv_reuse: str = "blend") -> Sequence:
    return make_seq("r", list(range(100, 130)), segments=segments or [A, B], kv_reuse=kv_reuse)


def planner(held: dict[str, int], **config: Any) -> ReusePlanner:
    return ReusePlanner(ReuseConfig(**config), held.get, block_size=4)


def test_held_passages_are_copied_and_their_first_tokens_recomputed():
    p, seq = planner(HELD, recompute_first=2), blend()
    plan = p.plan(seq, 0)
    assert plan is not None and plan.sparse and plan.end == 30
    assert plan.copies == (("a", 4, 8), ("b", 14, 10))
    assert plan.stores == ()
    assert plan.positions == [*range(0, 6), *range(12, 16), *range(24, 30)]
    assert plan.candidates is None
    assert (seq.num_reused_tokens, seq.num_recomputed_tokens) == (6 + 8, 2 + 2)
    assert (p.num_hits, p.num_misses, p.num_recomputed_tokens) == (2, 0, 4)
    # From the first copy on, the prompt's KV is approximate: never an exact prefix.
    assert seq.exact_until == 4


def test_new_passages_are_computed_as_usual_and_stored():
    p, seq = planner({}), blend()
    plan = p.plan(seq, 0)
    assert plan is not None and not plan.sparse
    assert plan.stores == (("a", 4, 8, 1), ("b", 14, 10, 2))
    assert plan.positions == list(range(30))
    assert (p.num_hits, p.num_misses) == (0, 2)
    assert seq.exact_until is None


def test_a_passage_cached_at_another_length_is_computed_again():
    p, seq = planner({"a": 8, "b": 9}, recompute_first=2), blend()
    plan = p.plan(seq, 0)
    assert plan is not None
    assert plan.copies == (("a", 4, 8),)
    assert plan.stores == (("b", 14, 10, 2),)
    assert plan.positions == [*range(0, 6), *range(12, 30)]


def test_the_last_passages_are_computed_whole_and_not_stored_again():
    p, seq = planner(HELD, recompute_first=2, recompute_last=1), blend()
    plan = p.plan(seq, 0)
    assert plan is not None
    assert plan.copies == (("a", 4, 8),) and plan.stores == ()
    assert plan.positions == [*range(0, 6), *range(12, 30)]
    assert planner(HELD, recompute_last=2).plan(blend(), 0) is None  # nothing copied or stored


def test_by_deviation_every_token_is_a_position_and_reused_ones_are_candidates():
    p, seq = planner(HELD, recompute="deviation", recompute_ratio=0.5), blend()
    plan = p.plan(seq, 0)
    assert plan is not None and plan.ratio == 0.5
    assert plan.positions == list(range(30))
    assert plan.candidates == [False] * 4 + [True] * 8 + [False] * 2 + [True] * 10 + [False] * 6
    assert (seq.num_reused_tokens, seq.num_recomputed_tokens) == (4 + 5, 4 + 5)


def test_passages_inside_the_prefix_hit_are_left_as_they_are():
    p, seq = planner(HELD, recompute_first=2), blend()
    plan = p.plan(seq, 12)  # "a" and its header are cached as a prefix already
    assert plan is not None
    assert plan.copies == (("b", 14, 10),)
    assert plan.positions == [*range(12, 16), *range(24, 30)]
    assert p.num_hits == 1


def test_a_cut_passage_and_prompts_that_reuse_nothing_have_no_plan():
    cut = SegmentSpan(24, 40, "c")
    assert planner({"c": 16}).plan(blend([cut]), 0) is None
    assert planner(HELD).plan(blend(kv_reuse="prefix"), 0) is None
    assert planner(HELD).plan(make_seq("r", list(range(30)), kv_reuse="blend"), 0) is None


def test_a_preempted_prompt_is_planned_again_but_counted_once():
    p, seq = planner(HELD, recompute_first=2), blend()
    seq.num_preemptions = 1
    assert p.plan(seq, 0) is not None
    assert (p.num_hits, p.num_misses, p.num_recomputed_tokens) == (0, 0, 0)
    assert seq.num_reused_tokens == seq.num_recomputed_tokens == 0


def test_a_hit_a_few_tokens_into_a_held_passage_stops_before_it():
    seq = blend()
    # Blocks of 4: the hit [0, 8) ends 4 tokens into "a" (which starts at 4).
    assert planner(HELD, recompute_first=8).trim_hit(seq, [10, 11], 8) == ([10], 4)
    # As far into it as a copy would recompute anyway: the exact hit is kept.
    assert planner(HELD, recompute_first=4).trim_hit(seq, [10, 11], 8) == ([10, 11], 8)
    assert planner({}, recompute_first=8).trim_hit(seq, [10, 11], 8) == ([10, 11], 8)
    prefix = blend(kv_reuse="prefix")
    assert planner(HELD, recompute_first=8).trim_hit(prefix, [10, 11], 8) == ([10, 11], 8)


def test_a_swapped_config_applies_to_the_next_plan():
    p = planner(HELD, recompute_first=2)
    p.config = dataclasses.replace(p.config, recompute_first=8)
    plan = p.plan(blend(), 0)
    assert plan is not None and plan.positions[:12] == list(range(12))


def test_the_scheduler_admits_a_blend_prompt_as_planned():
    config = SchedulerConfig(4, 64, 256, watermark=0.0, reuse=ReuseConfig(recompute_first=2))
    sched, seq = Scheduler(config, BlockManager(64, 4), HELD.get), blend()
    sched.add(seq)
    out = sched.schedule()
    (chunk,) = out.chunks
    assert chunk.positions == [*range(0, 6), *range(12, 16), *range(24, 30)]
    assert chunk.copies == (("a", 4, 8), ("b", 14, 10)) and chunk.sample
    assert len(seq.block_table) == 8  # blocks for the whole prompt: the copies land in them
    sched.postprocess(out, ModelRunnerOutput(sampled={"r": 7}))
    assert seq.num_computed_tokens == 30 and seq.plan is None
    assert sched.reuse is not None and sched.reuse.num_hits == 2


def test_without_a_passage_cache_a_blend_prompt_is_computed_as_usual():
    sched, seq = Scheduler(SchedulerConfig(4, 64, 256), BlockManager(64, 4)), blend()
    sched.add(seq)
    (chunk,) = sched.schedule().chunks
    assert sched.reuse is None and seq.plan is None
    assert chunk.positions is None and chunk.start_pos == 0 and len(chunk.token_ids) == 30
