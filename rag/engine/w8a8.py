"""The w8a8 weight format: 8-bit weights and 8-bit activations, multiplied as integers.

Weight-only formats (rag.engine.quant) multiply in float: a decode step of a few rows is cheap
there, but every row of a prefill costs float arithmetic. Here each linear's input is rounded
to 8 bits with one scale a token, its weights to 8 bits with one scale an output row, and the
product is a sum of integers (VNNI's VPDPBUSD on the CPU: four times the multiply-adds of a
float32 FMA per instruction; without VNNI, AVX2's VPMADDWD: twice). Rounding a token's
activations with one scale loses the small channels next to the few very large ones a language
model's activations carry, so the channels are first evened out as SmoothQuant does (Xiao et
al., 2023): x / s goes into the int8 matmul, W * s into the weights, the same product in exact
arithmetic, with s_j = max|x_j|^alpha / max|W_j|^(1 - alpha). The maxima |x_j| are measured
once, when the model loads, on a calibration text shipped with the engine (calibration.txt:
prose, code, tables, a chat; the model's own chat template around part of it).

The integer sums do not depend on which other rows share a call, so a linear computes a row
the same in any batch (the weight-only formats change kernel with the row count). Attention's
float sums still change in their last bits with how a prompt is cut into chunks, and rounding
to 8 bits can turn such a change into a step of an int8 value: a prompt computed in other
chunks (after a prefix hit) moves its first token measurably, where float32 weights do not
(`bench/ttft.py --slots`; docs/decisions.md). Accuracy against float32 (perplexity, greedy
agreement, docfaq F1) is measured by bench/engine_accuracy.py; the kernel is csrc/i8gemm.cpp.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

import torch
from torch import nn

from rag.engine.model import AttentionMetadata, LlamaModel

log = logging.getLogger(__name__)

ALPHA = 0.5  # SmoothQuant's migration strength (the best of those bench/engine_accuracy.py tried)
CALIBRATION_TOKENS = 256  # tokens a calibration sequence, at most
LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
           ("mlp", "down_proj"))  # fmt: skip


def calibration_text() -> str:
    return resources.files("rag.engine").joinpath("calibration.txt").read_text(encoding="utf-8")


def calibration_sequences(tokenizer: Any) -> list[list[int]]:
    """The calibration text as token sequences of at most CALIBRATION_TOKENS: its paragraphs
    as plain text, and its first paragraphs as a chat in the model's own template (the shape
    of the prompts the engine sees), when the model has one."""
    text = calibration_text()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    ids: list[int] = []
    for p in paragraphs:
        ids += list(tokenizer(p + "\n\n").input_ids)
    seqs = [ids[i : i + CALIBRATION_TOKENS] for i in range(0, len(ids), CALIBRATION_TOKENS)]
    if getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "system", "content": "Answer from the passages below and cite them."},
            {"role": "user", "content": "\n\n".join(paragraphs[:3]) + "\n\nWhen was the fire?"},
        ]
        chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        seqs.append(list(tokenizer(chat, add_special_tokens=False).input_ids)[:CALIBRATION_TOKENS])
    return [s for s in seqs if len(s) > 1]


def calibration_for(weights: str, tokenizer: Any) -> list[list[int]] | None:
    """The calibration sequences where the weight format measures activations (w8a8)."""
    return calibration_sequences(tokenizer) if weights == "w8a8" else None


@torch.inference_mode()
def channel_maxima(model: LlamaModel, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """max |x_j| of every input channel of every linear, over the sequences prefilled by the
    model as it is (float weights), one at a time: {"layers.<i>.<proj>": [K] float32}."""
    maxima: dict[str, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.layers):
        for owner, name in LINEARS:
            key = f"layers.{i}.{name}"

            def record(_mod: nn.Module, args: tuple[torch.Tensor, ...], key: str = key) -> None:
                m = args[0].detach().float().abs().amax(0)
                old = maxima.get(key)
                maxima[key] = m if old is None else torch.maximum(old, m)

            hooks.append(getattr(getattr(layer, owner), name).register_forward_pre_hook(record))
    try:
        for seq in sequences:
            prefill_alone(model, seq)
    finally:
        for h in hooks:
            h.remove()
    return maxima


def prefill_alone(model: LlamaModel, ids: list[int], block: int = 16) -> torch.Tensor:
    """One sequence through the model from position 0, in a KV cache of its own: its hidden
    states [n, E] (after the final norm)."""
    cfg, n = model.cfg, len(ids)
    nb = -(-n // block)
    dtype = model.act_dtype
    kv = torch.zeros(
        cfg.num_layers, 2, nb, cfg.num_kv_heads, block, cfg.head_dim, dtype=dtype
    )  # [L, 2, NB, Hkv, BS, D]
    slots = torch.arange(n)
    heads = torch.arange(cfg.num_kv_heads)
    rows = ((slots[:, None] // block) * cfg.num_kv_heads + heads[None, :]) * block
    rows = rows + slots[:, None] % block
    meta = AttentionMetadata(
        kv_rows=rows.flatten(), num_decodes=0, decode_block_tables=None, decode_bias=None,
        prefills=[(0, n, n, torch.arange(nb))], prefill_runs=[None],
    )  # fmt: skip
    return model(torch.tensor(ids), torch.arange(n), kv, meta)  # type: ignore[no-any-return]


def smoothing(
    amax: torch.Tensor | None, weight: torch.Tensor, alpha: float = ALPHA
) -> torch.Tensor:
    """SmoothQuant's per-channel factors s [K] for weight [N, K] (ones without maxima)."""
    if amax is None:
        return torch.ones(weight.shape[1])
    wmax = weight.abs().amax(0).clamp(min=1e-5)
    s = amax.clamp(min=1e-5).pow(alpha) / wmax.pow(1 - alpha)
    return s.clamp(min=1e-5, max=1e5)


class A8Linear(nn.Module):
    """A linear layer in w8a8: int8 weights (one scale an output row), packed as the kernel
    reads them (csrc/i8gemm.cpp)."""

    packed: torch.Tensor
    wsum: torch.Tensor
    ws: torch.Tensor
    smooth: torch.Tensor
    bias: torch.Tensor

    def __init__(
        self,
        weight: torch.Tensor,  # [N, K]
        bias: torch.Tensor | None,  # [N]
        amax: torch.Tensor | None,  # [K]: max |x_j| measured on the calibration text
        kernels: Any,
    ) -> None:
        super().__init__()
        w = weight.detach().float()
        n, k = w.shape
        if k % 4:
            raise ValueError(f"w8a8 needs in_features ({k}) divisible by 4")
        self.out_features, self.in_features = n, k
        pad = -n % 16  # the kernel computes blocks of 16 outputs
        s = smoothing(amax, w)
        w = torch.cat([w * s[None, :], w.new_zeros(pad, k)])
        ws = (w.abs().amax(1) / 127).clamp(min=1e-12)
        q = torch.round(w / ws[:, None]).clamp(-127, 127).to(torch.int8)
        np_ = n + pad
        packed = q.view(np_ // 16, 16, k // 4, 4).permute(0, 2, 1, 3).contiguous()
        b = torch.empty(0)
        if bias is not None:
            b = torch.cat([bias.detach().float(), torch.zeros(pad)]).contiguous()
        self.kernels = kernels
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("wsum", q.sum(1, dtype=torch.int32), persistent=False)
        self.register_buffer("ws", ws.float().contiguous(), persistent=False)
        self.register_buffer("smooth", (1 / s).float().contiguous(), persistent=False)
        self.register_buffer("bias", b, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float().contiguous()
        if self.kernels is not None and x.device.type == "cpu":
            y = self.kernels.i8_linear(xf, self.packed, self.wsum, self.ws, self.smooth,
                                       self.bias)  # fmt: skip
        else:
            y = a8_reference(xf, self.weights(), self.ws, self.smooth, self.bias)
        return y[:, : self.out_features].to(x.dtype)

    def weights(self) -> torch.Tensor:
        """The int8 weights [N (padded to 16), K] back from the packed layout."""
        nb, k4 = self.packed.shape[0], self.packed.shape[1]
        return self.packed.permute(0, 2, 1, 3).reshape(nb * 16, k4 * 4)


def a8_reference(
    x: torch.Tensor,  # [M, K] float32
    q: torch.Tensor,  # [N, K] int8
    ws: torch.Tensor,  # [N]
    smooth: torch.Tensor,  # [K]
    bias: torch.Tensor,  # [N] or empty
) -> torch.Tensor:
    """What the kernel computes, in torch ops (integer sums exact in float64)."""
    xs = x * smooth
    scale = xs.abs().amax(1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    xq = torch.round(xs / scale).clamp(-127, 127)
    # Exact in float64, then rounded to float32 as the kernel converts its int32 sums.
    acc = (xq.double() @ q.double().t()).float()
    y = acc * ws * scale
    return y + bias if bias.numel() else y


def apply_w8a8(model: LlamaModel, maxima: dict[str, torch.Tensor], kernels: Any) -> None:
    """Replace every decoder linear by its A8Linear (in place, on the CPU)."""
    for i, layer in enumerate(model.layers):
        for owner, name in LINEARS:
            parent = getattr(layer, owner)
            linear = getattr(parent, name)
            amax = maxima.get(f"layers.{i}.{name}")
            setattr(parent, name, A8Linear(linear.weight, linear.bias, amax, kernels))
