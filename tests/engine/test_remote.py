"""The remote backend against a tiny OpenAI-compatible SSE server on loopback.

The server is a fake only because the test is about the HTTP client: it streams canned chunks
and records the requests it got.
"""

import asyncio
import json

import pytest

from rag.engine import (
    EngineOverloaded,
    EngineSettings,
    FinishReason,
    InvalidRequest,
    SamplingParams,
    build_engine,
)

pytestmark = pytest.mark.timeout(60)


class FakeOpenAIServer:
    def __init__(self, status: int = 200, pieces=("Hel", "lo", " world")):
        self.status = status
        self.pieces = pieces
        self.requests: list[tuple[str, dict, dict]] = []
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader, writer):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        path = lines[0].split()[1]
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)}
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
        self.requests.append((path, headers, body))
        if self.status != 200:
            msg = b'{"error": "busy"}'
            writer.write(
                f"HTTP/1.1 {self.status} Err\r\nContent-Length: {len(msg)}\r\n"
                "Retry-After: 2\r\nConnection: close\r\n\r\n".encode()
                + msg
            )
            await writer.drain()
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        chat = path.endswith("/chat/completions")
        for i, piece in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            choice = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": piece}} if chat else {"text": piece})
            writer.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            await writer.drain()
            await asyncio.sleep(0.01)
        usage = {
            "prompt_tokens": 11, "completion_tokens": len(self.pieces), "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 8},
        }  # fmt: skip
        writer.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()


def remote(port: int, **kw):
    return build_engine(
        EngineSettings(
            backend="remote",
            remote_url=f"http://127.0.0.1:{port}/v1",
            remote_model="m",
            remote_api_key="secret",
            **kw,
        )  # fmt: skip
    )


def test_chat_stream_text_finish_and_usage():
    async def main():
        async with FakeOpenAIServer() as srv:
            engine = remote(srv.port)
            messages = [{"role": "user", "content": "hi"}]
            events = [
                ev
                async for ev in engine.submit(
                    messages, SamplingParams(max_tokens=3, temperature=0.5, seed=7, stop=["x"])
                )
            ]
        assert "".join(e.text for e in events) == "Hello world"
        last = events[-1]
        assert last.finish_reason is FinishReason.LENGTH
        # The server's prefix cache may hold other tenants' prompts: its count stays there.
        assert (last.usage.prompt_tokens, last.usage.cached_prompt_tokens) == (11, 0)
        assert last.usage.completion_tokens == 3
        path, headers, body = srv.requests[0]
        assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer secret"
        assert body["messages"] == messages and body["stream"] is True
        assert (body["max_tokens"], body["seed"], body["stop"]) == (3, 7, ["x"])
        assert engine.metrics().running == 0

    asyncio.run(main())


def test_each_tenant_sends_its_own_cache_salt():
    """A shared vLLM prefix cache is keyed by `cache_salt`: without it, one tenant's
    time-to-first-token (and the reported cached tokens) tells whether another's prompt
    was seen. Each tenant's salt is its own, stable, and not its id."""

    async def main():
        async with FakeOpenAIServer() as srv:
            engine = remote(srv.port)
            messages = [{"role": "user", "content": "hi"}]
            for salt in ("tenant-a", "tenant-a", "tenant-b"):
                events = [ev async for ev in engine.submit(messages, cache_salt=salt)]
                assert events[-1].usage.cached_prompt_tokens == 0
            async for _ in engine.submit("plain", cache_salt="tenant-a"):
                pass
        salts = [body.get("cache_salt") for _, _, body in srv.requests]
        assert salts[0] and salts[0] == salts[1] == salts[3] != salts[2]
        assert all(s and "tenant" not in s for s in salts)

    asyncio.run(main())


def test_plain_prompt_uses_completions():
    async def main():
        async with FakeOpenAIServer(pieces=("a", "b")) as srv:
            engine = remote(srv.port)
            text = "".join([ev.text async for ev in engine.submit("prompt")])
        assert text == "ab" and srv.requests[0][0] == "/v1/completions"

    asyncio.run(main())


def test_server_overload_maps_to_engine_overloaded():
    async def main():
        async with FakeOpenAIServer(status=429) as srv:
            engine = remote(srv.port)
            with pytest.raises(EngineOverloaded) as info:
                async for _ in engine.submit("prompt"):
                    pass
        assert info.value.retry_after_s == 2.0
        assert engine.metrics().running == 0

    asyncio.run(main())


def test_cancel_stops_the_stream():
    async def main():
        async with FakeOpenAIServer(pieces=tuple("abcdefghij")) as srv:
            engine = remote(srv.port)
            stream = engine.submit("prompt", request_id="r1")
            events = []
            async for ev in stream:
                events.append(ev)
                if len(events) == 2:
                    engine.cancel("r1")
        assert events[-1].finish_reason is FinishReason.CANCELLED
        assert len(events) < 10

    asyncio.run(main())


def test_local_limits_refuse_early():
    engine = remote(1, remote_max_concurrency=1)
    with pytest.raises(InvalidRequest):
        engine.submit("x", SamplingParams(top_p=2.0))
    engine.submit("x")  # holds the only slot until iterated
    with pytest.raises(EngineOverloaded):
        engine.submit("y")
