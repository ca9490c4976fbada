"""The parts of the GenerationBackend contract every test generator shares."""

from __future__ import annotations

from rag.engine.protocol import Prompt, estimate_tokens


class BackendBasics:
    """Context length, token count and admission for a fake generator: it holds
    `max_model_len` tokens and is full when `waiting` reaches `max_waiting`."""

    max_model_len: int = 2048
    waiting: int = 0
    max_waiting: int = 8

    @property
    def context_tokens(self) -> int:
        return self.max_model_len

    def count_tokens(self, prompt: Prompt) -> int:
        return estimate_tokens(prompt)

    def has_room(self) -> bool:
        return self.waiting < self.max_waiting

    def step_alive(self) -> bool:
        return getattr(self, "alive", True)

    def drop_chunks(self, chunk_ids: set[int]) -> None:
        self.dropped = getattr(self, "dropped", set()) | chunk_ids

    def close(self) -> None:
        pass
