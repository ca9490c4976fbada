"""Continuous batching: which tokens of which sequences go into the next step.

Every step mixes the running sequences' decodes with prefill chunks of new prompts up to a
token budget. When KV blocks run out, the newest running sequence is preempted: its blocks
are freed and it is recomputed later (its tokens are kept, and the prefix cache often brings
most of them back for free). The scheduler talks to the model runner only through the plain
dataclasses of rag.engine.step, so its tests build step results by hand. Features are asked,
not inlined: rag.engine.spec sizes the drafts, rag.engine.passages plans passage reuse.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from rag.engine.blocks import BlockManager
from rag.engine.costs import StepCosts
from rag.engine.passages import PassageLookup, ReuseConfig, ReusePlanner
from rag.engine.sequence import (
    FinishReason,
    ReusePlan,
    Sequence,
    SequenceStatus,
)
from rag.engine.spec import SpecConfig, SpecState, choose_k
from rag.engine.step import ModelRunnerOutput, ScheduledChunk, SchedulerOutput, StepResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    # Keep this fraction of blocks free when admitting new work, so a fresh admission does not
    # immediately force a preemption on the next decode step.
    watermark: float = 0.01
    # Speculative decoding by prompt lookup (rag.engine.spec); None: off.
    spec: SpecConfig | None = None
    # Time between two tokens of a running answer to aim for: while answers are streaming,
    # a step takes in only as many prompt tokens as fit (rag.engine.costs); None: the whole
    # token budget, whatever the step then takes.
    itl_target_ms: float | None = None
    # Prompt tokens a step always admits while answers stream, so prompts still advance.
    min_prefill_chunk: int = 32
    # Passage KV reuse for "blend" prompts (rag.engine.passages), when there is a cache.
    reuse: ReuseConfig = field(default_factory=ReuseConfig)


@dataclass
class StepBudget:
    """What is left of one step while it is filled, and what it yields so far."""

    tokens: int  # tokens in all
    prefill: int  # prompt tokens among them (capped while answers stream)
    drafting: bool  # whether this step's decodes may draft
    # Rows and expected tokens so far, every decode counted: drafts are sized against what
    # the whole step yields per millisecond.
    rows: int
    expected: float


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        passages: PassageLookup | None = None,
    ):
        self.config = config
        self.bm = block_manager
        # Plans passage reuse with the passage KV cache's index (key -> tokens cached).
        self.reuse = (
            ReusePlanner(config.reuse, passages, block_manager.block_size)
            if passages is not None
            else None
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._finished_since_step: list[str] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.num_scheduled_tokens = 0
        self.num_drafted = 0  # draft tokens verified
        self.num_accepted = 0  # of which accepted
        self.costs = StepCosts()  # the engine feeds it the measured step times

    # ----- requests
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._by_id:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        if self.bm.blocks_needed(seq.num_tokens + 1) > self.bm.num_blocks:
            raise ValueError("sequence can never fit in the KV cache")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._by_id[seq.request_id] = seq

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """Finish a request now and free its blocks. False if it is unknown or done."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        self.finish(seq, reason)
        return True

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._by_id.pop(seq.request_id, None)
        self._finished_since_step.append(seq.request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ----- one step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished=self._finished_since_step)
        self._finished_since_step = []
        budget = self._budget()
        self._schedule_running(budget, out)
        if not out.preempted:  # a step that had to preempt admits nothing
            self._admit_waiting(budget, out)
        self.num_steps += 1
        self.num_scheduled_tokens += out.num_tokens
        return out

    def _budget(self) -> StepBudget:
        """The step's token budget. While answers stream, prompt tokens are capped so that
        the step stays near the time-between-tokens target."""
        tokens = self.config.max_num_batched_tokens
        decoding = sum(1 for s in self.running if self._left(s) == 1)
        prefill = tokens
        if self.config.itl_target_ms is not None and decoding:
            # Priced where the next prompt chunk starts: a running prompt's next token, else
            # a new prompt's first.
            start = next((s.num_computed_tokens for s in self.running if self._left(s) > 1), 0)
            prefill = self.costs.prefill_budget(
                decoding, self.config.itl_target_ms, self.config.min_prefill_chunk, tokens, start
            )
        spec = self.config.spec
        drafting = spec is not None and len(self.running) <= spec.max_batch
        return StepBudget(tokens, prefill, drafting, rows=decoding, expected=float(decoding))

    def _schedule_running(self, budget: StepBudget, out: SchedulerOutput) -> None:
        """Running sequences first, oldest first: decodes (with their drafts) and unfinished
        prefills; when blocks run out, the newest running sequences are preempted."""
        i = 0
        while i < len(self.running) and budget.tokens > 0:
            seq = self.running[i]
            i += 1  # preemption only removes sequences after this one
            left = self._left(seq)
            if left > 1 and budget.prefill <= 0:
                continue  # its prompt waits: this step's prompt share is spent
            num_new = min(left, budget.tokens, budget.prefill if left > 1 else 1)
            drafts = self._drafts(seq, budget) if left == 1 else []
            if not drafts and not self._allocate_or_preempt(seq, num_new, out):
                break  # seq preempted itself: nothing after it is left running
            out.chunks.append(self._chunk(seq, num_new, drafts))
            budget.tokens -= num_new + len(drafts)
            if left > 1:
                budget.prefill -= num_new

    def _drafts(self, seq: Sequence, budget: StepBudget) -> list[int]:
        """Draft tokens for a decoding sequence (prompt lookup), within the rest of this
        step's budget, its max_tokens and the context, as many as pay for themselves, with
        blocks to verify them; they join the step's rows and expected tokens."""
        spec = self.config.spec
        room = budget.tokens - 1
        if not budget.drafting or spec is None or room <= 0:
            return []
        if seq.spec is None:
            seq.spec = SpecState()
        state = seq.spec
        if state.pause > 0:
            state.pause -= 1
            return []
        left = self.config.max_model_len - seq.num_tokens - 1
        if seq.params.max_tokens is not None:
            left = min(left, seq.params.max_tokens - seq.num_output_tokens - 1)
        cap = min(spec.k_max, room, left)
        k = choose_k(state, cap, budget.rows, budget.expected, self.costs.decode_ms)
        drafts = state.propose(seq.token_ids, k, spec) if k > 0 else []
        if not drafts or self.bm.allocate_slots(seq, 1 + len(drafts)) is None:
            return []  # none, or no room to verify: decode one token as usual
        budget.rows += len(drafts)
        budget.expected += state.expected_tokens(len(drafts)) - 1
        return drafts

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Allocate for seq, preempting the newest running sequences until it fits."""
        while self.bm.allocate_slots(seq, num_new) is None:
            victim = self.running[-1]  # newest; not scheduled yet in this step
            self._preempt(victim)
            out.preempted.append(victim.request_id)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.plan = None
        seq.exact_until = None
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        logger.debug("preempted request %s (recompute)", seq.request_id)

    def _admit_waiting(self, budget: StepBudget, out: SchedulerOutput) -> None:
        """Waiting sequences, oldest first, while the budget, max_num_seqs and the free blocks
        above the watermark allow: each starts from its cached prefix, planned for reuse."""
        watermark = int(self.config.watermark * self.bm.num_blocks)
        while (
            self.waiting
            and min(budget.tokens, budget.prefill) > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            seq = self.waiting[0]
            hits, num_hit_tokens = self._prefix_hit(seq)
            plan = self.reuse.plan(seq, num_hit_tokens) if self.reuse is not None else None
            num_new, span = self._prefill_span(seq, num_hit_tokens, plan, budget)
            need = self.bm.blocks_needed(num_hit_tokens + span) - len(hits)
            if self.bm.num_free_blocks - need < watermark and self.running:
                break
            if self.bm.allocate_slots(seq, span, hits) is None:
                break
            self.waiting.popleft()
            self._start(seq, num_hit_tokens, plan)
            out.chunks.append(self._chunk(seq, num_new))
            budget.tokens -= num_new
            budget.prefill -= num_new

    def _prefix_hit(self, seq: Sequence) -> tuple[list[int], int]:
        """The cached blocks a waiting sequence starts from, and the tokens they hold: its
        exact prefix, and for a "blend" prompt an earlier blend of the same tokens further
        on (trimmed where reuse would do better)."""
        hits, num_hit_tokens = self.bm.get_computed_blocks(seq)
        exact = num_hit_tokens
        if seq.kv_reuse == "blend":
            hits = hits + self.bm.get_blend_blocks(seq, hits)
            num_hit_tokens = len(hits) * self.bm.block_size
        if self.reuse is not None:
            hits, num_hit_tokens = self.reuse.trim_hit(seq, hits, num_hit_tokens)
        if num_hit_tokens > exact:
            seq.exact_until = exact if seq.exact_until is None else min(seq.exact_until, exact)
        return hits, num_hit_tokens

    def _prefill_span(
        self, seq: Sequence, computed: int, plan: ReusePlan | None, budget: StepBudget
    ) -> tuple[int, int]:
        """Tokens an admitted sequence computes this step, and how many tokens past its
        cached prefix it takes blocks for."""
        if plan is None or not plan.sparse:
            num_new = min(seq.num_tokens - computed, budget.tokens, budget.prefill)
            return num_new, num_new
        # Blocks for the whole prompt at once: the copies land all over it. By deviation in
        # one step: the choice is made over the whole prompt; most of its tokens only go
        # through the first layer.
        num_new = min(plan.left, budget.tokens, budget.prefill)
        if plan.candidates is not None:
            num_new = plan.left
        return num_new, seq.num_tokens - computed

    def _start(self, seq: Sequence, computed: int, plan: ReusePlan | None) -> None:
        """An admitted sequence runs from its first `computed` tokens, already cached."""
        seq.plan = plan
        self.bm.record_prefix_lookup(seq.num_tokens, computed)
        seq.num_computed_tokens = computed
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = computed
        seq.status = SequenceStatus.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        self.running.append(seq)

    def postprocess(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[StepResult]:
        """Advance the scheduled sequences by the step's results; finish those that are done."""
        results: list[StepResult] = []
        for chunk in out.chunks:
            seq = self._by_id.get(chunk.request_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            accepted = result.accepted.get(chunk.request_id, []) if chunk.num_draft else []
            plan = seq.plan
            if chunk.positions is not None and plan is not None:
                plan.done += len(chunk.token_ids)
                if plan.left == 0:  # every position around the copies is computed
                    seq.num_computed_tokens = plan.end
            else:
                # The KV of rejected drafts is not the sequence's: only the decoded token and
                # the accepted drafts count as computed (the rest is overwritten next step).
                seq.num_computed_tokens += len(chunk.token_ids) - chunk.num_draft + len(accepted)
            if plan is not None and seq.num_computed_tokens >= plan.end:
                seq.plan = None
            self.bm.cache_full_blocks(seq)
            if not chunk.sample:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = time.monotonic()
            new: list[int] = []
            reason = None
            for token in [*accepted, result.sampled[chunk.request_id]]:
                seq.append_token(token)
                new.append(token)
                reason = seq.check_stop()
                if reason is not None:
                    break
            if chunk.num_draft and seq.spec is not None and self.config.spec is not None:
                seq.spec.update(self.config.spec, chunk.num_draft, len(accepted))
                self.num_drafted += chunk.num_draft
                self.num_accepted += len(accepted)
            if reason is not None:
                self.finish(seq, reason)
            elif chunk.num_draft:
                self.bm.trim(seq, seq.num_tokens)  # free the blocks of rejected drafts
            results.append(StepResult(seq, new, reason))
        return results

    # ----- internals
    def _left(self, seq: Sequence) -> int:
        """Tokens the sequence still has to compute before it samples."""
        plan = seq.plan
        if plan is not None and plan.sparse:
            return plan.left
        return seq.num_tokens - seq.num_computed_tokens

    def _chunk(
        self, seq: Sequence, num_new: int, drafts: list[int] | None = None
    ) -> ScheduledChunk:
        plan = seq.plan
        if plan is not None and plan.sparse:
            positions = plan.positions[plan.done : plan.done + num_new]
            last = plan.done + num_new == len(plan.positions)
            return ScheduledChunk(
                request_id=seq.request_id,
                token_ids=[seq.token_ids[p] for p in positions],
                start_pos=positions[0],
                block_table=list(seq.block_table),
                sample=last,
                params=seq.params,
                positions=positions,
                copies=plan.copies if plan.done == 0 else (),
                stores=plan.stores if last else (),
                candidates=(
                    plan.candidates[plan.done : plan.done + num_new] if plan.candidates else None
                ),
                recompute_ratio=plan.ratio,
            )
        start = seq.num_computed_tokens
        drafts = drafts or []
        completes = plan is not None and start + num_new == plan.end
        return ScheduledChunk(
            request_id=seq.request_id,
            token_ids=seq.token_ids[start : start + num_new] + drafts,
            start_pos=start,
            block_table=list(seq.block_table),
            sample=start + num_new == seq.num_tokens,
            params=seq.params,
            num_draft=len(drafts),
            history=seq.token_ids if drafts or seq.params.needs_history else None,
            num_prompt=seq.num_prompt_tokens,
            stores=plan.stores if completes and plan is not None else (),
        )
