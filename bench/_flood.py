"""The attacker's many connections (bench/_attacks.py's `Hostile.flood`), in a process of its own.

    python bench/_flood.py < spec.json > answers.json

A real attacker's client runs on its own machine. In the benchmark's process it held the GIL
the honest clients' threads need to read their answers, so their latency measured the
attacker's client as much as the server; and httpx's async pool spent most of a core choosing
among 64 connections, time a real attack does not take from the server's cores. Here each
connection is an asyncio stream speaking HTTP/1.1 through h11 (httpx's own parser), in a
process whose only work is this.

The spec (JSON on stdin): `url`, `headers`, `workers` connections, each sending up to `times`
requests until `seconds` have passed, taking `requests` in turn (each: method, url, optional
params, json and timeout in seconds). Written to stdout: `{"answers": [[status, ms], ...]}`,
status 0 where the client gave up at its timeout, 599 where no answer came at all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

import h11


class Connection:
    def __init__(self, host: str, port: int, headers: list[tuple[str, str]]) -> None:
        self.host, self.port, self.headers = host, port, headers
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.h11 = h11.Connection(h11.CLIENT)

    async def exchange(self, req: dict[str, Any]) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.h11 = h11.Connection(h11.CLIENT)
        assert self.reader is not None
        target = req["url"] + ("?" + urlencode(req["params"]) if req.get("params") else "")
        body = b"" if req.get("json") is None else json.dumps(req["json"]).encode()
        headers = [("host", f"{self.host}:{self.port}"), *self.headers,
                   ("content-length", str(len(body)))]  # fmt: skip
        if body:
            headers.append(("content-type", "application/json"))
        out = self.h11.send(h11.Request(method=req["method"], target=target, headers=headers))
        out += self.h11.send(h11.Data(data=body)) if body else b""
        out += self.h11.send(h11.EndOfMessage())
        self.writer.write(out)
        await self.writer.drain()
        status = 599
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = await self.reader.read(65_536)
                self.h11.receive_data(data)  # b"": the server closed; h11 says so next
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the server closed the connection mid-answer")
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        else:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def flood(spec: dict[str, Any]) -> list[tuple[int, float]]:
    url = urlsplit(spec["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    headers = list(spec.get("headers", {}).items())
    until = time.monotonic() + float(spec["seconds"])
    turn = itertools.cycle(spec["requests"])
    answers: list[tuple[int, float]] = []
    said: set[str] = set()

    async def one() -> None:
        conn = Connection(host, port, headers)
        for _ in range(int(spec["times"])):
            if time.monotonic() >= until:
                break
            req = next(turn)
            t0 = time.perf_counter()
            try:
                status = await asyncio.wait_for(conn.exchange(req), req.get("timeout", 60))
            except TimeoutError:
                status = 0  # the attacker gave up: not the server's doing
                conn.close()
            except (OSError, h11.ProtocolError) as exc:
                status = 599
                conn.close()
                if type(exc).__name__ not in said:
                    said.add(type(exc).__name__)
                    print(f"flood: no answer ({type(exc).__name__}: {exc})", file=sys.stderr)
            answers.append((status, (time.perf_counter() - t0) * 1000))
        conn.close()

    await asyncio.gather(*(one() for _ in range(int(spec["workers"]))))
    return answers


def main() -> int:
    spec = json.load(sys.stdin)
    json.dump({"answers": asyncio.run(flood(spec))}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
