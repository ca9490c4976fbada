"""Next-token choice from logits: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from rag.engine.sequence import SamplingParams


class Sampler:
    """Samples one token per row. Seeded requests get their own generator, so a request's
    output depends only on its seed and its own logits, not on what it was batched with."""

    def __init__(self, device: torch.device):
        self.device = device
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def __call__(
        self,
        logits: torch.Tensor,  # [S, V] float32
        request_ids: list[str],
        params: list[SamplingParams],
    ) -> list[int]:
        greedy = logits.argmax(dim=-1).tolist()
        if all(p.greedy for p in params):
            return greedy
        out = list(greedy)
        for i, p in enumerate(params):
            if p.greedy:
                continue
            probs = self.probs(logits[i], p)
            gen = self._generator(request_ids[i], p.seed)
            out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
        return out

    def verify(
        self,
        logits: torch.Tensor,  # [d + 1, V]: after the decoded token, then after each draft
        request_id: str,
        params: SamplingParams,
        drafts: list[int],
    ) -> list[int]:
        """The tokens a step with d drafts yields: the accepted drafts, then one sampled token
        (the correction of the first rejected draft, or the one after them all).

        Greedy: a draft is accepted when it is the argmax, so the output is token for token the
        output without drafts. Sampling: the rule of speculative sampling for a draft that is
        one token for sure (prompt lookup proposes, it does not sample): accept draft x with
        probability p(x); on rejection sample from p with x removed, renormalised. Each token
        then has exactly the distribution it would have had without drafts."""
        if params.greedy:
            targets = logits.argmax(dim=-1).tolist()
            out: list[int] = []
            for i, draft in enumerate(drafts):
                if targets[i] != draft:
                    return [*out, targets[i]]
                out.append(draft)
            return [*out, targets[len(drafts)]]
        gen = self._generator(request_id, params.seed)
        out = []
        for i, draft in enumerate(drafts):
            probs = self.probs(logits[i], params)
            u = torch.rand((), generator=gen, device=probs.device)
            if u.item() < probs[draft].item():
                out.append(draft)
                continue
            residual = probs.clone()
            residual[draft] = 0.0
            if float(residual.sum()) <= 0.0:  # p was all on the draft (u landed on 1.0)
                return [*out, draft]
            return [*out, int(torch.multinomial(residual, 1, generator=gen).item())]
        probs = self.probs(logits[len(drafts)], params)
        return [*out, int(torch.multinomial(probs, 1, generator=gen).item())]

    @staticmethod
    def probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
        """Probabilities over the vocabulary after temperature, top-k and top-p."""
        x = logits.float() / p.temperature  # [V]
        if p.top_k and p.top_k < x.shape[-1]:
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=True)
            cum = sorted_x.softmax(-1).cumsum(-1)
            # Keep the smallest prefix whose mass reaches top_p (always the top token).
            drop = cum - sorted_x.softmax(-1) >= p.top_p
            sorted_x = sorted_x.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
        return x.softmax(-1)
