"""Continuous batching: which tokens of which sequences go into the next step.

Every step mixes the running sequences' decodes with prefill chunks of new prompts up to a
token budget. When KV blocks run out, the newest running sequence is preempted: its blocks
are freed and it is recomputed later (its tokens are kept, and the prefix cache often brings
most of them back for free). The scheduler talks to the model runner only through the plain
dataclasses of rag.engine.step, so its tests build step results by hand.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rag.engine.blocks import BlockManager
from rag.engine.costs import StepCosts
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
    # Passage KV reuse ("blend" prompts, rag.engine.passages): the first tokens of each
    # reused passage that are recomputed in place; or ("deviation") every token through the
    # first layer, then the `recompute_ratio` of each reused passage that deviate most.
    recompute_first: int = 8
    recompute: str = "first"
    recompute_ratio: float = 0.15
    # The last passages of a prompt (those nearest the question, which it reads most closely)
    # computed whole in place even when cached: their cached KV misses the most.
    recompute_last: int = 0


PassageLookup = Callable[[str], "int | None"]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        passages: PassageLookup | None = None,
    ):
        self.config = config
        self.bm = block_manager
        # The passage KV cache's index (key -> tokens cached), for planning reuse.
        self.passages = passages
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._finished_since_step: list[str] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.num_scheduled_tokens = 0
        self.num_drafted = 0  # draft tokens verified
        self.num_accepted = 0  # of which accepted
        self.num_passage_hits = 0  # passages copied from the passage cache
        self.num_passage_misses = 0  # passages computed (and stored)
        self.num_recomputed_tokens = 0  # tokens of reused passages recomputed in place
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
        budget = self.config.max_num_batched_tokens

        # While answers stream, prompt tokens are capped so that the step stays near the
        # time-between-tokens target.
        decoding = sum(1 for s in self.running if self._left(s) == 1)
        prefill_left = budget
        if self.config.itl_target_ms is not None and decoding:
            # Priced where the next prompt chunk starts: a running prompt's next token, else
            # a new prompt's first.
            start = next((s.num_computed_tokens for s in self.running if self._left(s) > 1), 0)
            prefill_left = self.costs.prefill_budget(
                decoding, self.config.itl_target_ms, self.config.min_prefill_chunk, budget, start
            )
        # Drafts are sized against what the whole step yields per millisecond.
        spec = self.config.spec
        drafting = spec is not None and len(self.running) <= spec.max_batch
        rows, expected = decoding, float(decoding)

        # 1. Running sequences first, oldest first: decodes and unfinished prefills.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            left = self._left(seq)
            if left > 1 and prefill_left <= 0:
                i += 1
                continue  # its prompt waits: this step's prompt share is spent
            num_new = min(left, budget, prefill_left if left > 1 else 1)
            drafts: list[int] = []
            if drafting and left == 1:
                drafts = self._drafts(seq, budget - 1, rows, expected)
            if drafts and self.bm.allocate_slots(seq, 1 + len(drafts)) is None:
                drafts = []  # no room to verify: decode one token as usual
            if not drafts and not self._allocate_or_preempt(seq, num_new, out):
                break  # seq preempted itself: nothing after it is left running
            out.chunks.append(self._chunk(seq, num_new, drafts))
            if drafts and seq.spec is not None:
                rows += len(drafts)
                expected += seq.spec.expected_tokens(len(drafts)) - 1
            budget -= num_new + len(drafts)
            if left > 1:
                prefill_left -= num_new
            i += 1

        # 2. Admit waiting sequences, unless this step had to preempt.
        if not out.preempted:
            watermark = int(self.config.watermark * self.bm.num_blocks)
            while (
                self.waiting
                and min(budget, prefill_left) > 0
                and len(self.running) < self.config.max_num_seqs
            ):
                seq = self.waiting[0]
                hits, num_hit_tokens = self.bm.get_computed_blocks(seq)
                exact = num_hit_tokens
                if seq.kv_reuse == "blend":  # an earlier blend of the same tokens, further on
                    hits = hits + self.bm.get_blend_blocks(seq, hits)
                    num_hit_tokens = len(hits) * self.bm.block_size
                hits, num_hit_tokens = self._trim_hit(seq, hits, num_hit_tokens)
                if num_hit_tokens > exact:
                    seq.exact_until = _first(seq.exact_until, exact)
                plan = self._plan(seq, num_hit_tokens)
                if plan is not None and plan.sparse:
                    # Blocks for the whole prompt at once: the copies land all over it.
                    num_new = min(plan.left, budget, prefill_left)
                    if plan.candidates is not None:
                        # In one step: the choice is made over the whole prompt; most of its
                        # tokens only go through the first layer.
                        num_new = plan.left
                    span = seq.num_tokens - num_hit_tokens
                else:
                    num_new = min(seq.num_tokens - num_hit_tokens, budget, prefill_left)
                    span = num_new
                need = self.bm.blocks_needed(num_hit_tokens + span) - len(hits)
                if self.bm.num_free_blocks - need < watermark and self.running:
                    break
                if self.bm.allocate_slots(seq, span, hits) is None:
                    break
                self.waiting.popleft()
                seq.plan = plan
                self.bm.record_prefix_lookup(seq.num_tokens, num_hit_tokens)
                seq.num_computed_tokens = num_hit_tokens
                if seq.num_preemptions == 0:
                    seq.num_cached_tokens = num_hit_tokens
                seq.status = SequenceStatus.RUNNING
                if seq.first_scheduled_time is None:
                    seq.first_scheduled_time = time.monotonic()
                self.running.append(seq)
                out.chunks.append(self._chunk(seq, num_new))
                budget -= num_new
                prefill_left -= num_new

        self.num_steps += 1
        self.num_scheduled_tokens += out.num_tokens
        return out

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

    def _trim_hit(self, seq: Sequence, hits: list[int], computed: int) -> tuple[list[int], int]:
        """A prefix hit that ends a few tokens into a cached passage (segments of different
        passages begin with the same few tokens) stops at the block before it: recomputing
        those tokens is cheaper than computing the passage that copying would have skipped.
        A hit that covers more of it than a copy would recompute is kept (exact)."""
        if seq.kv_reuse != "blend" or self.passages is None or not hits:
            return hits, computed
        for span in seq.segments:
            n = span.end - span.start
            if not span.start < computed < span.end or self.passages(span.key) != n:
                continue
            if computed - span.start >= self.config.recompute_first:
                return hits, computed
            keep = span.start // self.bm.block_size
            return hits[:keep], keep * self.bm.block_size
        return hits, computed

    def _plan(self, seq: Sequence, computed: int) -> ReusePlan | None:
        """Which of a prompt's passages come from the passage cache, which are stored there
        once computed. None: nothing to reuse or store (the prompt is computed as usual)."""
        if seq.kv_reuse != "blend" or not seq.segments or self.passages is None:
            return None
        first = self.config.recompute_first
        by_deviation = self.config.recompute == "deviation"
        ratio = self.config.recompute_ratio
        positions: list[int] = []
        candidates: list[bool] = []
        copies: list[tuple[str, int, int]] = []
        stores: list[tuple[str, int, int, int | None]] = []
        cursor = computed
        reused = recomputed = 0
        # The prompt's passages in order, a cut one left out.
        spans = [s for s in sorted(seq.segments, key=lambda s: s.start)
                 if s.start < s.end <= seq.num_tokens]  # fmt: skip
        in_place = len(spans) - self.config.recompute_last
        for i, span in enumerate(spans):
            n = span.end - span.start
            held = self.passages(span.key) == n
            if not held:
                # Stored once computed (a part inside the prefix hit is there already).
                stores.append((span.key, span.start, n, span.chunk_id))
            elif i >= in_place:
                continue  # computed in place with what follows it (its entry stays as is)
            elif span.start >= computed:  # else: inside the prefix hit (exact or a blend's)
                keep = round(ratio * n) if by_deviation else min(first, n)
                positions += range(cursor, span.start if by_deviation else span.start + keep)
                candidates += [False] * (len(positions) - len(candidates))
                if by_deviation:  # all through the first layer, `keep` of them past it
                    positions += range(span.start, span.end)
                    candidates += [True] * n
                copies.append((span.key, span.start, n))
                reused += n - keep
                recomputed += keep
                cursor = span.end
        if not copies and not stores:
            return None
        positions += range(cursor, seq.num_tokens)
        candidates += [False] * (len(positions) - len(candidates))
        if seq.num_preemptions == 0:
            seq.num_reused_tokens, seq.num_recomputed_tokens = reused, recomputed
            self.num_passage_hits += len(copies)
            self.num_passage_misses += len(stores)
            self.num_recomputed_tokens += recomputed
        if copies:
            # Blocks past the first copy hold approximate KV: never shared as an exact prefix.
            seq.exact_until = _first(seq.exact_until, copies[0][1])
        return ReusePlan(
            positions, tuple(copies), tuple(stores), seq.num_tokens,
            candidates=candidates if by_deviation and copies else None, ratio=ratio,
        )  # fmt: skip

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

    def _drafts(self, seq: Sequence, room: int, rows: int, expected: float) -> list[int]:
        """Draft tokens for a decoding sequence (prompt lookup), within `room` more tokens of
        this step's budget, its max_tokens and the context, as many as pay for themselves."""
        spec = self.config.spec
        if spec is None or room <= 0:
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
        k = choose_k(state, min(spec.k_max, room, left), rows, expected, self.costs.decode_ms)
        return state.propose(seq.token_ids, k, spec) if k > 0 else []

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


def _first(at: int | None, other: int) -> int:
    return other if at is None else min(at, other)
