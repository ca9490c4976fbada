"""Upload → indexed through the real app, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

import numpy as np
import pytest
from sqlalchemy import func, select

from rag.db.models import ChangeLog, Chunk
from tests.conftest import Api

TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. "
    "He trimmed the wick, polished the great lens, and watched the ships pass. "
) * 40


@pytest.mark.slow
def test_upload_to_indexed_with_real_model(
    make_api: Callable[..., Api], db_url: str, minilm
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(db_url, minilm)
    cid = api.collection(api.a)
    files = [
        ("files", ("keeper.txt", TEXT.encode(), "text/plain")),
        ("files", ("notes.md", b"# Tides\n\nThe tide tables are printed monthly.\n", None)),
        (
            "files",
            (
                "page.html",
                b"<html><body><p>Harbour <b>lights</b></p><script>alert(1)</script></body></html>",
                "text/html",
            ),
        ),
    ]
    r = api.client.post(
        f"/v1/collections/{cid}/documents",
        files=files,
        data={"metadata": '{"source": "test"}'},
        headers=api.a,
    )
    assert r.status_code == 202, r.text
    accepted = r.json()["documents"]
    assert [d["media_type"] for d in accepted] == ["text/plain", "text/markdown", "text/html"]
    for item in accepted:
        job = api.wait_job(api.a, item["job_id"])
        assert job["state"] == "done", job
        doc = api.client.get(f"/v1/documents/{item['document_id']}", headers=api.a).json()
        assert doc["status"] == "indexed"
        assert doc["metadata"] == {"source": "test"}
        assert doc["chunk_count"] >= 1

    keeper = accepted[0]["document_id"]
    chunks = api.client.get(f"/v1/documents/{keeper}/chunks", headers=api.a).json()["chunks"]
    assert len(chunks) >= 3  # ~1,200 words cannot fit one 200-token chunk
    assert all(c["token_count"] <= minilm.max_tokens for c in chunks)
    assert [c["ordinal"] for c in chunks] == list(range(len(chunks)))
    # Offsets point into the extracted text: chunk text is that slice.
    with api.services.db.read() as s:
        rows = s.scalars(
            select(Chunk).where(Chunk.document_id == keeper).order_by(Chunk.ordinal)
        ).all()
        from rag.db.models import Document

        text = s.get(Document, keeper).text
        log_rows = s.scalar(
            select(func.count())
            .select_from(ChangeLog)
            .where(ChangeLog.document_id == keeper, ChangeLog.op == "add")
        )
    assert log_rows == len(rows)
    for row in rows:
        assert text[row.start_char : row.end_char] == row.text
        vec = np.frombuffer(row.embedding, dtype="<f4")
        assert vec.shape == (384,)
        assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4
        assert row.embedding_model == "all-MiniLM-L6-v2"
    # The stored vector is the model's embedding of the chunk text.
    # One text alone goes through the query lane, in int8 by default: compare with the
    # float32 path documents take.
    again = minilm.embed([rows[0].text] * (minilm.QUERY_MAX + 1))[0]
    assert float(np.dot(again, np.frombuffer(rows[0].embedding, dtype="<f4"))) > 0.999
    # The script's content never became text.
    html_doc = accepted[2]["document_id"]
    html_chunks = api.client.get(f"/v1/documents/{html_doc}/chunks", headers=api.a).json()
    assert "alert" not in " ".join(c["text"] for c in html_chunks["chunks"])


def test_json_text_upload_and_listing(api: Api) -> None:
    cid = api.collection(api.a)
    ids = []
    for i in range(5):
        ids.append(api.upload_text(api.a, cid, f"document number {i} about harbours")["job_id"])
    r = api.client.post(
        f"/v1/collections/{cid}/documents",
        json={"documents": [{"text": "first"}, {"text": "second", "media_type": "text/markdown"}]},
        headers=api.a,
    )
    assert r.status_code == 202
    assert [d["media_type"] for d in r.json()["documents"]] == ["text/plain", "text/markdown"]
    for job in ids:
        assert api.wait_job(api.a, job)["state"] == "done"
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.client.get(
            f"/v1/collections/{cid}/documents", params=params, headers=api.a
        ).json()
        seen += [d["id"] for d in page["documents"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) == 7
    info = api.client.get(f"/v1/collections/{cid}", headers=api.a).json()
    assert sum(info["documents"].values()) == 7


def test_same_bytes_return_the_existing_document(api: Api) -> None:
    cid = api.collection(api.a)
    first = api.upload_text(api.a, cid, "identical bytes")
    second = api.upload_text(api.a, cid, "identical bytes")
    assert second["document_id"] == first["document_id"]
    assert second["duplicate"] is True and first["duplicate"] is False
    # Another collection is another document.
    other = api.collection(api.a, name="other")
    assert api.upload_text(api.a, other, "identical bytes")["document_id"] != first["document_id"]


def test_same_bytes_requeue_a_failed_document_and_say_so(
    make_api: Callable[..., Api], db_url: str, hash_embedder: object
) -> None:
    """Re-uploading the bytes of a failed document returned it, still failed, with its dead
    job: nothing could bring it back but a delete. It is now queued again with a new job,
    and the answer says `requeued`."""
    from rag.db import jobs

    api = make_api(db_url, hash_embedder, in_process_worker=False)
    cid = api.collection(api.a)
    first = api.upload_text(api.a, cid, "failed once")
    assert first["requeued"] is False
    db = api.services.db
    claimed = jobs.claim(db, "w1", lease_s=30)
    assert claimed is not None and claimed.id == first["job_id"]
    jobs.fail(db, claimed, "a worker fault", permanent=True, backoff_base_s=0, backoff_max_s=0)
    doc = api.client.get(f"/v1/documents/{first['document_id']}", headers=api.a).json()
    assert doc["status"] == "failed"
    again = api.upload_text(api.a, cid, "failed once")
    assert again["document_id"] == first["document_id"] and again["duplicate"] is True
    assert again["requeued"] is True and again["status"] == "queued"
    assert again["job_id"] not in (None, first["job_id"])
    retry = jobs.claim(db, "w2", lease_s=30)
    assert retry is not None and retry.id == again["job_id"] and retry.attempt == 1
    # A duplicate of a document that is not failed is not requeued.
    third = api.upload_text(api.a, cid, "failed once")
    assert third["job_id"] == again["job_id"] and third["requeued"] is False


def test_delete_tombstones_at_once(api: Api) -> None:
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "to be deleted " * 50)
    api.wait_job(api.a, item["job_id"])
    doc = item["document_id"]
    assert api.client.delete(f"/v1/documents/{doc}", headers=api.a).status_code == 204
    assert api.client.get(f"/v1/documents/{doc}", headers=api.a).status_code == 404
    assert api.client.get(f"/v1/documents/{doc}/chunks", headers=api.a).status_code == 404
    listing = api.client.get(f"/v1/collections/{cid}/documents", headers=api.a).json()
    assert doc not in [d["id"] for d in listing["documents"]]
    with api.services.db.read() as s:
        removes = s.scalar(
            select(func.count())
            .select_from(ChangeLog)
            .where(ChangeLog.document_id == doc, ChangeLog.op == "remove")
        )
        chunks = s.scalar(select(func.count()).select_from(Chunk).where(Chunk.document_id == doc))
    assert removes == chunks and chunks > 0
    # The same bytes can come back as a new document after the delete.
    again = api.upload_text(api.a, cid, "to be deleted " * 50)
    assert again["document_id"] != doc and not again["duplicate"]


def test_delete_while_queued_cancels_the_job(api: Api) -> None:
    api.services.stop.set()  # no worker: the job stays queued
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "never processed")
    assert (
        api.client.delete(f"/v1/documents/{item['document_id']}", headers=api.a).status_code == 204
    )
    job = api.client.get(f"/v1/jobs/{item['job_id']}", headers=api.a).json()
    assert job["state"] == "cancelled" and job["done"]


def test_long_poll_returns_when_done(api: Api) -> None:
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "long poll me")
    r = api.client.get(f"/v1/jobs/{item['job_id']}", params={"wait": 30}, headers=api.a)
    assert r.json()["state"] == "done"
    r = api.client.get(f"/v1/jobs/{item['job_id']}", params={"wait": -1}, headers=api.a)
    assert r.status_code == 422


def test_docx_and_pdf_upload(api: Api) -> None:
    import docx  # python-docx
    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    d = docx.Document()
    d.add_paragraph("Quarterly report on harbour traffic.")
    d.save(buf)
    pdf = io.BytesIO()
    c = canvas.Canvas(pdf)
    c.drawString(72, 720, "Ferry timetable for the winter season.")
    c.save()
    cid = api.collection(api.a)
    r = api.client.post(
        f"/v1/collections/{cid}/documents",
        headers=api.a,
        files=[
            ("files", ("report.docx", buf.getvalue(), "application/octet-stream")),
            ("files", ("timetable.pdf", pdf.getvalue(), "application/pdf")),
        ],
    )
    assert r.status_code == 202, r.text
    for item in r.json()["documents"]:
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
        chunks = api.client.get(
            f"/v1/documents/{item['document_id']}/chunks", headers=api.a
        ).json()["chunks"]
        assert "harbour traffic" in chunks[0]["text"] or "Ferry timetable" in chunks[0]["text"]


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", b"\0" * (300 * 1024 * 1024))
    return buf.getvalue()


def test_bad_file_fails_its_job_and_the_worker_stays_up(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    r = api.client.post(
        f"/v1/collections/{cid}/documents",
        headers=api.a,
        files=[("files", ("bomb.docx", _zip_bomb(), None))],
    )
    assert r.status_code == 202, r.text
    job = api.wait_job(api.a, r.json()["documents"][0]["job_id"])
    assert job["state"] == "failed"
    assert job["attempts"] == 1  # a bad file is not retried
    doc = api.client.get(
        f"/v1/documents/{r.json()['documents'][0]['document_id']}", headers=api.a
    ).json()
    assert doc["status"] == "failed" and doc["error"]
    # The worker carries on with the next upload.
    ok = api.upload_text(api.a, cid, "after the bomb")
    assert api.wait_job(api.a, ok["job_id"])["state"] == "done"
