"""The web console: how it is served, the tuning route, and end-to-end runs in a real
headless Chromium against the real service on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.support.ui import Select

from rag.embed import Embedder
from rag.ops.tune import tune
from tests.conftest import Api
from tests.console.conftest import Console, Hold

WAIT_S = 30


# ---------------------------------------------------------------- served files, no browser


def test_console_is_served_with_a_strict_csp(sqlite_api: Api) -> None:
    c = sqlite_api.client
    r = c.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/console"
    for path, ctype in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
        ("/console/sse.js", "text/javascript"),
        ("/console/chart.js", "text/javascript"),
        ("/console/dom.js", "text/javascript"),
    ]:
        r = c.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith(ctype)
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "img-src 'self' data:" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    html = c.get("/console").text
    assert "<script>" not in html and "style=" not in html  # nothing inline for the CSP to block
    assert "http://" not in html and "https://" not in html  # no remote assets
    # Only the console's own files: no path from the request reaches the disk.
    for bad in ["/console/console.py", "/console/..%2F..%2Fconfig.py", "/console/index.htm"]:
        assert c.get(bad).status_code == 404, bad


def test_console_needs_no_key_but_the_api_does(sqlite_api: Api) -> None:
    c = sqlite_api.client
    assert c.get("/console").status_code == 200
    cid = sqlite_api.collection(sqlite_api.a)
    assert c.get(f"/v1/collections/{cid}/tuning").status_code == 401


def test_tuning_route(make_api: Callable[..., Api], db_url: str, hash_embedder: Embedder) -> None:
    api = make_api(db_url, hash_embedder)
    cid = api.collection(api.a, index={"kind": "hnsw"})
    r = api.client.get(f"/v1/collections/{cid}/tuning", headers=api.a)
    assert r.status_code == 404 and "rag tune" in r.json()["error"]["message"]
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for i in range(6):
        job = api.upload_text(api.a, cid, " ".join(words[i:] + words[:i]) + f" number {i}")
        api.wait_job(api.a, job["job_id"])
    report = tune(api.services, cid, n_queries=6, k=3, target_recall=0.5, apply=True)

    r = api.client.get(f"/v1/collections/{cid}/tuning", headers=api.a)
    assert r.status_code == 200, r.text
    t = r.json()
    assert t["collection_id"] == cid and t["kind"] == report.kind and t["k"] == 3
    assert len(t["points"]) == len(report.points) > 1
    assert {"knob", "value", "recall", "p50_ms", "p99_ms"} <= set(t["points"][0])
    assert t["chosen"]["value"] == report.chosen.value  # type: ignore[union-attr]
    assert t["search_defaults"]["ef_search"] == report.chosen.value  # type: ignore[union-attr]
    # Another tenant sees nothing.
    assert api.client.get(f"/v1/collections/{cid}/tuning", headers=api.b).status_code == 404


# ---------------------------------------------------------------- in the browser


def _wait(cond: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # the page may be re-rendering between polls
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f": {last!r}" if last else ""))


def _by(sel: str) -> tuple[str, str]:
    return ("css selector", sel)


def _open_documents(driver: Any, console: Console, cid: str) -> None:
    """Sign in and open a collection's documents page, ready for files to be dropped."""
    _sign_in(driver, console)
    driver.get(f"{console.url}/console#/c/{cid}/documents")
    _wait(lambda: driver.find_element(*_by("#dropzone")).is_displayed(), "the drop zone")


def _sign_in(driver: Any, console: Console) -> None:
    driver.get(console.url + "/console")
    field = _wait(lambda: driver.find_element(*_by("#signin-key")), "the sign-in form")
    field.send_keys(console.key)
    driver.find_element(*_by("#signin-submit")).click()
    _wait(lambda: driver.find_element(*_by("#view-collections")).is_displayed(), "collections")


def _api_collection(console: Console, name: str, **body: object) -> str:
    r = httpx.post(
        console.url + "/v1/collections", json={"name": name, **body}, headers=console.headers
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _wait_indexed(driver: Any, n: int) -> list[Any]:
    def rows() -> list[Any] | None:
        found = driver.find_elements(*_by("#documents-body tr"))
        done = [r for r in found if r.get_attribute("data-status") == "indexed"]
        return found if len(found) == n and len(done) == n else None

    return _wait(rows, f"{n} documents indexed")  # type: ignore[no-any-return]


def _drop_files(driver: Any, files: dict[str, str]) -> None:
    """A real drop event on the drop zone, carrying File objects (what a drag from the
    desktop delivers; WebDriver cannot drag from outside the page)."""
    driver.execute_script(
        """
        const dt = new DataTransfer();
        const types = {pdf: "application/pdf", md: "text/markdown"};
        for (const [name, text] of Object.entries(arguments[0])) {
          const type = types[name.split(".").pop()] || "text/plain";
          dt.items.add(new File([text], name, {type}));
        }
        const zone = document.getElementById("dropzone");
        zone.dispatchEvent(new DragEvent("dragover", {dataTransfer: dt, bubbles: true}));
        zone.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true}));
        """,
        files,
    )


def _document_text(chunks: list[dict[str, Any]]) -> str:
    """A document's text rebuilt from its chunks (each is the text between its offsets)."""
    text = ""
    for ch in sorted(chunks, key=lambda ch: ch["start_char"]):
        text = text.ljust(ch["start_char"]) + ch["text"][max(0, len(text) - ch["start_char"]) :]
    return text


def _statuses(driver: Any) -> dict[str, str]:
    return {
        r.find_element(*_by(".filename")).text: str(r.get_attribute("data-status"))
        for r in driver.find_elements(*_by("#documents-body tr"))
    }


def _no_remote_images(driver: Any, console: Console) -> None:
    srcs = driver.execute_script(
        "return Array.from(document.images).map(i => i.getAttribute('src'))"
    )
    assert not [s for s in srcs if not s.startswith(("data:", console.url, "/"))], srcs


def _no_page_errors(driver: Any) -> None:
    """No script error and no Content-Security-Policy violation on the page."""
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe


@pytest.mark.slow
def test_sign_in_and_manage_collections(console: Console, browser: Any, shots: Path) -> None:
    driver = browser
    driver.get(console.url + "/")  # redirects to /console
    _wait(lambda: driver.find_element(*_by("#view-signin")).is_displayed(), "sign-in")
    driver.save_screenshot(str(shots / "console-signin.png"))

    driver.find_element(*_by("#signin-key")).send_keys("rk_not-a-real-key")
    driver.find_element(*_by("#signin-submit")).click()
    _wait(lambda: "refused" in driver.find_element(*_by("#banner")).text, "the refusal")
    assert driver.execute_script("return sessionStorage.length") == 0

    driver.find_element(*_by("#signin-key")).clear()
    _sign_in(driver, console)
    # The key lives in this tab's session storage only.
    assert driver.execute_script("return sessionStorage.getItem('ragserve.apiKey')") == console.key
    assert driver.execute_script("return localStorage.length") == 0
    assert "Bearer" not in driver.get_cookies().__repr__()

    driver.find_element(*_by("#create-name")).send_keys("handbook")
    driver.find_element(*_by("#create-description")).send_keys("Staff handbook")
    driver.find_element(*_by("#create-kind option[value='hnsw']")).click()
    driver.find_element(*_by("#knob-m")).send_keys("8")
    driver.find_element(*_by("#knob-ef-search")).send_keys("32")
    driver.find_element(*_by("#create-submit")).click()
    _wait(lambda: driver.find_element(*_by("#pane-documents")).is_displayed(), "documents tab")
    listed = httpx.get(console.url + "/v1/collections", headers=console.headers).json()
    (c,) = listed["collections"]
    assert c["name"] == "handbook" and c["index_kind"] == "hnsw"
    assert c["index_params"] == {"m": 8, "ef_search": 32}

    _api_collection(console, "papers", description="Research papers")
    driver.find_element(*_by(".brand")).click()
    _wait(lambda: len(driver.find_elements(*_by("#collections-body tr"))) == 2, "two rows")
    driver.save_screenshot(str(shots / "console-collections.png"))

    row = driver.find_element(*_by(f"#collections-body tr[data-id='{c['id']}']"))
    row.find_element(*_by("button.danger")).click()
    driver.switch_to.alert.accept()
    _wait(lambda: len(driver.find_elements(*_by("#collections-body tr"))) == 1, "one row left")
    assert c["id"] not in httpx.get(console.url + "/v1/collections", headers=console.headers).text

    driver.find_element(*_by("#signout")).click()
    _wait(lambda: driver.find_element(*_by("#view-signin")).is_displayed(), "signed out")
    assert driver.execute_script("return sessionStorage.length") == 0


DOC_FREEDONIA = (
    "Freedonia is a small country in the hills.\n\n"
    "The capital of Freedonia is Fredville, a city of bridges and bakeries.\n"
)
DOC_RIVER = "The river Fred runs through Fredville, the capital of Freedonia, north to south.\n"


@pytest.mark.slow
def test_upload_watch_ask_and_open_a_citation(
    console: Console, browser: Any, shots: Path, tmp_path: Path
) -> None:
    driver = browser
    # Small chunks, so a cited passage has neighbours to show around it.
    cid = _api_collection(
        console,
        "atlas",
        description="Facts about Freedonia",
        chunking={"tokens": 16, "overlap": 4},
    )
    _open_documents(driver, console, cid)

    # Two files dropped at once, and a third through the file picker.
    _drop_files(driver, {"freedonia.txt": DOC_FREEDONIA, "river.txt": DOC_RIVER})
    third = tmp_path / "bakeries.md"
    third.write_text("# Bakeries\n\nFredville's bakeries open at dawn.\n")
    driver.find_element(*_by("#file-input")).send_keys(str(third))
    rows = _wait_indexed(driver, 3)
    names = sorted(r.find_element(*_by(".filename")).text for r in rows)
    assert names == ["bakeries.md", "freedonia.txt", "river.txt"]

    driver.find_element(*_by("#tab-ask")).click()
    question = driver.find_element(*_by("#ask-question"))
    question.send_keys("What is the capital of Freedonia?")
    driver.find_element(*_by("#ask-submit")).click()
    # The answer streams in: part of it is on the page before the final event arrives.
    _wait(
        lambda: (
            "Fredville" in driver.find_element(*_by("#answer")).text
            and "done" not in driver.find_element(*_by("#answer-state")).get_attribute("class")
        ),
        "the first streamed tokens",
    )
    _wait(
        lambda: "done" in driver.find_element(*_by("#answer-state")).get_attribute("class"),
        "the final event",
    )
    answer = driver.find_element(*_by("#answer")).text
    assert answer.startswith("Fredville is the capital of Freedonia")
    assert len(console.engine.prompts) == 1

    passages = driver.find_elements(*_by("#passages li"))
    assert passages and any("Fredville" in p.text for p in passages)
    stages = {r.get_attribute("data-stage") for r in driver.find_elements(*_by("#timings-body tr"))}
    assert {"retrieve", "generate", "total"} <= stages
    assert "generated tokens" in driver.find_element(*_by("#answer-usage")).text

    cites = driver.find_elements(*_by("#answer a.cite"))
    assert [c.get_attribute("data-marker") for c in cites] == ["1", "2"]
    cites[0].click()
    mark = _wait(lambda: driver.find_element(*_by("#citation-text mark.cited")), "the passage")
    title = driver.find_element(*_by("#citation-title")).text
    assert title.startswith("[1]")
    # The highlighted span is exactly the cited characters of the cited document.
    r = httpx.post(
        f"{console.url}/v1/collections/{cid}/ask",
        json={"question": "What is the capital of Freedonia?"},
        headers=console.headers,
    )
    first = r.json()["citations"][0]
    chunks = httpx.get(
        f"{console.url}/v1/documents/{first['document_id']}/chunks", headers=console.headers
    ).json()["chunks"]
    (chunk,) = [ch for ch in chunks if ch["id"] == first["chunk_id"]]
    lo, hi = first["start_char"] - chunk["start_char"], first["end_char"] - chunk["start_char"]
    assert mark.text.split() == chunk["text"][lo:hi].split()
    assert first["filename"] in title
    # Around the span, the text of its neighbouring chunks: here, the rest of a short document.
    assert len(chunks) > 1
    context = driver.find_elements(*_by("#citation-text .context"))
    assert "".join(c.text for c in context).strip()
    shown = driver.find_element(*_by("#citation-text")).text
    assert shown.split() == _document_text(chunks).split()
    driver.save_screenshot(str(shots / "console-ask.png"))
    _no_page_errors(driver)


@pytest.mark.slow
def test_one_passage_answer_quotes_first_and_says_how_it_was_made(
    console: Console, browser: Any
) -> None:
    driver = browser
    cid = _api_collection(console, "one")
    _open_documents(driver, console, cid)
    _drop_files(driver, {"freedonia.txt": DOC_FREEDONIA, "river.txt": DOC_RIVER})
    _wait_indexed(driver, 2)

    driver.find_element(*_by("#tab-ask")).click()
    Select(driver.find_element(*_by("#ask-evidence"))).select_by_value("one")
    driver.find_element(*_by("#ask-question")).send_keys("What is the capital of Freedonia?")
    driver.find_element(*_by("#ask-submit")).click()
    _wait(
        lambda: "done" in driver.find_element(*_by("#answer-state")).get_attribute("class"),
        "the final event",
    )
    # The passage's own sentence comes first, cited; then the generator's sentence, which
    # agrees with it (the fake engine's first sentence), so the answer says "generated".
    answer = driver.find_element(*_by("#answer")).text
    assert answer.startswith("The capital of Freedonia is Fredville")
    assert "Fredville is the capital of Freedonia" in answer
    assert "The river Fred runs through it" not in answer  # one sentence only
    usage = driver.find_element(*_by("#answer-usage")).text
    assert usage.startswith("generated")
    cites = driver.find_elements(*_by("#answer a.cite"))
    assert cites and {c.get_attribute("data-marker") for c in cites} == {"1"}
    # The generator saw one passage: the one holding the quote.
    (prompt,) = console.engine.prompts
    assert "bridges and bakeries" in str(prompt) and "north to south" not in str(prompt)

    # A question the documents cannot answer is refused, and the console says so.
    driver.find_element(*_by("#ask-question")).clear()
    driver.find_element(*_by("#ask-question")).send_keys("How many bakeries does Fredville have?")
    driver.find_element(*_by("#ask-submit")).click()
    _wait(
        lambda: "done" in driver.find_element(*_by("#answer-state")).get_attribute("class"),
        "the refusal",
    )
    assert driver.find_element(*_by("#answer-usage")).text.startswith("refused")
    assert len(console.engine.prompts) == 1  # refused without the generator
    _no_page_errors(driver)


BROKEN_PDF = "%PDF-1.7\n%broken beyond repair\n"


@pytest.mark.slow
def test_document_list_is_live_failures_say_why_and_delete(
    console: Console, browser: Any, shots: Path, hold: Hold
) -> None:
    driver = browser
    cid = _api_collection(console, "atlas", description="Facts about Freedonia")
    _open_documents(driver, console, cid)

    # One good file and one that cannot be parsed: the failure shows its reason.
    _drop_files(driver, {"freedonia.txt": DOC_FREEDONIA, "scan.pdf": BROKEN_PDF})
    _wait(
        lambda: _statuses(driver) == {"freedonia.txt": "indexed", "scan.pdf": "failed"},
        "one indexed, one failed",
    )
    failed = driver.find_element(*_by("#documents-body tr[data-status='failed']"))
    assert "PDF could not be read" in failed.find_element(*_by(".reason")).text

    # The list follows each document through the pipeline without a reload: hold the worker
    # in parse, then in embed, with a second upload queued behind it.
    hold.close("parse", "embed")
    _drop_files(driver, {"river.txt": DOC_RIVER})
    _wait(lambda: _statuses(driver).get("river.txt") == "parsing", "river.txt parsing")
    third = {"bakeries.md": "# Bakeries\n\nFredville's bakeries open at dawn.\n"}
    _drop_files(driver, third)
    _wait(lambda: _statuses(driver).get("bakeries.md") == "queued", "bakeries.md queued")
    driver.save_screenshot(str(shots / "console-documents.png"))
    hold.open("parse")
    _wait(lambda: _statuses(driver).get("river.txt") == "embedding", "river.txt embedding")
    assert _statuses(driver)["bakeries.md"] == "queued"
    hold.open("embed")
    _wait_indexed_or_failed(driver, 4)
    assert _statuses(driver) == {
        "freedonia.txt": "indexed",
        "scan.pdf": "failed",
        "river.txt": "indexed",
        "bakeries.md": "indexed",
    }
    assert hold.entered.count("parse") >= 2  # the worker really was held

    # Delete: the row goes, and the document is gone from the API too.
    (row,) = [
        r
        for r in driver.find_elements(*_by("#documents-body tr"))
        if r.find_element(*_by(".filename")).text == "river.txt"
    ]
    doc_id = row.get_attribute("data-id")
    row.find_element(*_by("button.danger")).click()
    driver.switch_to.alert.accept()
    _wait(lambda: "river.txt" not in _statuses(driver), "the row gone")
    assert len(_statuses(driver)) == 3
    r = httpx.get(f"{console.url}/v1/documents/{doc_id}", headers=console.headers)
    assert r.status_code == 404, r.text
    _no_page_errors(driver)


def _wait_indexed_or_failed(driver: Any, n: int) -> list[Any]:
    def rows() -> list[Any] | None:
        found = driver.find_elements(*_by("#documents-body tr"))
        done = [r for r in found if r.get_attribute("data-status") in ("indexed", "failed")]
        return found if len(found) == n and len(done) == n else None

    return _wait(rows, f"{n} documents done")  # type: ignore[no-any-return]


HOSTILE = (
    "Quarterly report for Freedonia.\n"
    "<script>window.__pwned = 1</script>\n"
    '<img src="http://example.invalid/pixel.png" onerror="window.__pwned = 2">\n'
    "![tracking pixel](http://example.invalid/track.png)\n"
    "[a link](javascript:window.__pwned=3)\n"
)

# What a model might echo back from such a document.
HOSTILE_ANSWER = (
    "The report says [1]: <script>window.__answer_pwned = 1</script> "
    '<img src="http://example.invalid/a.png" onerror="window.__answer_pwned = 2"> '
    "![logo](http://example.invalid/answer.png)"
)


@pytest.mark.slow
def test_document_markup_renders_as_text(console: Console, browser: Any, shots: Path) -> None:
    driver = browser
    console.engine.answer = HOSTILE_ANSWER
    cid = _api_collection(console, "hostile")
    _open_documents(driver, console, cid)
    _drop_files(driver, {"report.txt": HOSTILE, "<img src=x onerror=alert(1)>.txt": HOSTILE + "2"})
    _wait_indexed(driver, 2)

    driver.find_element(*_by("#tab-ask")).click()
    driver.find_element(*_by("#ask-question")).send_keys("What does the quarterly report say?")
    driver.find_element(*_by("#ask-submit")).click()
    _wait(
        lambda: "done" in driver.find_element(*_by("#answer-state")).get_attribute("class"),
        "the answer",
    )
    driver.find_element(*_by("#answer a.cite")).click()
    _wait(lambda: driver.find_element(*_by("#citation-text mark.cited")), "the passage")

    # The markup is on the page as text, in the passages, the citation and the answer ...
    passages = driver.find_element(*_by("#passages")).text
    assert "<script>window.__pwned = 1</script>" in passages
    assert 'onerror="window.__pwned = 2"' in passages
    assert "<script>" in driver.find_element(*_by("#citation-text")).text
    assert "<script>window.__answer_pwned = 1</script>" in driver.find_element(*_by("#answer")).text
    # ... and nothing of it ran or loaded.
    assert driver.execute_script("return window.__pwned === undefined") is True
    assert driver.execute_script("return window.__answer_pwned === undefined") is True
    scripts = driver.execute_script(
        "return Array.from(document.scripts).map(s => s.getAttribute('src'))"
    )
    assert scripts == ["/console/app.js"]
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
    _no_remote_images(driver, console)
    assert driver.find_elements(*_by("a[href^='javascript:']")) == []
    _no_page_errors(driver)

    driver.find_element(*_by("#tab-documents")).click()
    _wait_indexed(driver, 2)
    names = [e.text for e in driver.find_elements(*_by("#documents-body .filename"))]
    assert "<img src=x onerror=alert(1)>.txt" in names
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
    assert driver.execute_script("return window.__pwned === undefined") is True


@pytest.mark.slow
def test_tune_chart_marks_the_default_and_sets_another(
    console: Console, browser: Any, shots: Path
) -> None:
    driver = browser
    cid = _api_collection(console, "tuned", index={"kind": "hnsw"})
    words = (
        "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"
    ).split()
    texts = [" ".join(words[i:] + words[:i]) + f" section {i}" for i in range(len(words))]
    r = httpx.post(
        f"{console.url}/v1/collections/{cid}/documents",
        json={"documents": [{"text": t} for t in texts]},
        headers=console.headers,
    )
    assert r.status_code == 202, r.text
    _wait(
        lambda: (
            httpx.get(f"{console.url}/v1/collections/{cid}", headers=console.headers)
            .json()["documents"]
            .get("indexed")
            == len(texts)
        ),
        "the documents indexed",
    )
    report = tune(console.services, cid, n_queries=10, k=3, target_recall=0.5, apply=True)
    assert report.chosen is not None

    _sign_in(driver, console)
    driver.get(f"{console.url}/console#/c/{cid}/tune")
    _wait(lambda: driver.find_element(*_by("#tune-chart svg")), "the chart")
    dots = driver.find_elements(*_by("#tune-chart circle.pt"))
    assert len(dots) == len(report.points)
    current = driver.find_elements(*_by("#tune-chart circle.pt.current"))
    assert len(current) == 1
    assert int(current[0].get_attribute("data-index")) == report.points.index(report.chosen)
    assert "current default" in driver.find_element(*_by("#tune-chart")).text
    driver.save_screenshot(str(shots / "console-tune.png"))

    # Choose the most accurate point by clicking it on the chart, then apply it.
    best = max(range(len(report.points)), key=lambda i: report.points[i].value or 0)
    assert report.points[best] is not report.chosen
    driver.find_element(*_by(f"#tune-chart circle.pt[data-index='{best}']")).click()
    _wait(
        lambda: (
            "selected"
            in driver.find_element(
                *_by(f"#tune-chart circle.pt[data-index='{best}']")
            ).get_attribute("class")
        ),
        "the selection",
    )
    driver.find_element(*_by("#tune-apply")).click()
    _wait(lambda: "now use" in driver.find_element(*_by("#tune-status")).text, "the new default")
    c = httpx.get(f"{console.url}/v1/collections/{cid}", headers=console.headers).json()
    assert c["search_defaults"]["ef_search"] == report.points[best].value
    current = driver.find_elements(*_by("#tune-chart circle.pt.current"))
    assert int(current[0].get_attribute("data-index")) == best


@pytest.mark.slow
def test_untuned_collection_says_how_to_tune(console: Console, browser: Any) -> None:
    driver = browser
    cid = _api_collection(console, "fresh")
    _sign_in(driver, console)
    driver.get(f"{console.url}/console#/c/{cid}/tune")
    msg = _wait(lambda: driver.find_element(*_by("#tune-empty")), "the message")
    _wait(lambda: msg.is_displayed(), "the message shown")
    assert f"rag tune {cid}" in msg.text


@pytest.mark.slow
def test_a_conversation_is_continued_shows_what_it_searched_and_is_deleted(
    console: Console, browser: Any
) -> None:
    driver = browser
    cid = _api_collection(console, "talk")
    _open_documents(driver, console, cid)
    _drop_files(driver, {"freedonia.txt": DOC_FREEDONIA, "river.txt": DOC_RIVER})
    _wait_indexed(driver, 2)
    driver.find_element(*_by("#tab-ask")).click()
    driver.find_element(*_by("#conversation-new")).click()
    _wait(lambda: Select(driver.find_element(*_by("#conversation-select"))).first_selected_option
          .get_attribute("value"), "a new conversation selected")  # fmt: skip

    def ask(question: str, turns: int) -> None:
        box = driver.find_element(*_by("#ask-question"))
        box.clear()
        box.send_keys(question)
        driver.find_element(*_by("#ask-submit")).click()
        _wait(lambda: len(driver.find_elements(*_by("#conversation-turns li.turn"))) == turns,
              f"{turns} turns listed")  # fmt: skip

    ask("What is the capital of Freedonia?", 1)
    ask("What kind of country is it?", 2)
    searched = driver.find_element(*_by("#answer-searched"))
    assert searched.text == "Searched: What kind of country is Freedonia?"
    turns = driver.find_elements(*_by("#conversation-turns li.turn"))
    assert "Searched: What kind of country is Freedonia?" in turns[1].text
    assert "Searched" not in turns[0].text  # the first question stood alone
    # The follow-up's prompt carried the first turn after the passage.
    roles = [m["role"] for m in console.engine.prompts[-1]]
    assert roles == ["system", "user", "assistant", "user"]
    listed = httpx.get(f"{console.url}/v1/collections/{cid}/conversations",
                       headers=console.headers).json()["conversations"]  # fmt: skip
    assert [c["turn_count"] for c in listed] == [2]

    driver.find_element(*_by("#conversation-delete")).click()
    _wait(lambda: not driver.find_elements(*_by("#conversation-turns li")), "the turns gone")
    assert Select(driver.find_element(*_by("#conversation-select"))).first_selected_option \
        .get_attribute("value") == ""  # fmt: skip
    listed = httpx.get(f"{console.url}/v1/collections/{cid}/conversations",
                       headers=console.headers).json()["conversations"]  # fmt: skip
    assert listed == []
    _no_page_errors(driver)
