"""The engine interface over an OpenAI-compatible HTTP server (vLLM, llama.cpp server, ...).

Plain prompts go to /completions, chat messages to /chat/completions, both streamed as
server-sent events.

A shared server's prefix cache is a side channel between tenants (a cached prompt answers
sooner, and its usage says how many tokens were cached), so each request carries the tenant's
`cache_salt` (vLLM keys its prefix cache by it; a hash, so the server never sees a tenant id),
and the server's `cached_tokens` is never reported: a server that ignores the salt would count
other tenants' prompts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx

from rag.engine.config import EngineSettings
from rag.engine.protocol import (
    EngineMetrics,
    Prompt,
    SegmentedPrompt,
    estimate_tokens,
    messages_of,
)
from rag.engine.sequence import (
    EngineError,
    EngineOverloaded,
    FinishReason,
    InvalidRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)

logger = logging.getLogger(__name__)

_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class RemoteEngine:
    def __init__(self, settings: EngineSettings, transport: httpx.AsyncBaseTransport | None = None):
        if not settings.remote_url:
            raise ValueError("remote backend needs remote_url")
        self.settings = settings
        self.base_url = settings.remote_url.rstrip("/")
        self._transport = transport
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._cancelled: set[str] = set()
        self._generated = 0

    def _client(self) -> httpx.AsyncClient:
        headers = {}
        if self.settings.remote_api_key:
            headers["Authorization"] = f"Bearer {self.settings.remote_api_key}"
        return httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.settings.remote_timeout_s, connect=10.0),
            transport=self._transport,
        )

    # ----- GenerationBackend
    @property
    def context_tokens(self) -> int | None:
        return None  # the server's business: it refuses what does not fit

    def count_tokens(self, prompt: Prompt) -> int:
        return estimate_tokens(prompt)

    def has_room(self) -> bool:
        with self._lock:
            return len(self._in_flight) < self.settings.remote_max_concurrency

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        cache_salt: str | None = None,
        loop: object = None,  # the stream runs where it is iterated
    ) -> AsyncIterator[TokenEvent]:
        params = params or SamplingParams()
        params.validate(None)
        if not prompt:
            raise InvalidRequest("empty prompt")
        request_id = request_id or uuid.uuid4().hex
        with self._lock:
            if len(self._in_flight) >= self.settings.remote_max_concurrency:
                raise EngineOverloaded(
                    f"{self.settings.remote_max_concurrency} remote requests in flight"
                )
            self._in_flight.add(request_id)
        salt = cache_salt or ""
        if isinstance(prompt, SegmentedPrompt) and prompt.kv_reuse == "off":
            salt = f"{salt}|{uuid.uuid4().hex}"  # no prefix shared either, as the local engine
        return self._stream(prompt, params, request_id, _salt(salt))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._in_flight:
                self._cancelled.add(request_id)

    def drop_chunks(self, chunk_ids: set[int]) -> None:
        """Nothing to drop: a remote server caches no passage of ours by chunk (its own prefix
        cache holds only prompts, which name no chunk)."""

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            running=len(self._in_flight), waiting=0, kv_blocks_used=0, kv_blocks_free=0,
            kv_blocks_total=0, prefix_cache_hit_rate=0.0, preemptions=0, steps=0,
            tokens_per_step=0.0, generated_tokens=self._generated,
        )  # fmt: skip

    def step_alive(self) -> bool:
        return True  # the server answers for itself (errors, timeouts)

    def close(self) -> None:
        pass

    def _body(self, prompt: Prompt, p: SamplingParams, salt: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.settings.remote_model or "default",
            "cache_salt": salt,  # vLLM extension: its prefix cache is keyed by it
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": p.temperature,
            "top_p": p.top_p,
        }
        if p.max_tokens is not None:
            body["max_tokens"] = p.max_tokens
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop:
            body["stop"] = list(p.stop)
        if p.top_k:
            body["top_k"] = p.top_k  # vLLM extension
        if p.frequency_penalty:
            body["frequency_penalty"] = p.frequency_penalty
        if p.presence_penalty:
            body["presence_penalty"] = p.presence_penalty
        if p.repetition_penalty != 1.0:
            body["repetition_penalty"] = p.repetition_penalty  # vLLM extension
        # The citation mask and the repetition stop are the local engine's: a remote server
        # is not told (its markers are still checked against the passages given).
        if isinstance(prompt, str):
            return "/completions", {**body, "prompt": prompt}
        return "/chat/completions", {**body, "messages": prompt}

    async def _stream(
        self, prompt: Prompt, params: SamplingParams, request_id: str, salt: str
    ) -> AsyncIterator[TokenEvent]:
        path, body = self._body(messages_of(prompt), params, salt)
        reason: FinishReason | None = None
        usage: dict[str, Any] | None = None
        n_chunks = 0
        try:
            async with (
                self._client() as client,
                client.stream("POST", self.base_url + path, json=body) as resp,
            ):
                if resp.status_code != 200:
                    await resp.aread()
                    raise _http_error(resp)
                async for line in resp.aiter_lines():
                    if request_id in self._cancelled:
                        reason = FinishReason.CANCELLED
                        break
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        text = choice.get("text")
                        if text is None:
                            text = (choice.get("delta") or {}).get("content") or ""
                        if choice.get("finish_reason"):
                            reason = _REASONS.get(choice["finish_reason"], FinishReason.STOP)
                        if text:
                            n_chunks += 1
                            yield TokenEvent(request_id, text)
        except httpx.HTTPError as exc:
            raise EngineError(f"remote generator failed: {type(exc).__name__}") from exc
        except (GeneratorExit, asyncio.CancelledError):
            reason = FinishReason.CANCELLED
            raise
        finally:
            with self._lock:
                self._in_flight.discard(request_id)
                self._cancelled.discard(request_id)
        self._generated += n_chunks
        u = usage or {}
        # The server's cached_tokens is not passed on: it may count other tenants' prompts.
        yield TokenEvent(
            request_id,
            "",
            finish_reason=reason or FinishReason.STOP,
            usage=Usage(u.get("prompt_tokens", 0), 0, u.get("completion_tokens", n_chunks)),
        )


def _salt(tenant_salt: str) -> str:
    """The salt sent for a tenant: stable, distinct per tenant, and not the tenant's id."""
    return hashlib.sha256(f"ragserve-cache-salt:{tenant_salt}".encode()).hexdigest()[:32]


def _http_error(resp: httpx.Response) -> Exception:
    detail = resp.text[:200]
    if resp.status_code == 429 or resp.status_code == 503:
        retry = float(resp.headers.get("retry-after", "1") or 1)
        return EngineOverloaded(f"remote generator is overloaded: {detail}", retry)
    if resp.status_code in (400, 422):
        return InvalidRequest(f"remote generator refused the request: {detail}")
    return EngineError(f"remote generator answered HTTP {resp.status_code}")
