"""A transformers tokenizer behind the engine's Tokenizer seam."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from rag.engine.protocol import Prompt, SegmentedPrompt, SegmentSpan
from rag.engine.sequence import InvalidRequest


class HFTokenizer:
    """Raw text or chat messages in, ids out (the model's own chat template)."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self._texts: list[str] | None = None

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return self.encode_segments(prompt)[0]

    def encode_segments(self, prompt: Prompt) -> tuple[list[int], list[SegmentSpan]]:
        """The prompt's ids, and where its segments' tokens lie. The text between segments
        and each segment are tokenized apart, so a segment's tokens never depend on what
        surrounds it (a segment missing from the rendered template gets no span)."""
        if isinstance(prompt, str):
            return list(self.tok(prompt).input_ids), []
        messages = prompt.messages if isinstance(prompt, SegmentedPrompt) else prompt
        if not self.tok.chat_template:
            raise InvalidRequest("this model has no chat template; send a plain prompt")
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(prompt, SegmentedPrompt):
            return self._ids(text), []
        ids: list[int] = []
        spans: list[SegmentSpan] = []
        cursor = 0
        for seg in prompt.segments:
            at = text.find(seg.text, cursor)
            if at < 0 or not seg.text:
                continue
            ids += self._ids(text[cursor:at])
            start = len(ids)
            ids += self._ids(seg.text)
            spans.append(SegmentSpan(start, len(ids), seg.key, seg.chunk_id))
            cursor = at + len(seg.text)
        ids += self._ids(text[cursor:])
        return ids, spans

    def _ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False).input_ids) if text else []

    def token_texts(self) -> list[str]:
        """Every token's text on its own (index = token id), for the citation mask."""
        if self._texts is None:
            size = len(self.tok)
            self._texts = [str(t) for t in self.tok.batch_decode([[i] for i in range(size)])]
        return self._texts

    def decode(self, token_ids: Seq[int]) -> str:
        return str(self.tok.decode(list(token_ids), skip_special_tokens=True))
