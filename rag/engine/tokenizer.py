"""A transformers tokenizer behind the engine's Tokenizer seam."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from rag.engine.protocol import Prompt
from rag.engine.sequence import InvalidRequest


class HFTokenizer:
    """Raw text or chat messages in, ids out (the model's own chat template)."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tok(prompt).input_ids)
        if not self.tok.chat_template:
            raise InvalidRequest("this model has no chat template; send a plain prompt")
        text = self.tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def decode(self, token_ids: Seq[int]) -> str:
        return str(self.tok.decode(list(token_ids), skip_special_tokens=True))
