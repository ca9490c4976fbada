"""The console's end-to-end fixtures: the real service on loopback (hash embedder, a fake
generator that streams a canned answer) and a real headless Chromium driven by Selenium.

Chromium and its driver come from Debian (`apt-get install -y chromium chromium-driver`);
nothing is ever downloaded: Selenium is given both paths, so Selenium Manager never runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rag.api.app import create_app
from rag.auth import create_key
from rag.config import Settings
from rag.embed import HashEmbedder
from rag.engine import EngineMetrics, FinishReason, SamplingParams, TokenEvent, Usage
from rag.engine.protocol import messages_of
from rag.services import Services, build_services
from tests.conftest import LiveServer
from tests.support.fakes import BackendBasics

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
)
ASK_PATH = "/v1/collections/{collection_id}/ask"


def _browser_or_skip() -> None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    reason = f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install -y chromium chromium-driver"
    if os.environ.get("CI"):
        pytest.fail(reason)  # in CI the browser tests must run
    pytest.skip(reason)


class FakeEngine(BackendBasics):
    """A generator that streams a canned answer word by word, and records what it was asked."""

    def __init__(self, answer: str, delay_s: float = 0.03) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.prompts: list[object] = []
        self.raw_prompts: list[object] = []
        self.cancelled: list[str] = []
        self.max_model_len = 8192

    def submit(
        self,
        prompt: object,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        **_: object,
    ) -> AsyncIterator[TokenEvent]:
        self.prompts.append(messages_of(prompt))  # type: ignore[arg-type]
        self.raw_prompts.append(prompt)
        return self._stream(request_id or "fake")

    async def _stream(self, request_id: str) -> AsyncIterator[TokenEvent]:
        words = self.answer.split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(self.delay_s)
            yield TokenEvent(request_id, word if i == 0 else " " + word)
        yield TokenEvent(
            request_id,
            "",
            finish_reason=FinishReason.STOP,
            usage=Usage(prompt_tokens=120, cached_prompt_tokens=0, completion_tokens=len(words)),
        )

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(0, 0, 0, 0, 0, 0.0, 0, 0, 0.0, 0)

    def close(self) -> None:
        pass


@dataclass
class Console:
    """The live service and a tenant's key."""

    url: str
    services: Services
    engine: FakeEngine
    key: str
    other_key: str
    headers: dict[str, str] = field(default_factory=dict)


ANSWER = "Fredville is the capital of Freedonia [1]. The river Fred runs through it [2]."


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database={"url": f"sqlite:///{tmp_path / 'rag.db'}"},
        ingest={"advanced": {"backoff_base_s": 0.05, "poll_interval_s": 0.05, "lease_s": 5.0}},
        # The hash embedder's scores are low: let every passage through to the generator,
        # which sees them all and writes the answer the console renders ("all"); the default
        # ("one": a quote, then a checked sentence) has its own test.
        ask={"relevance_threshold": -1.0, "evidence": "all"},
        auth={"admin_key": "test-admin-key-0123456789"},
    )
    engine = FakeEngine(ANSWER)
    services = build_services(settings, embedder=HashEmbedder(384), engine=engine)  # type: ignore[arg-type]
    app = create_app(settings, services)
    if not any(getattr(r, "path", None) == ASK_PATH for r in app.routes):
        # Until the lead wires the ask router into create_app.
        from rag.api.routes import ask

        app.include_router(ask.router)
    key, _ = create_key(services.db, "tenant-a")
    other, _ = create_key(services.db, "tenant-b")
    with LiveServer(app) as server:
        yield Console(server.url, services, engine, key, other, {"Authorization": f"Bearer {key}"})


class Hold:
    """Holds the service's ingest worker before a pipeline step (`parse` or `embed`) until the
    test lets it go, so a browser can watch documents sit in `parsing`, `embedding` or, behind
    them, `queued`. Records which steps were entered, and lets everything go at teardown."""

    def __init__(self, services: Services, timeout_s: float = 60.0) -> None:
        (worker,) = services.workers
        self.pipeline = worker.pipeline
        self.timeout_s = timeout_s  # a forgotten gate never wedges the worker for good
        self.gates: dict[str, threading.Event] = {}
        self.entered: list[str] = []

    def close(self, *steps: str) -> None:
        for step in steps:
            if step not in self.gates:
                self.gates[step] = threading.Event()
                setattr(self.pipeline, step, self._held(step, getattr(self.pipeline, step)))
            self.gates[step].clear()

    def open(self, *steps: str) -> None:
        for step in steps or tuple(self.gates):
            self.gates[step].set()

    def _held(self, step: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.append(step)
            self.gates[step].wait(self.timeout_s)
            return inner(*args, **kwargs)

        return held


@pytest.fixture
def hold(console: Console) -> Iterator[Hold]:
    h = Hold(console.services)
    try:
        yield h
    finally:
        h.open()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: RAG_CONSOLE_SCREENSHOTS (e.g. docs) to refresh the README's,
    else this test's tmp_path."""
    target = os.environ.get("RAG_CONSOLE_SCREENSHOTS")
    out = Path(target) if target else tmp_path / "shots"
    out.mkdir(parents=True, exist_ok=True)
    return out
