"""A generator stand-in for the ops tests: streams a fixed answer, records its prompts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from rag.engine import EngineMetrics, FinishReason, SamplingParams, TokenEvent, Usage
from rag.engine.protocol import messages_of
from tests.support.fakes import BackendBasics


class RecordingEngine(BackendBasics):
    def __init__(self, answer: str = "It leaves at nine [1].") -> None:
        self.answer = answer
        self.max_model_len = 2048
        self.prompts: list[Any] = []
        self.raw_prompts: list[object] = []

    def submit(
        self,
        prompt: Any,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        **_: object,
    ) -> AsyncIterator[TokenEvent]:
        self.prompts.append(messages_of(prompt))  # type: ignore[arg-type]
        self.raw_prompts.append(prompt)
        return self._stream(request_id or "ops")

    async def _stream(self, rid: str) -> AsyncIterator[TokenEvent]:
        words = self.answer.split(" ")
        for i, word in enumerate(words):
            yield TokenEvent(rid, word if i == 0 else " " + word, (i,))
        yield TokenEvent(
            rid, "", (), FinishReason.STOP, Usage(10, 0, len(words), queue_ms=0.5, prefill_ms=4.0)
        )

    def cancel(self, request_id: str) -> None:
        pass

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            running=0, waiting=0, kv_blocks_used=0, kv_blocks_free=0, kv_blocks_total=0,
            prefix_cache_hit_rate=0.0, preemptions=0, steps=0, tokens_per_step=0.0,
            generated_tokens=0,
        )  # fmt: skip

    def close(self) -> None:
        pass
