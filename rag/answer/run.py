"""One submitted generation drained: its text pieces as the engine writes them, until it
finishes, the deadline passes, it fails or the caller goes away (then it is cancelled and its
KV blocks freed), and how it ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

from rag.answer.prepared import Running
from rag.engine.protocol import GenerationBackend
from rag.engine.sequence import EngineError, TokenEvent, Usage

log = logging.getLogger(__name__)

# How long a cancelled generation may take to report its usage before we stop waiting.
CANCEL_GRACE_S = 0.5


class Run:
    """One submitted generation drained: its text pieces until it finishes, the deadline
    passes or it fails, then how it ended (`reason`, `usage`, the engine's stages)."""

    def __init__(self, engine: GenerationBackend, prep: Running) -> None:
        self.engine = engine
        self.prep = prep
        self.reason = "stop"
        self.usage = Usage(prep.prompt_tokens, 0, 0)
        self.stages: dict[str, float] = {}
        self.first_at: float | None = None
        self._it = prep.generation.__aiter__()
        self._finished = False

    async def pieces(self) -> AsyncGenerator[str, None]:
        prep = self.prep
        try:
            while True:
                timeout = None
                if prep.deadline.bounded:
                    timeout = max(0.0, prep.deadline.remaining_ms() / 1000.0)
                try:
                    ev = await asyncio.wait_for(self._it.__anext__(), timeout)
                except StopAsyncIteration:
                    self._finished = True
                    return
                except TimeoutError:
                    await self.stop("deadline")
                    return
                if ev.text:
                    if self.first_at is None:
                        self.first_at = time.perf_counter()
                    yield ev.text
                if ev.finished:
                    self._finished = True
                    self.reason = str(ev.finish_reason)
                    if ev.usage is not None:
                        self.usage = ev.usage
                        # The engine's split of the time to first token, when it gives one.
                        split = (("queue", ev.usage.queue_ms), ("prefill", ev.usage.prefill_ms))
                        self.stages = {stage: ms for stage, ms in split if ms is not None}
                    return
        except EngineError as exc:
            log.warning("generation %s failed: %s", prep.request_id, type(exc).__name__)
            self.reason = "error"
            self._finished = True
        finally:
            if not self._finished:  # the caller went away: free the KV blocks now
                self.engine.cancel(prep.request_id)
                aclose = getattr(self._it, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()

    async def stop(self, reason: str) -> None:
        """End the generation early (`reason` becomes the finish reason), keeping its usage."""
        self.reason = reason
        self.engine.cancel(self.prep.request_id)
        self.usage = await _usage_after_cancel(self._it, self.usage)
        self._finished = True

    def timings(self) -> dict[str, float]:
        prep = self.prep
        timings = dict(prep.timings_ms)
        timings.update(self.stages)
        if self.first_at is not None:
            timings["first_token"] = round((self.first_at - prep.submitted_at) * 1000.0, 3)
        timings["generate"] = round((time.perf_counter() - prep.submitted_at) * 1000.0, 3)
        return timings


async def _usage_after_cancel(it: AsyncIterator[TokenEvent], usage: Usage) -> Usage:
    """A cancelled request still reports its usage on its last event; wait briefly."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CANCEL_GRACE_S):
            async for ev in it:
                if ev.finished and ev.usage is not None:
                    return ev.usage
    return usage
