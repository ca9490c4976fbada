"""Rotary position embeddings: the frequencies of a model, rotating keys to a new position
(how a cached passage's keys move to where a later prompt puts it), and positions as runs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rag.engine.model_config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        factor = sc["factor"]
        low, high = sc["low_freq_factor"], sc["high_freq_factor"]
        old_len = sc["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    elif sc:
        raise ValueError(f"unsupported rope scaling {sc.get('rope_type', sc.get('type'))!r}")
    return inv_freq


def position_runs(positions: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """Sorted positions as runs of consecutive ones: (offset, length, last position + 1)."""
    out = []
    start = 0
    for i in range(1, len(positions) + 1):
        if i == len(positions) or positions[i] != positions[i - 1] + 1:
            out.append((start, i - start, positions[i - 1] + 1))
            start = i
    return tuple(out)


def rotate_keys(k: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys computed at position p, as computed at p + delta: RoPE rotations compose, so
    rotating by delta's angles moves them (k [..., D], the rotate-half layout)."""
    return k if delta == 0 else rotated_into(torch.empty_like(k), k, delta, inv_freq)


def rotated_into(
    out: torch.Tensor, k: torch.Tensor, delta: int, inv_freq: torch.Tensor
) -> torch.Tensor:
    """`rotate_keys(k, delta)` written into `out` (same shape; another dtype allowed), in
    three passes and no temporaries of k's size: what copying a cached passage in costs."""
    angles = float(delta) * inv_freq.to(torch.float64)  # [D/2], in float64: large deltas
    cos = angles.cos().to(out.dtype)
    sin = angles.sin().to(out.dtype)
    half = k.shape[-1] // 2
    x1, x2 = k[..., :half], k[..., half:]
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    return out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
