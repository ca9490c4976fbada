"""The engine's contract: what the rest of ragserve may ask of a generator, and the seams
inside the local engine (tokenizer, runner). A local engine and a remote OpenAI-compatible
server both implement `GenerationBackend`; nothing here imports torch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Literal, Protocol

from rag.engine.passages import PassageStats
from rag.engine.sequence import SamplingParams, SegmentSpan, TokenEvent
from rag.engine.step import ModelRunnerOutput, SchedulerOutput

KvReuse = Literal["blend", "prefix", "off"]


@dataclass(frozen=True)
class Segment:
    """A stretch of a prompt's text whose KV may be reused in other prompts: a passage.
    `key` names it (the chunk it quotes and a hash of its rendered text, salted by tenant):
    equal keys mean equal text."""

    text: str
    key: str
    chunk_id: int | None = None  # what a delete drops


@dataclass(frozen=True)
class SegmentedPrompt:
    """Chat messages whose text holds `segments` verbatim, in order. Each segment is
    tokenized on its own, so its tokens (and KV) are the same in every prompt it appears in.

    `kv_reuse`: "blend" reuses a segment's KV computed in an earlier prompt, moved to its new
    position and partly recomputed (rag.engine.passages); "prefix" reuses only an identical
    prompt prefix; "off" computes everything. A backend without a passage cache (a remote
    server) sends the messages."""

    messages: list[dict[str, str]]
    segments: tuple[Segment, ...]
    kv_reuse: KvReuse = "blend"


# A raw completion prompt, chat messages ({"role", "content"}) for the model's template, or
# chat messages with reusable segments.
Prompt = str | list[dict[str, str]] | SegmentedPrompt


@dataclass(frozen=True)
class EngineMetrics:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_blocks_total: int
    prefix_cache_hit_rate: float
    preemptions: int
    steps: int
    tokens_per_step: float  # mean scheduled tokens per step
    generated_tokens: int
    draft_tokens: int = 0  # speculative drafts verified
    accepted_tokens: int = 0  # of which accepted
    passages: PassageStats = field(default_factory=PassageStats)


class GenerationBackend(Protocol):
    """What callers need from a generator (the local engine or a remote server)."""

    @property
    def context_tokens(self) -> int | None:
        """The context length in tokens, prompt and answer together; None when the backend
        does not say (a remote server then refuses what does not fit)."""
        ...

    def count_tokens(self, prompt: Prompt) -> int:
        """Tokens of `prompt` as the model will see it (an estimate where only a remote
        server knows)."""
        ...

    def step_alive(self) -> bool:
        """False when the thread that runs generations died: nothing submitted would ever
        be answered (a remote backend answers for itself: True)."""
        ...

    def has_room(self) -> bool:
        """False when a new request would be refused as overload: callers check before they
        do any work for it (HTTP 429 early)."""
        ...

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        cache_salt: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Start a generation; iterate for its events, the last with finish reason and usage.
        Raises InvalidRequest or EngineOverloaded before any work is done. Requests with
        different `cache_salt`s (tenants) never share cached prompt blocks. `loop`: where the
        events will be iterated, when submitting from another thread."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a request and free what it holds; harmless when it already finished."""
        ...

    def drop_chunks(self, chunk_ids: set[int]) -> None:
        """Forget whatever was cached from these chunks (their documents were deleted)."""
        ...

    def metrics(self) -> EngineMetrics: ...

    def close(self) -> None: ...


class Tokenizer(Protocol):
    def encode_prompt(self, prompt: Prompt) -> list[int]: ...

    def encode_segments(self, prompt: Prompt) -> tuple[list[int], list[SegmentSpan]]:
        """The ids, and where the prompt's segments (if any) lie among them."""
        ...

    def decode(self, token_ids: Seq[int]) -> str: ...

    def token_texts(self) -> Seq[str]:
        """Every token's text on its own, by id (the citation mask reads them)."""
        ...


def messages_of(prompt: Prompt) -> str | list[dict[str, str]]:
    """The prompt as a plain completion prompt or chat messages (segments dropped)."""
    return prompt.messages if isinstance(prompt, SegmentedPrompt) else prompt


class Runner(Protocol):
    """Turns one step's plan into sampled tokens (rag.engine.runner.ModelRunner)."""

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput: ...


def estimate_tokens(prompt: Prompt) -> int:
    """About three characters a token, plus a few per message for a chat template."""
    prompt = messages_of(prompt)
    if isinstance(prompt, str):
        return len(prompt) // 3 + 1
    return sum(len(m.get("content") or "") // 3 + 8 for m in prompt)
