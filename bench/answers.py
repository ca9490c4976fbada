"""Answer quality: what a user sees from the bundled 135M model, today's behaviour against
the new defaults, in the same run.

    python bench/answers.py            # 48 docfaq questions a half, 2,000 wiki_vital docs
    python bench/answers.py --quick    # fewer questions, 500 documents (< 15 min, 2 cores)

Three question sets, made here with a fixed seed:

- docfaq (../shared/data/docfaq): the FAQ questions with the FAQ's own answer as reference,
  retrieved by exact inner product over the precomputed corpus vectors (bench/_docfaq.py);
  citation relevance from qrels.tsv. Settings were chosen on the even-numbered questions
  (their index in qa.jsonl); both halves are reported.
- wiki_vital: three questions per passage from its title by templates ("What is <title>?")
  with the passage's description as the reference, over a collection of N summaries
  (embedded here, exact inner product); gold = that passage.
- unanswerable: the same templates about made-up entities (names checked absent from every
  wiki_vital passage and title), over the same collection.

Each question goes through the service's own answer path (rag.answer: `ask.answer_from` with
the passages retrieved, then `generate.stream` to the Final) on the real engine in process.
"today" is the behaviour before issue 15 (AskSettings.legacy(): the old prompt, no penalties,
no citation mask, whole-answer attribution, no evidence check); "new" is AskSettings().

Ends with FIGURE lines: loop_rate, echo_rate, citation_precision, answer_f1_gain, refusal_rate,
false_refusal_rate (the new defaults; the gain is new / today on docfaq and wiki_vital).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402
from _docfaq import DocFaq, Passage, exact_top, normalise  # noqa: E402

from rag.ops.eval import overlap  # noqa: E402

SEED = 15
TEMPLATES = (
    "What is {title}?",
    "What kind of thing is {title}?",
    "Describe {title} in a few words.",
)


@dataclass(frozen=True)
class Question:
    set: str  # docfaq | wiki_vital | unanswerable
    qid: str
    question: str
    reference: str  # "" for unanswerable
    relevant: frozenset[int]  # chunk ids that answer it (qrels / the gold passage)
    half: str = ""  # docfaq: even | odd


# ---------------------------------------------------------------- the question sets


def docfaq_questions(df: DocFaq, per_half: int | None, rng: random.Random) -> list[Question]:
    row = {cid: i for i, cid in enumerate(df.ids)}
    qrels: dict[str, set[int]] = {}
    with shared("docfaq", "qrels.tsv").open() as f:
        next(f)
        for line in f:
            qid, cid, score = line.rstrip("\n").split("\t")
            if int(score) > 0 and cid in row:
                qrels.setdefault(qid, set()).add(row[cid])
    out = []
    for half, parity in (("even", 0), ("odd", 1)):
        pool = [(i, qa) for i, qa in enumerate(df.qa) if i % 2 == parity and qa.qid in qrels]
        if per_half is not None and per_half < len(pool):
            pool = sorted(rng.sample(pool, per_half))
        out += [
            Question("docfaq", qa.qid, qa.question, qa.answer, frozenset(qrels[qa.qid]), half)
            for _, qa in pool
        ]
    return out


def wiki_rows(n: int) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in shared("wiki_vital", "passages.jsonl").open()]
    return random.Random(SEED).sample(rows, n)


def wiki_questions(rows: list[dict[str, str]], n: int, rng: random.Random) -> list[Question]:
    picked = rng.sample(range(len(rows)), n)
    return [
        Question(
            "wiki_vital",
            f"{rows[i]['_id']}-{t}",
            template.format(title=rows[i]["title"]),
            rows[i]["description"],
            frozenset({i}),
        )  # fmt: skip
        for i in sorted(picked)
        for t, template in enumerate(TEMPLATES)
    ]


_SYLLABLES = [a + b for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "ae", "ou")]
_ENDINGS = ("", "n", "r", "th", "x", "sk", "nd", "l")


def made_up_names(vocabulary: set[str], n: int, rng: random.Random) -> list[str]:
    """Names of pseudo-words absent from `vocabulary` (every word of the corpus, also inside
    a longer word); half are two made-up words, half a kind of thing of a made-up place."""

    def word(syllables: int) -> str:
        while True:
            w = "".join(rng.choice(_SYLLABLES) for _ in range(syllables)) + rng.choice(_ENDINGS)
            if not any(w in v for v in vocabulary if len(v) >= len(w)):
                return w.capitalize()

    names: list[str] = []
    while len(names) < n:
        if len(names) % 2 == 0:
            names.append(f"{word(rng.choice((2, 3)))} {word(2)}")
        else:
            names.append(f"{rng.choice(_KINDS)} of {word(rng.choice((2, 3)))}")
    return names


_KINDS = ("The capital", "The Treaty", "The University", "The flag", "The national dish",
          "The first president", "The warranty of the", "The river")  # fmt: skip


def unanswerable_questions(n: int, rng: random.Random) -> list[Question]:
    """Questions about made-up entities: no word of their names is a word of any wiki_vital
    passage or title (all 10,033, not only the collection's), nor inside one."""
    every = [json.loads(line) for line in shared("wiki_vital", "passages.jsonl").open()]
    vocabulary = {w for r in every for w in _WORD.findall(f"{r['title']} {r['text']}".lower())}
    out = []
    for i, name in enumerate(made_up_names(vocabulary, n, rng)):
        template = TEMPLATES[i % len(TEMPLATES)]
        out.append(Question("unanswerable", f"made-up-{i}", template.format(title=name), "",
                            frozenset()))  # fmt: skip
    return out


_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


class WikiCollection:
    """N wiki_vital summaries, embedded once (documents: the passage text), searched by exact
    inner product like DocFaq."""

    def __init__(self, embedder: Any, rows: list[dict[str, str]]) -> None:
        self.rows = rows
        texts = [r["text"] for r in rows]
        self.vectors: npt.NDArray[np.float32] = np.asarray(embedder.embed(texts), np.float32)

    def retrieve(self, embedder: Any, question: str, k: int = 5) -> list[Passage]:
        return exact_top(self.vectors, self.rows, embedder, question, k, suffix=".txt")


# ---------------------------------------------------------------- answering


@dataclass
class Outcome:
    q: Question
    config: str
    answer: str
    finish: str
    given: list[int]  # chunk ids given, [1] first
    retrieved: list[int]  # chunk ids retrieved and relevant: given unless refused first
    cited: list[int]  # chunk ids cited
    markers: list[int]  # the numbers the answer wrote
    unsupported: int = 0  # sentences the service reported unsupported
    echoed: int = 0  # sentences the service reported echoed
    tokens: int = 0
    seconds: float = 0.0
    quotes: list[tuple[int, int, str]] = field(default_factory=list)  # chunk, start, text

    @property
    def gold_given(self) -> bool:
        """The question counts as answerable: its gold passage is among those retrieved."""
        return bool(self.q.relevant & set(self.given or self.retrieved))


def service_passages(found: Sequence[Passage]) -> list[Any]:
    """The bench's retrieved passages as the service's (document: the passage itself)."""
    from rag.retrieve import Passage as Retrieved

    return [
        Retrieved(
            p.chunk_id,
            f"doc-{p.chunk_id}",
            p.filename,
            0,
            p.text,
            0,
            len(p.text),
            p.score,
            p.dense_score,
            None,
            {},
        )  # fmt: skip
        for p in found
    ]


async def answer_one(
    engine: Any, settings: Any, config: str, q: Question, found: Sequence[Passage],
    mode: str, max_tokens: int, kv_reuse: str,
) -> Outcome:  # fmt: skip
    """One question through the service's answer path (rag.answer), over `found`."""
    from rag.answer import Final
    from rag.answer.ask import AskRequest, answer_from
    from rag.answer.cite import markers
    from rag.answer.generate import stream
    from rag.engine.sequence import SamplingParams

    passages = service_passages(found)
    relevant = [p for p in passages if p.dense_score >= settings.relevance_threshold]
    t0 = time.perf_counter()
    req = AskRequest(q.question, params=SamplingParams(max_tokens=max_tokens))
    if not relevant:
        return Outcome(q, config, "", "no_passages", [], [], [], [])
    prep = answer_from(engine if mode == "generate" else None, settings, req, relevant,
                       mode=mode, kv_reuse=kv_reuse)  # type: ignore[arg-type]  # fmt: skip
    final: Final | None = None
    async for item in stream(engine, prep, lambda ids: set(ids)):
        if isinstance(item, Final):
            final = item
    assert final is not None
    given = [p.chunk_id for p in prep.passages]
    written = [x.marker for x in final.quotes] if final.quotes else markers(final.answer)
    return Outcome(
        q, config, final.answer, final.finish_reason, given, [p.chunk_id for p in relevant],
        [c.chunk_id for c in final.citations], written, len(final.unsupported),
        len(final.echoed), final.usage.completion_tokens, time.perf_counter() - t0,
        [(x.chunk_id, x.start_char, x.text) for x in final.quotes],
    )  # fmt: skip


async def answer_all(
    engine: Any, settings: Any, config: str, items: list[tuple[Question, list[Passage]]],
    mode: str, max_tokens: int, kv_reuse: str, concurrency: int,
) -> list[Outcome]:  # fmt: skip
    gate = asyncio.Semaphore(concurrency)

    async def one(q: Question, found: list[Passage]) -> Outcome:
        async with gate:
            return await answer_one(engine, settings, config, q, found, mode, max_tokens,
                                    kv_reuse)  # fmt: skip

    return list(await asyncio.gather(*(one(q, found) for q, found in items)))


# ---------------------------------------------------------------- measuring

SOURCES = r"(passages?|documents?|text|context|information provided)"
REFUSAL = re.compile(
    rf"\b(i don'?t know|i do not know|i (can ?not|can'?t|am unable to) (answer|find|tell)|"
    rf"{SOURCES} (do|does|did) not (contain|say|mention|provide|answer|include)|"
    rf"not (mentioned|provided|stated|found|given|covered) in the {SOURCES}|"
    rf"no (information|mention) (of|about|on))",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")


def refused(o: Outcome) -> bool:
    """The service refused (no evidence, nothing relevant), or the model said it cannot tell."""
    if o.finish in ("no_evidence", "no_passages"):
        return True
    head = " ".join(_SPLIT.split(o.answer.strip())[:2])
    return REFUSAL.search(head) is not None


def answer_sentences(text: str) -> list[list[str]]:
    return [w for w in (normalise(s) for s in _SPLIT.split(text)) if w]


def looped(o: Outcome) -> bool:
    """A sentence of four words or more written twice, or an 8-word run written three times."""
    seen = Counter(" ".join(s) for s in answer_sentences(o.answer) if len(s) >= 4)
    if any(n >= 2 for n in seen.values()):
        return True
    words = normalise(o.answer)
    grams = Counter(tuple(words[i : i + 8]) for i in range(len(words) - 7))
    return any(n >= 3 for n in grams.values())


def echoed(o: Outcome, instruction: Sequence[str]) -> bool:
    """A sentence of the answer that is one of the system instruction's (token F1 >= 0.6),
    or a run of six words of it."""
    told = [normalise(s) for s in instruction]
    runs = {tuple(t[i : i + 6]) for t in told for i in range(len(t) - 5)}
    words = normalise(o.answer)
    if any(tuple(words[i : i + 6]) in runs for i in range(len(words) - 5)):
        return True
    for s in answer_sentences(o.answer):
        if len(s) >= 4 and any(len(t) >= 4 and overlap(s, t)[0] >= 0.6 for t in told):
            return True
    return False


def prf(prediction: str, reference: str) -> tuple[float, float, float]:
    """Token F1, precision, recall (SQuAD normalisation, markers removed)."""
    pred, ref = normalise(prediction), normalise(reference)
    if not pred or not ref:
        return 0.0, 0.0, 0.0
    return overlap(pred, ref)


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def summarise(outcomes: list[Outcome], instruction: Sequence[str]) -> dict[str, float]:
    answerable = [o for o in outcomes if o.q.set != "unanswerable"]
    scores = [prf(o.answer, o.q.reference) if not refused(o) else (0.0, 0.0, 0.0)
              for o in answerable]  # fmt: skip
    pairs = [(o, c) for o in answerable for c in dict.fromkeys(o.cited)]
    with_gold = [o for o in answerable if o.gold_given]
    written = [(o, n) for o in outcomes for n in o.markers]
    return {
        "n": len(outcomes),
        "f1": mean([s[0] for s in scores]),
        "precision": mean([s[1] for s in scores]),
        "recall": mean([s[2] for s in scores]),
        "cite_precision": mean([float(c in o.q.relevant) for o, c in pairs]),
        "cite_recall": mean([float(bool(o.q.relevant & set(o.cited))) for o in with_gold]),
        "cited_answers": mean([float(bool(o.cited)) for o in answerable]),
        "invalid_markers": float(sum(1 for o, n in written if not 1 <= n <= len(o.given))),
        "loop": mean([float(looped(o)) for o in outcomes if o.answer]),
        "echo": mean([float(echoed(o, instruction)) for o in outcomes if o.answer]),
        "words": mean([len(o.answer.split()) for o in outcomes if not refused(o)]),
        "refused": mean([float(refused(o)) for o in outcomes]),
        "false_refusal": mean([float(refused(o)) for o in with_gold]),
        "gold_given": mean([float(o.gold_given) for o in answerable]),
        "unsupported": mean([float(o.unsupported > 0) for o in answerable if not refused(o)]),
        "repetition_stops": mean([float(o.finish == "repetition") for o in outcomes]),
        "tokens": mean([float(o.tokens) for o in outcomes if o.tokens]),
    }


# ---------------------------------------------------------------- the run

CONFIGS = ("today", "new", "extractive")
ROWS = (("docfaq", "even"), ("docfaq", "odd"), ("wiki_vital", ""), ("unanswerable", ""))


def settings_of(config: str) -> tuple[Any, str]:
    from rag.config import AskSettings

    if config == "today":
        return AskSettings.legacy(), "generate"
    if config == "extractive":
        return AskSettings(), "extractive"
    return AskSettings(), "generate"


def table(results: dict[str, list[Outcome]]) -> tuple[str, dict[tuple[str, str, str], dict]]:
    from rag.answer.prompt import WORDINGS

    cols = ("n", "f1", "precision", "recall", "cite_precision", "cite_recall", "invalid_markers",
            "loop", "echo", "words", "refused", "false_refusal", "gold_given")  # fmt: skip
    lines = [
        "| set | config | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    stats = {}
    for name, half in ROWS:
        for config, outcomes in results.items():
            chosen = [o for o in outcomes if o.q.set == name and o.q.half == half]
            if not chosen:
                continue
            settings, _ = settings_of(config)
            s = summarise(chosen, WORDINGS[settings.prompt].sentences())
            stats[(name, half, config)] = s
            cells = [f"{s[c]:.0f}" if c in ("n", "invalid_markers") else f"{s[c]:.3f}"
                     for c in cols]  # fmt: skip
            label = f"{name} {half}".strip()
            lines.append(f"| {label} | {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines), stats


def pooled(results: dict[str, list[Outcome]], config: str, sets: Sequence[str]) -> dict:
    from rag.answer.prompt import WORDINGS

    settings, _ = settings_of(config)
    chosen = [o for o in results.get(config, []) if o.q.set in sets]
    return summarise(chosen, WORDINGS[settings.prompt].sentences())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docfaq", type=int, help="docfaq questions per half (default: all)")
    ap.add_argument("--wiki-docs", type=int, help="documents in the wiki_vital collection")
    ap.add_argument("--wiki-passages", type=int, help="passages asked about (3 questions each)")
    ap.add_argument("--unanswerable", type=int)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--kv-reuse", choices=("blend", "prefix", "off"), default="blend")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dump", help="write every answer as JSON lines here")
    ap.add_argument("--ttft", type=int, help="questions timed to the first token (default 8)")
    args = ap.parse_args()
    per_half = args.docfaq or (16 if args.quick else None)
    wiki_docs = args.wiki_docs or (500 if args.quick else 2000)
    wiki_passages = args.wiki_passages or (8 if args.quick else 40)
    unanswerable = args.unanswerable or (24 if args.quick else 60)
    configs = [c for c in args.configs.split(",") if c]
    args.ttft = 8 if args.ttft is None else args.ttft
    pairs: list[tuple[float, float]] = []

    import torch

    from rag.config import EmbedSettings
    from rag.embed import build_embedder
    from rag.engine import EngineSettings, build_engine

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rng = random.Random(SEED)
    embedder = build_embedder(EmbedSettings())
    df = DocFaq()
    rows = wiki_rows(wiki_docs)
    wiki = WikiCollection(embedder, rows)
    questions = (
        docfaq_questions(df, per_half, rng)
        + wiki_questions(rows, wiki_passages, rng)
        + unanswerable_questions(unanswerable, rng)
    )
    items = [
        (q, df.retrieve(embedder, q.question, k=5) if q.set == "docfaq"
         else wiki.retrieve(embedder, q.question, k=5))
        for q in questions
    ]  # fmt: skip
    print(f"{len(questions)} questions ({per_half or 'all'} docfaq a half, {wiki_docs} wiki "
          f"documents), retrieved in {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    engine = (
        build_engine(EngineSettings(threads=args.threads)) if configs != ["extractive"] else None
    )
    results: dict[str, list[Outcome]] = {}
    try:
        for config in configs:
            settings, mode = settings_of(config)
            t = time.perf_counter()
            results[config] = asyncio.run(answer_all(
                engine, settings, config, items, mode, args.max_tokens, args.kv_reuse,
                args.concurrency,
            ))  # fmt: skip
            print(f"{config}: {time.perf_counter() - t:.0f} s", flush=True)
        if engine is not None and args.ttft:
            pairs = asyncio.run(first_tokens(engine, items, args.ttft))
    finally:
        if engine is not None:
            engine.close()
    if args.dump:
        with open(args.dump, "w") as f:
            for outcomes in results.values():
                for o in outcomes:
                    row = {k: v for k, v in o.__dict__.items() if k != "q"}
                    row.update(set=o.q.set, half=o.q.half, qid=o.q.qid, question=o.q.question,
                               reference=o.q.reference, relevant=sorted(o.q.relevant))  # fmt: skip
                    f.write(json.dumps(row) + "\n")
    text, _ = table(results)
    print()
    print(text)
    print()
    print(sweeps(results, items))
    if engine is not None and args.ttft:
        today = statistics.median(a for a, _ in pairs)
        new = statistics.median(b for _, b in pairs)
        print(f"\nfirst token, {len(pairs)} questions one at a time, prompts computed whole: "
              f"today median {today:.0f} ms, new {new:.0f} ms ({new / today:.2f}x; median of "
              f"the pairs' ratios {statistics.median(b / a for a, b in pairs):.2f}x)")  # fmt: skip
    print(f"\nmax_tokens {args.max_tokens}, k 5, kv_reuse {args.kv_reuse}, "
          f"{time.perf_counter() - t0:.0f} s in all")  # fmt: skip
    figures(results)


def sweeps(results: dict[str, list[Outcome]], items: list[tuple[Question, list[Passage]]]) -> str:
    """What other thresholds would have given, on the same answers and passages: the
    per-sentence support threshold (citations of the new answers, re-reviewed by
    rag.answer.cite.review) and the evidence coverage (rag.answer.extract.evidence)."""
    import importlib

    from rag.answer.prompt import WORDINGS
    from rag.config import AskSettings

    cite = importlib.import_module("rag.answer.cite")
    extract = importlib.import_module("rag.answer.extract")
    found = {q.qid: service_passages(ps) for q, ps in items}
    lines = ["| support threshold | set | cite precision | cite recall | unsupported |",
             "|---|---|---|---|---|"]  # fmt: skip
    instruction = WORDINGS[AskSettings().prompt].sentences()
    for threshold in (0.4, 0.5, 0.6, 0.7, 0.8):
        for name, half in ROWS[:3]:
            chosen = [o for o in results.get("new", []) if (o.q.set, o.q.half) == (name, half)]
            pairs: list[float] = []
            hits: list[bool | None] = []
            flagged: list[float] = []
            for o in chosen:
                if not o.given or refused(o):
                    continue
                given = [p for p in found[o.q.qid] if p.chunk_id in set(o.given)]
                r = cite.review(o.answer, given, threshold=threshold, instruction=instruction)
                ids = {given[n - 1].chunk_id for n, _, _ in r.cited}
                pairs += [float(c in o.q.relevant) for c in ids]
                hits.append(bool(ids & o.q.relevant) if o.gold_given else None)
                flagged.append(float(bool(r.unsupported)))
            recall = [float(h) for h in hits if h is not None]
            lines.append(f"| {threshold} | {name} {half} | {mean(pairs):.3f} | "
                         f"{mean(recall):.3f} | {mean(flagged):.3f} |")  # fmt: skip
    lines += ["", "| evidence coverage | set | refused | false refusals (gold given) |",
              "|---|---|---|---|"]  # fmt: skip
    for coverage in (0.0, 0.2, 0.35, 0.5, 0.6):
        for name, half in ROWS:
            asked = [x for x, _ in items if (x.set, x.half) == (name, half)]
            refusals: list[float] = []
            false: list[float] = []
            for x in asked:
                relevant = [
                    p for p in found[x.qid] if p.dense_score >= AskSettings().relevance_threshold
                ]
                ev = extract.evidence(x.question, relevant)
                no = float(not relevant or not ev.answerable(coverage))
                refusals.append(no)
                if x.relevant & {p.chunk_id for p in relevant}:
                    false.append(no)
            lines.append(f"| {coverage} | {name} {half} | {mean(refusals):.3f} | "
                         f"{mean(false):.3f} |")  # fmt: skip
    return "\n".join(lines)


async def first_tokens(
    engine: Any, items: list[tuple[Question, list[Passage]]], n: int
) -> list[tuple[float, float]]:
    """Time to the first token, today's settings against the new, one question at a time,
    each prompt computed whole (kv_reuse off: no cache helps either side), the order
    alternating: (today ms, new ms) pairs."""
    from rag.answer import Final
    from rag.answer.ask import AskRequest, answer_from
    from rag.answer.generate import stream
    from rag.engine.sequence import SamplingParams

    pairs = []
    answerable = [(q, ps) for q, ps in items if q.set != "unanswerable"][:n]
    for i, (q, found) in enumerate(answerable):
        passages = service_passages(found)
        ms: dict[str, float] = {}
        for config in ("today", "new") if i % 2 == 0 else ("new", "today"):
            settings, _ = settings_of(config)
            req = AskRequest(q.question, params=SamplingParams(max_tokens=4))
            prep = answer_from(engine, settings.model_copy(update={"evidence_coverage": None}),
                               req, passages, kv_reuse="off")  # fmt: skip
            async for item in stream(engine, prep, lambda ids: set(ids)):
                if isinstance(item, Final):
                    ms[config] = item.timings_ms.get("first_token", float("nan"))
        pairs.append((ms["today"], ms["new"]))
    return pairs


def figures(results: dict[str, list[Outcome]]) -> None:
    if "new" not in results:
        return
    new = pooled(results, "new", ("docfaq", "wiki_vital", "unanswerable"))
    answerable = pooled(results, "new", ("docfaq", "wiki_vital"))
    gains = []
    for name in ("docfaq", "wiki_vital"):
        if "today" in results:
            before = pooled(results, "today", (name,))["f1"]
            after = pooled(results, "new", (name,))["f1"]
            gains.append(after / before if before else float("nan"))
    print(f"FIGURE loop_rate {new['loop']:.3f}")
    print(f"FIGURE echo_rate {new['echo']:.3f}")
    print(f"FIGURE citation_precision {answerable['cite_precision']:.3f}")
    print(f"FIGURE answer_f1_gain {min(gains) if gains else float('nan'):.3f}")
    print(f"FIGURE refusal_rate {pooled(results, 'new', ('unanswerable',))['refused']:.3f}")
    print(f"FIGURE false_refusal_rate {answerable['false_refusal']:.3f}")


if __name__ == "__main__":
    main()
