"""The extractive mode: the passage sentences that answer best, quoted with their spans in the
document and cited, without the generator; per request, per collection and over the OpenAI
route."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag.answer.evidence import choose
from rag.answer.extract import extract
from tests.answer.conftest import FakeEngine, ingest, parse_sse
from tests.conftest import Api

DOCS = [
    "The ferry to the island leaves from pier four at nine every morning. Tickets are sold "
    "on board. In winter the ferry does not run on Sundays.",
    "Storm warnings are broadcast on marine radio channel sixteen. The harbour master "
    "repeats them every hour.",
    "The fish market opens before dawn and closes at noon on Sundays.",
]


@dataclass(frozen=True)
class P:
    chunk_id: int
    text: str
    document_id: str = "d"
    start_char: int = 100


def test_extract_quotes_the_best_sentence_and_its_neighbours_with_spans() -> None:
    passages = [P(i, t, f"d{i}") for i, t in enumerate(DOCS)]
    choice = choose("Which radio channel carries storm warnings?", passages)
    assert choice is not None and choice.answerable(0.3)
    got = extract(passages, choice, max_sentences=2)
    assert [q.marker for q in got.quotes] == [2, 2]  # one passage: the one that answers
    first, second = got.quotes
    assert first.text == "Storm warnings are broadcast on marine radio channel sixteen."
    assert second.text == "The harbour master repeats them every hour."
    for q in got.quotes:
        p = passages[q.marker - 1]
        assert p.text[q.start_char - p.start_char : q.end_char - p.start_char] == q.text
    assert got.answer == f"{first.text} [2] {second.text} [2]"
    assert got.support > 0.5
    # One sentence unless asked for more; the word budget leaves out what does not fit.
    assert [q.text for q in extract(passages, choice).quotes] == [first.text]
    assert len(extract(passages, choice, max_sentences=2, max_words=10).quotes) == 1
    # Nothing supports a question about something else: no evidence, so no quote at all.
    nothing = choose("Who painted the lighthouse?", passages)
    assert nothing is not None and not nothing.answerable(0.3)


def test_the_chosen_sentence_comes_first_then_the_others_in_reading_order() -> None:
    text = (
        "The ferry to the island leaves from pier four. Tickets are sold on board. "
        "The ferry carries forty cars and three hundred passengers."
    )
    passages = [P(7, text)]
    choice = choose("How many cars does the ferry carry?", passages)
    assert choice is not None and choice.answerable(0.3)
    got = extract(passages, choice, max_sentences=3)
    assert [q.text for q in got.quotes] == [
        "The ferry carries forty cars",  # the answer first: the clause about cars
        "The ferry to the island leaves from pier four.",  # then reading order
        "Tickets are sold on board.",
    ]
    assert [q.start_char - 100 for q in got.quotes] == [text.index(q.text) for q in got.quotes]
    assert got.quotes[0].score > 0 and got.quotes[1].score == got.quotes[2].score == 0.0


def test_extractive_answers_over_ask_and_openai_without_the_generator(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    engine = FakeEngine()
    api = make_api(sqlite_url, hash_embedder, engine=engine)
    api.services.settings.ask.relevance_threshold = -1.0  # the hash embedder scores at random
    cid = api.collection(api.a, name="harbour")
    docs = ingest(api, api.a, cid, DOCS)
    texts = dict(zip(docs, DOCS, strict=True))
    url = f"/v1/collections/{cid}/ask"
    question = "Which radio channel carries storm warnings?"

    def check(final: dict[str, Any], given: list[dict[str, Any]]) -> None:
        assert final["mode"] == "extractive" and final["finish_reason"] == "stop"
        assert final["answer_source"] == "quoted"
        assert final["quotes"] and final["usage"]["generated_tokens"] == 0
        for q in final["quotes"]:
            # The span is the sentence's place in the document's extracted text.
            assert texts[q["document_id"]][q["start_char"] : q["end_char"]] == q["text"]
            assert given[q["marker"] - 1]["document_id"] == q["document_id"]
            assert f"{q['text']} [{q['marker']}]" in final["answer"]
        assert "channel sixteen" in final["answer"]
        [c] = final["citations"]
        assert not c["attributed"] and given[c["marker"] - 1]["chunk_id"] == c["chunk_id"]
        for s, e in c["sentences"]:
            assert final["answer"][s:e].endswith(f"[{c['marker']}]")

    body = {"question": question, "k": 3, "mode": "extractive"}
    r = api.client.post(url, json=body, headers=api.a)
    assert r.status_code == 200, r.text
    check(r.json(), r.json()["passages"])
    r = api.client.post(url, json={**body, "stream": True}, headers=api.a)
    events = parse_sse(r.text)
    assert [n for n, _ in events] == ["passages", "token", "final"]
    check(events[-1][1], events[0][1]["passages"])
    assert events[1][1]["text"] == events[-1][1]["answer"]

    # The collection's default, as kv_reuse: a request that says nothing gets it.
    r = api.client.put(f"/v1/collections/{cid}/search-defaults", json={"mode": "extractive"},
                       headers=api.a)  # fmt: skip
    assert r.status_code == 200, r.text
    r = api.client.post(url, json={"question": question, "k": 3}, headers=api.a)
    check(r.json(), r.json()["passages"])
    chat = {"model": "harbour", "k": 3, "messages": [{"role": "user", "content": question}]}
    r = api.client.post("/v1/chat/completions", json=chat, headers=api.a)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "channel sixteen" in out["choices"][0]["message"]["content"]
    assert out["ragserve"]["mode"] == "extractive" and out["ragserve"]["quotes"]
    assert out["ragserve"]["answer_source"] == "quoted"
    assert [s["cited"] for s in out["sources"]].count(True) == 1
    assert engine.prompts == []  # the generator was never asked
    # A request can still ask for a generated answer.
    r = api.client.post(url, json={"question": question, "k": 3, "mode": "generate"},
                        headers=api.a)  # fmt: skip
    assert r.json()["mode"] == "generate" and len(engine.prompts) == 1
    # Nothing to quote: the same refusal as a generated answer's, without the generator.
    r = api.client.post(url, json={"question": "Who sails to Vrelnia?", "k": 3}, headers=api.a)
    assert r.json()["finish_reason"] == "no_evidence" and r.json()["quotes"] == []
    assert r.json()["answer_source"] == "refused" and len(engine.prompts) == 1
