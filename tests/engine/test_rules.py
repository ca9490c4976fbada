"""Penalties over generated tokens, the citation mask and the repetition stop."""

from __future__ import annotations

import pytest

from rag.engine.blocks import BlockManager
from rag.engine.rules import CitationMask, LogitRules, fits, marker_open
from rag.engine.scheduler import Scheduler, SchedulerConfig
from rag.engine.sequence import REPEAT_NGRAM, FinishReason, SamplingParams, Sequence
from rag.engine.spec import SpecConfig

torch = pytest.importorskip("torch")

TEXTS = [chr(i) for i in range(256)]  # one character a token, as CharTokenizer has it


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_frequency_and_presence_penalties_count_generated_tokens_only():
    """OpenAI's definition: logit -= count * frequency + (count > 0) * presence, counts over
    the output (the prompt is not passed in: quoting a passage is not punished)."""
    logits = torch.randn(256)
    before = logits.clone()
    generated = [5, 5, 5, 9]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    LogitRules().apply(logits, params, generated)
    expected = before.clone()
    expected[5] -= 3 * 0.5 + 0.25
    expected[9] -= 1 * 0.5 + 0.25
    torch.testing.assert_close(logits, expected)


def test_repetition_penalty_is_transformers_rule_over_the_output():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(1, 256) * 3
    generated = [3, 7, 7, 200]
    ours = logits[0].clone()
    LogitRules().apply(ours, SamplingParams(repetition_penalty=1.3), generated)
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([generated]), logits.clone())
    torch.testing.assert_close(ours, theirs[0])


def test_a_marker_may_hold_only_the_numbers_of_the_passages_given():
    assert marker_open("as the policy says [") == ""
    assert marker_open("see [1, ") == "1, "
    assert marker_open("x[") is None and marker_open("done [2] and") is None
    assert fits("", "1", 3) and fits("", "3]", 3) and not fits("", "4", 3)
    assert fits("1", ",", 3) and fits("1, ", "2", 3) and not fits("1", "0", 3)
    assert fits("1", "]. The", 3) and not fits("", "]", 3)  # an empty marker never closes
    assert not fits("", "n", 3) and not fits("", "0", 3)
    assert fits("1", "2", 12) and not fits("1", "3", 12)  # 12 yes, 13 no
    mask = CitationMask(lambda: TEXTS)
    allowed = mask.allowed(ids("cost ["), 2, torch.device("cpu"))
    assert allowed is not None
    assert {chr(i) for i in allowed.tolist()} == {"1", "2", " "}
    after_one = mask.allowed(ids("cost [1"), 2, torch.device("cpu"))
    assert after_one is not None and {chr(i) for i in after_one.tolist()} == {"]", ","}
    assert mask.allowed(ids("cost [1] and"), 2, torch.device("cpu")) is None


def test_a_steered_marker_names_only_the_passages_that_support_its_sentence():
    from rag.answer.cite import chooser
    from rag.engine.rules import sentence_before

    assert sentence_before("It opens at nine. Boats leave at noon [") == "Boats leave at noon "
    assert sentence_before("Boats leave at noon [") == "Boats leave at noon "
    assert fits("", "2", 3, frozenset({2})) and not fits("", "1", 3, frozenset({2}))
    assert not fits("2", ",", 3, frozenset({2}))  # nothing else to name
    assert not fits("2, ", "2", 3) and not fits("1, 1", "]", 3)  # each number once

    class P:
        def __init__(self, text: str) -> None:
            self.text = text

    choose = chooser([P("The museum opens at nine."), P("Boats leave the harbour at noon."),
                      P("The harbour boats leave daily at noon.")])  # fmt: skip
    assert choose("Boats leave at noon ") == (2, 3)  # tied: either
    assert choose("The harbour opens at noon") == (2, 3)
    assert choose("The museum opens at nine") == (1,)
    assert choose("Penguins swim") == ()  # none holds any: the model's choice
    mask = CitationMask(lambda: TEXTS)
    cpu = torch.device("cpu")
    allowed = mask.allowed(ids("The museum opens at nine ["), 3, cpu, choose)
    assert allowed is not None and {chr(i) for i in allowed.tolist()} == {"1", " "}
    allowed = mask.allowed(ids("Then penguins swim ["), 3, cpu, choose)
    assert allowed is not None and {chr(i) for i in allowed.tolist()} == {"1", "2", "3", " "}
    rules = LogitRules(lambda: TEXTS)
    logits = torch.zeros(256)
    logits[ord("3")], logits[ord("1")] = 5.0, 1.0  # the model would name passage 3
    params = SamplingParams(cite_passages=3, cite_choice=choose)
    rules.apply(logits, params, ids("The museum opens at nine ["))
    assert chr(int(logits.argmax())) == "1"


def test_the_mask_applies_to_the_logits_and_to_every_draft_position():
    from rag.engine.runner import ModelRunner
    from rag.engine.step import ScheduledChunk

    rules = LogitRules(lambda: TEXTS)
    logits = torch.randn(256)
    rules.apply(logits, SamplingParams(cite_passages=2), ids("it costs ["))
    assert chr(int(logits.argmax())) in "12 "
    # A decode with two drafts: row 0 follows the output, row 1 the output and "[", ...
    runner = ModelRunner.__new__(ModelRunner)
    runner.rules = rules
    history = ids("Q?") + ids("it costs")
    chunk = ScheduledChunk(
        "r", [history[-1], *ids(" [")], len(history) - 1, [], True,
        SamplingParams(cite_passages=2), num_draft=2, history=history, num_prompt=2,
    )  # fmt: skip
    rows = torch.randn(3, 256)
    runner._apply_rules(rows, chunk)
    assert torch.isfinite(rows[0]).all() and torch.isfinite(rows[1]).all()  # no marker yet
    assert {chr(i) for i in torch.nonzero(torch.isfinite(rows[2])).flatten().tolist()} == set("12 ")


def _cycle_runner(period: int):  # type: ignore[no-untyped-def]
    from rag.engine.step import ModelRunnerOutput

    class Cycle:
        def execute(self, out):  # type: ignore[no-untyped-def]
            return ModelRunnerOutput(
                sampled={
                    c.request_id: 100 + (c.start_pos + len(c.token_ids)) % period
                    for c in out.chunks
                    if c.sample
                }  # fmt: skip
            )

    return Cycle()


def test_an_answer_that_loops_stops_with_finish_reason_repetition():
    sched = Scheduler(SchedulerConfig(4, 64, 512), BlockManager(64, 4))
    runner = _cycle_runner(period=4)
    looping = Sequence("a", ids("loop?"), SamplingParams(max_tokens=200, stop_repetition=True), 512)
    allowed = Sequence("b", ids("loop?"), SamplingParams(max_tokens=40), 512)
    for s in (looping, allowed):
        sched.add(s)
    while sched.has_work:
        out = sched.schedule()
        sched.postprocess(out, runner.execute(out))
    assert looping.finish_reason == FinishReason.REPETITION
    assert REPEAT_NGRAM < looping.num_output_tokens <= REPEAT_NGRAM + 4 + 1
    assert allowed.finish_reason == FinishReason.LENGTH  # off unless asked


def test_penalised_greedy_with_drafts_is_penalised_greedy_without():
    """Penalties and the mask apply at every draft position: the same tokens with and
    without speculation, on a real (tiny, random) model."""
    from .conftest import generate_drafting
    from .test_quant import tiny

    prompts = [[5, 9, 17, 3] * 4, list(range(20, 40)) * 2, [7, 8] * 6]
    params = SamplingParams(max_tokens=24, frequency_penalty=0.4, presence_penalty=0.2,
                            repetition_penalty=1.1, cite_passages=3)  # fmt: skip

    def generate(spec):  # type: ignore[no-untyped-def]
        return generate_drafting(tiny(), prompts, spec, params=params, token_texts=lambda: TEXTS)

    plain, _ = generate(None)
    drafted, verified = generate(SpecConfig(k_max=4))
    assert drafted == plain and verified > 0
    unpenalised = SamplingParams(max_tokens=24)
    assert params.needs_history and not unpenalised.needs_history
