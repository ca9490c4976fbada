"""Answers a user can trust (several passages in one prompt, evidence "all", unless a test says
otherwise): per-sentence attribution, unsupported and echoed sentences marked,
refusal from evidence, the grounded sampling defaults reaching the engine, the repetition
finish reason, and `sources` in the OpenAI responses. The generator is a fake here (these tests
are about the service around it); tests/answer/test_answers_real.py runs the real one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from rag.answer.cite import review, sentences, stem, terms
from rag.answer.evidence import choose, question_names
from rag.answer.prompt import GROUNDED, ONE
from rag.config import AskSettings
from rag.engine import FinishReason, SamplingParams, TokenEvent, Usage
from tests.answer.conftest import FakeEngine, ingest, parse_sse
from tests.conftest import Api

FACTS = [
    "The ferry to the island leaves from pier four at nine every morning.",
    "Storm warnings are broadcast on marine radio channel sixteen.",
    "The fish market opens before dawn and closes at noon on Sundays.",
]


@dataclass(frozen=True)
class P:
    text: str
    chunk_id: int = 0
    document_id: str = "d"
    start_char: int = 0


# ---------------------------------------------------------------- sentences and attribution


def test_sentences_keep_their_markers_and_spans() -> None:
    answer = "The ferry leaves at nine [1]. Storms come on channel sixteen. [2]\nOK!"
    spans = sentences(answer)
    assert [answer[s:e] for s, e in spans] == [
        "The ferry leaves at nine [1].",
        "Storms come on channel sixteen. [2]",  # a marker after the full stop is its own
        "OK!",
    ]
    assert stem("ferries") == stem("ferry") and stem("leaves") == stem("leave")
    assert terms("The ferry leaves at nine [3].") == {stem(w) for w in ("ferry", "leaves", "nine")}


def test_each_sentence_is_cited_attributed_or_marked_unsupported() -> None:
    given = [P(FACTS[0]), P(FACTS[1]), P(FACTS[2])]
    answer = (
        "The ferry leaves from pier four at nine [1]. "
        "Warnings of storms are broadcast on marine channel sixteen. "
        "The island has a famous lighthouse painted in red stripes. "
        "Yes."
    )
    r = review(answer, given, threshold=0.5)
    spans = sentences(answer)
    # [1] written; the second sentence attributed to the storm passage; the third is in no
    # passage: uncited and reported; "Yes." claims nothing.
    assert r.cited == [(1, (spans[0],), False), (2, (spans[1],), True)]
    assert r.unsupported == [spans[2]]
    assert r.echoed == []
    # A stricter threshold leaves the partly supported sentence unsupported too.
    strict = review("Storm warnings come from the harbour master's tower.", given, threshold=0.9)
    assert strict.cited == [] and len(strict.unsupported) == 1


def test_a_sentence_repeating_the_instruction_is_reported_echoed() -> None:
    instruction = GROUNDED.sentences()
    answer = (
        "After each sentence, write the number of its passage in brackets. "
        "The fish market closes at noon on Sundays [3]."
    )
    r = review(answer, [P(f) for f in FACTS], instruction=instruction)
    first = sentences(answer)[0]
    assert r.echoed == [first] and [n for n, _, _ in r.cited] == [3]
    assert "using only the passage" in " ".join(ONE.sentences())


# ---------------------------------------------------------------- evidence


def test_evidence_needs_the_questions_names_and_terms() -> None:
    given = [P(f, i) for i, f in enumerate(FACTS)]
    assert question_names("What is the capital of Vrelnia?") == {stem("vrelnia")}
    assert question_names("When does the ferry leave?") == set()
    assert question_names("Which warranty covers the X200 model?") == {stem("x200")}

    def answerable(question: str, min_support: float = 0.3) -> bool:
        choice = choose(question, given)
        return choice is not None and choice.answerable(min_support)

    assert not answerable("What is the capital of Vrelnia?")
    assert not answerable("Which warranty covers the X200 model?")
    assert answerable("Which radio channel carries storm warnings?")
    assert answerable("Which pier does the ferry leave from?")
    ch = choose("Which radio channel carries ferry timetables?", given)
    assert ch is not None and ch.passage == 1 and ch.names_found and ch.kind_found
    # Storm passage: "radio" and "channel" of {radio, channel, ferry, timetable}, weighted by
    # rarity; the sentence has no context (heading, title, subject) to add to its own share.
    assert 0.3 < ch.own_share < 0.7 and ch.share == ch.own_share
    assert not ch.answerable(0.7) and ch.answerable(0.3)


# ---------------------------------------------------------------- through the API


class RecordingEngine(FakeEngine):
    """A FakeEngine that records the sampling parameters and can end with any reason."""

    def __init__(self, answer: str, reason: FinishReason = FinishReason.STOP) -> None:
        super().__init__(answer=answer)
        self.params: list[SamplingParams] = []
        self.reason = reason

    def submit(
        self, prompt: Any, params: SamplingParams | None = None, request_id: str | None = None,
        **kw: object,
    ) -> AsyncIterator[TokenEvent]:  # fmt: skip
        self.params.append(params or SamplingParams())
        return super().submit(prompt, params, request_id, **kw)

    async def _stream(self, rid: str) -> AsyncIterator[TokenEvent]:
        async for ev in super()._stream(rid):
            if ev.finished and ev.finish_reason is FinishReason.STOP:
                yield TokenEvent(rid, "", (), self.reason, Usage(10, 0, 3))
            else:
                yield ev


def _api(make_api: Callable[..., Api], db_url: str, embedder: Any, engine: FakeEngine) -> Api:
    api = make_api(db_url, embedder, engine=engine)
    api.services.settings.ask.relevance_threshold = -1.0  # the hash embedder scores at random
    return api


def _ask(api: Api, cid: str, **body: Any) -> Any:
    body.setdefault("question", "Which radio channel carries storm warnings?")
    r = api.client.post(f"/v1/collections/{cid}/ask", json={"k": 3, **body}, headers=api.a)
    assert r.status_code == 200, r.text
    return r


def test_ask_reports_sentences_cited_and_unsupported(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    engine = RecordingEngine(
        "Storm warnings are broadcast on marine radio channel sixteen. "
        "Penguins migrate across frozen Antarctic plateaus every winter."
    )
    api = _api(make_api, sqlite_url, hash_embedder, engine)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    for stream in (False, True):
        r = _ask(api, cid, stream=stream, evidence="all")
        if stream:
            events = parse_sse(r.text)
            given, final = events[0][1]["passages"], events[-1][1]
        else:
            final = r.json()
            given = final["passages"]
        answer = final["answer"]
        [cited] = final["citations"]
        assert cited["attributed"] and "Storm" in given[cited["marker"] - 1]["text"]
        [(s, e)] = cited["sentences"]
        assert answer[s:e].startswith("Storm warnings") and answer[s:e].endswith("sixteen.")
        [(us, ue)] = final["unsupported"]
        assert answer[us:ue].startswith("Penguins")
        assert final["echoed"] == [] and final["mode"] == "generate"
        assert final["answer_source"] == "generated"


def test_grounded_defaults_reach_the_engine_and_requests_override_them(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    engine = RecordingEngine("Channel sixteen [2].")
    api = _api(make_api, sqlite_url, hash_embedder, engine)
    cid = api.collection(api.a, name="harbour")
    ingest(api, api.a, cid, FACTS)
    defaults = AskSettings().advanced
    body = _ask(api, cid, evidence="all").json()
    p = engine.params[-1]
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (
        defaults.frequency_penalty, defaults.presence_penalty, defaults.repetition_penalty,
    )  # fmt: skip
    assert p.stop_repetition and p.cite_passages == len(body["passages"]) == 3
    assert p.max_tokens == AskSettings().default_max_tokens
    _ask(api, cid, evidence="all", frequency_penalty=0.0, presence_penalty=1.5,
         repetition_penalty=1.2)  # fmt: skip
    p = engine.params[-1]
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 1.5, 1.2)
    # One passage (the default with the local engine): the same penalties, the citation mask
    # over that passage alone, and a sentence's worth of tokens.
    body = _ask(api, cid, presence_penalty=1.5).json()
    p = engine.params[-1]
    assert (p.frequency_penalty, p.presence_penalty) == (defaults.frequency_penalty, 1.5)
    assert p.cite_passages == len(body["passages"]) == 1
    assert p.max_tokens == defaults.sentence_tokens
    api.services.settings.ask.evidence = "all"  # the OpenAI route: the service's setting
    # The OpenAI route applies the client's penalties: to a collection's answer and to chat.
    for model in ("harbour", "smollm2"):
        r = api.client.post("/v1/chat/completions", headers=api.a, json={
            "model": model, "messages": [{"role": "user", "content": "Storm channel?"}],
            "frequency_penalty": 0.7, "presence_penalty": -0.5,
        })  # fmt: skip
        assert r.status_code == 200, r.text
        assert (engine.params[-1].frequency_penalty, engine.params[-1].presence_penalty) == (
            0.7, -0.5,
        )  # fmt: skip
    # Plain chat without penalties gets OpenAI's defaults, not the grounded ones.
    api.client.post("/v1/chat/completions", headers=api.a, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    p = engine.params[-1]
    assert (p.frequency_penalty, p.presence_penalty, p.cite_passages) == (0.0, 0.0, 0)


def test_a_question_the_passages_hold_no_evidence_for_is_refused_without_the_generator(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    engine = RecordingEngine("Vrelnia's capital is Ostrava [1].")
    api = _api(make_api, sqlite_url, hash_embedder, engine)
    cid = api.collection(api.a, name="harbour")
    ingest(api, api.a, cid, FACTS)
    body = _ask(api, cid, question="What is the capital of Vrelnia?").json()
    assert body["finish_reason"] == "no_evidence" and body["citations"] == []
    assert body["answer_source"] == "refused" and body["passages"] == []
    assert body["answer"].startswith("The documents do not contain")
    assert engine.params == []  # nothing generated
    question = [{"role": "user", "content": "Where is Vrelnia?"}]
    r = api.client.post(
        "/v1/chat/completions", headers=api.a, json={"model": "harbour", "messages": question}
    )
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["ragserve_finish_reason"] == "no_evidence"
    assert r.json()["ragserve"]["answer_source"] == "refused"
    assert engine.params == []
    # Answerable: generated (the sentence names what the passage does not: only the quote).
    body = _ask(api, cid).json()
    assert body["finish_reason"] == "stop" and len(engine.params) == 1
    assert body["answer_source"] == "quoted" and "Ostrava" not in body["answer"]


def test_a_repetition_stop_surfaces_in_ask_and_in_the_openai_extra_field(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    engine = RecordingEngine("Channel sixteen. Channel sixteen.", FinishReason("repetition"))
    api = _api(make_api, sqlite_url, hash_embedder, engine)
    api.services.settings.ask.evidence = "all"  # /ask and the OpenAI route alike
    cid = api.collection(api.a, name="harbour")
    ingest(api, api.a, cid, FACTS)
    body = _ask(api, cid).json()
    assert body["finish_reason"] == "repetition"
    assert body["answer"] == "Channel sixteen."  # the repeat left out
    events = parse_sse(_ask(api, cid, stream=True).text)
    streamed = "".join(d["text"] for kind, d in events if kind == "token")
    final = events[-1][1]
    assert final["finish_reason"] == "repetition" and final["answer"] == "Channel sixteen."
    s, e = final["repeated"]  # the streamed tail the loop wrote again, for a client to hide
    assert streamed[s:e] == "Channel sixteen." and e == len(streamed)
    chat = {"model": "harbour", "messages": [{"role": "user", "content": "Storm channel?"}]}
    choice = api.client.post("/v1/chat/completions", json=chat, headers=api.a).json()["choices"][0]
    assert (choice["finish_reason"], choice["ragserve_finish_reason"]) == ("stop", "repetition")
    r = api.client.post("/v1/chat/completions", json={**chat, "stream": True}, headers=api.a)
    last = [d for _, d in parse_sse(r.text) if isinstance(d, dict) and d.get("choices")][-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["ragserve_finish_reason"] == "repetition"


def test_a_sentence_that_begins_as_an_earlier_one_stops_the_answer(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    # Too short for the engine's 10-token stop to catch before it comes back whole.
    loop = "The storm channel is sixteen [1]. It is loud. The storm channel is sixteen. " * 4
    engine = RecordingEngine(loop.strip())
    api = _api(make_api, sqlite_url, hash_embedder, engine)
    api.services.settings.ask.evidence = "all"
    cid = api.collection(api.a, name="harbour")
    ingest(api, api.a, cid, FACTS)
    events = parse_sse(_ask(api, cid, stream=True).text)
    streamed = "".join(d["text"] for kind, d in events if kind == "token")
    final = events[-1][1]
    assert final["finish_reason"] == "repetition"
    assert final["answer"] == "The storm channel is sixteen [1]. It is loud."
    s, e = final["repeated"]
    assert streamed[:s].rstrip() == final["answer"] and e == len(streamed)
    assert streamed[s:].startswith("The storm channel is sixteen")
    assert len(streamed) < len(loop) / 3  # stopped a few words into the repeat
    assert engine.cancelled  # and the generation freed
    # A repeat of a short sentence, or one that only starts alike, goes on.
    engine.answer = "Yes. Yes. The storm channel is sixteen. The storm channel is loud today."
    body = _ask(api, cid).json()
    assert body["finish_reason"] == "stop" and body["answer"] == engine.answer
    # Off with the settings of before.
    engine.answer = loop.strip()
    api.services.settings.ask.advanced.stop_repetition = False
    assert _ask(api, cid).json()["finish_reason"] == "stop"


def test_openai_sources_list_the_passages_given_marking_those_cited(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    """No marker written (the small model's habit): `sources` still lists every passage
    given, the one the answer is drawn from marked cited (it came back empty before)."""
    engine = RecordingEngine("Storm warnings are broadcast on marine radio channel sixteen.")
    api = _api(make_api, sqlite_url, hash_embedder, engine)
    api.services.settings.ask.evidence = "all"  # every passage given to the generator
    cid = api.collection(api.a, name="harbour")
    ingest(api, api.a, cid, FACTS)
    question = [{"role": "user", "content": "Which channel carries storm warnings?"}]
    chat = {"model": "harbour", "k": 3, "messages": question}
    body = api.client.post("/v1/chat/completions", json=chat, headers=api.a).json()
    r = api.client.post("/v1/chat/completions", json={**chat, "stream": True}, headers=api.a)
    last = [d for _, d in parse_sse(r.text) if isinstance(d, dict) and d.get("choices")][-1]
    for sources, passages in ((body["sources"], body["passages"]),
                              (last["sources"], last["passages"])):  # fmt: skip
        assert [s["chunk_id"] for s in sources] == [p["chunk_id"] for p in passages]
        assert [s["marker"] for s in sources] == [1, 2, 3]
        cited = [s for s in sources if s["cited"]]
        assert len(cited) == 1 and cited[0]["attributed"] and cited[0]["sentences"]
        assert "Storm" in passages[cited[0]["marker"] - 1]["text"]


def test_warming_without_a_passage_cache_is_a_409_conflict(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    api = _api(make_api, sqlite_url, hash_embedder, FakeEngine())
    cid = api.collection(api.a)
    r = api.client.post(f"/v1/collections/{cid}/warm", headers=api.a)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "conflict"
    assert "passage cache" in r.json()["error"]["message"]
