"""Concurrent uploads over real HTTP connections."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import func, select

from rag.db.models import Blob, Document, IngestJob
from tests.conftest import Api, LiveServer


def test_ten_concurrent_uploads_of_one_file_make_one_document(api: Api) -> None:
    cid = api.collection(api.a)
    payload = b"one file, uploaded ten times at once\n" * 50
    with LiveServer(api.client.app) as server:

        def upload(_: int) -> dict:
            r = httpx.post(
                f"{server.url}/v1/collections/{cid}/documents",
                headers=api.a,
                files=[("files", ("same.txt", payload, "text/plain"))],
                timeout=60,
            )
            assert r.status_code == 202, r.text
            return r.json()["documents"][0]  # type: ignore[no-any-return]

        with ThreadPoolExecutor(10) as pool:
            results = list(pool.map(upload, range(10)))
    assert len({r["document_id"] for r in results}) == 1
    assert sum(not r["duplicate"] for r in results) == 1
    with api.services.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Document)) == 1
        assert s.scalar(select(func.count()).select_from(IngestJob)) == 1
        assert s.scalar(select(func.count()).select_from(Blob)) == 1
