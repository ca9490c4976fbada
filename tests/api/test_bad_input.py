"""Bad input gets a clear 4xx with a JSON body, and nothing is written."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import func, select

from rag.db.models import Document
from tests.conftest import Api, LiveServer


def _docs(api: Api) -> int:
    with api.services.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(Document)) or 0)


def _err(r, status: int) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("name", "data", "ctype"),
    [
        ("photo.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 100, "image/png"),
        ("fake.pdf", b"just some text pretending", "application/pdf"),
        ("fake.docx", b"PK\x03\x04 not really a zip", None),
        ("prog.txt", b"\x7fELF\x02\x01\x01\0\0\0\0\0" + bytes(range(256)), "text/plain"),
    ],
)
def test_unknown_or_spoofed_type_is_415(
    sqlite_api: Api, name: str, data: bytes, ctype: str | None
) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    r = api.client.post(
        f"/v1/collections/{cid}/documents", headers=api.a, files=[("files", (name, data, ctype))]
    )
    _err(r, 415)
    assert _docs(api) == 0


def test_a_bad_file_rejects_the_whole_request(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    r = api.client.post(
        f"/v1/collections/{cid}/documents",
        headers=api.a,
        files=[
            ("files", ("ok.txt", b"fine text", "text/plain")),
            ("files", ("bad.pdf", b"not a pdf", "application/pdf")),
        ],
    )
    _err(r, 415)
    assert _docs(api) == 0


def test_unknown_request_content_type_is_415(sqlite_api: Api) -> None:
    cid = sqlite_api.collection(sqlite_api.a)
    r = sqlite_api.client.post(
        f"/v1/collections/{cid}/documents",
        content=b"hello",
        headers={**sqlite_api.a, "content-type": "text/plain"},
    )
    _err(r, 415)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"text": ""}',
        b'{"text": "   "}',
        b'{"text": "ok", "surprise": true}',
        b'{"documents": []}',
        b'{"text": "ok", "metadata": {"k": [1, 2]}}',
        b'"just a string"',
        # Not JSON, though Python's json module reads them: orjson refuses them (rag.api.body).
        b'{"text": "ok", "metadata": {"k": NaN}}',
        b'{"text": "ok", "metadata": {"k": Infinity}}',
        b'{"text": "an unpaired \\ud800 surrogate"}',
    ],
)
def test_malformed_json_empty_and_unknown_fields_are_422(sqlite_api: Api, body: bytes) -> None:
    cid = sqlite_api.collection(sqlite_api.a)
    r = sqlite_api.client.post(
        f"/v1/collections/{cid}/documents",
        content=body,
        headers={**sqlite_api.a, "content-type": "application/json"},
    )
    _err(r, 422)
    assert _docs(sqlite_api) == 0


def test_empty_file_is_422(sqlite_api: Api) -> None:
    cid = sqlite_api.collection(sqlite_api.a)
    r = sqlite_api.client.post(
        f"/v1/collections/{cid}/documents",
        headers=sqlite_api.a,
        files=[("files", ("empty.txt", b"", "text/plain"))],
    )
    _err(r, 422)


def test_multipart_without_files_and_bad_metadata_are_422(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    url = f"/v1/collections/{cid}/documents"
    _err(api.client.post(url, headers=api.a, files={"metadata": (None, "{}")}), 422)
    _err(
        api.client.post(
            url,
            headers=api.a,
            data={"metadata": "[1"},
            files=[("files", ("a.txt", b"abc", "text/plain"))],
        ),
        422,
    )
    _err(
        api.client.post(
            url,
            headers=api.a,
            data={"other": "x"},
            files=[("files", ("a.txt", b"abc", "text/plain"))],
        ),
        422,
    )


def test_collection_bad_input(sqlite_api: Api) -> None:
    api = sqlite_api
    _err(api.client.post("/v1/collections", json={"name": ""}, headers=api.a), 422)
    _err(api.client.post("/v1/collections", json={"name": "x", "bogus": 1}, headers=api.a), 422)
    _err(
        api.client.post(
            "/v1/collections", json={"name": "x", "chunking": {"tokens": 1}}, headers=api.a
        ),
        422,
    )
    _err(
        api.client.post(
            "/v1/collections", json={"name": "x", "index": {"kind": "magic"}}, headers=api.a
        ),
        422,
    )
    api.collection(api.a, name="dup")
    _err(api.client.post("/v1/collections", json={"name": "dup"}, headers=api.a), 409)
    _err(api.client.get("/v1/collections/nope", headers=api.a), 404)


def test_over_the_limit_is_413_by_content_length(make_api, sqlite_url, hash_embedder) -> None:  # type: ignore[no-untyped-def]
    api = make_api(sqlite_url, hash_embedder, max_upload_mb=1)
    cid = api.collection(api.a)
    big = b"a" * (2 * 1024 * 1024)
    r = api.client.post(
        f"/v1/collections/{cid}/documents",
        headers=api.a,
        files=[("files", ("big.txt", big, "text/plain"))],
    )
    _err(r, 413)
    r = api.client.post(
        f"/v1/collections/{cid}/documents", headers=api.a, json={"text": "b" * (2 * 1024 * 1024)}
    )
    _err(r, 413)
    assert _docs(api) == 0


def test_streamed_body_over_the_limit_is_cut_off(make_api, sqlite_url, hash_embedder) -> None:  # type: ignore[no-untyped-def]
    """A chunked upload with no Content-Length is refused once it passes the limit, long
    before the client has sent it all."""
    api = make_api(sqlite_url, hash_embedder, max_upload_mb=1)
    cid = api.collection(api.a)
    with LiveServer(api.client.app) as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        head = (
            f"POST /v1/collections/{cid}/documents HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {api.a['Authorization']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        sock.sendall(head.encode())
        sent = 0
        piece = b"a" * 65536
        response = b""
        sock.settimeout(0.2)
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
                try:
                    response = sock.recv(65536)
                    if response:
                        break
                except TimeoutError:
                    continue
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(5)
        if not response:
            response = sock.recv(65536)
        sock.close()
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert sent < 8 * 1024 * 1024
    assert _docs(api) == 0


def test_filenames_are_never_paths(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    for name in [
        "../../etc/passwd",
        "..\\..\\boot.ini",
        "/abs/path.txt",
        "a\x00b.txt",
        "ctl\x07\x1b.txt",
    ]:
        r = api.client.post(
            f"/v1/collections/{cid}/documents",
            headers=api.a,
            files=[("files", (name, f"content {name!r}".encode(), "text/plain"))],
        )
        assert r.status_code == 202, r.text
        stored = r.json()["documents"][0]["filename"]
        assert "/" not in stored and "\\" not in stored and ".." not in stored
        assert all(ord(ch) >= 32 for ch in stored)
