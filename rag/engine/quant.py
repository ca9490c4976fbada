"""Weight formats: a transform over a plain float model, as gpt-fast keeps them.

A decode step multiplies a few rows by every weight once, so its time is the weights' bytes;
a prefill multiplies hundreds of rows, so its time is arithmetic. Each format therefore keeps
what each needs:

| format   | decode (few rows)                          | prefill (many rows)          |
|----------|--------------------------------------------|------------------------------|
| float32  | float32 matmul                             | float32 matmul               |
| bfloat16 | bfloat16 matmul (AVX512-BF16 / tensor core) | the same                     |
| int8     | 8 bits per weight, a scale per output row  | a bfloat16 copy (*)          |
| int4     | 4 bits, a scale and a minimum per 32       | a bfloat16 copy (*)          |

(*) where bfloat16 matmuls run natively (CUDA; a CPU with AVX512-BF16 or AMX). On a CPU
without them (AVX2 only: AMD Zen 2/3, most desktop parts) torch emulates bfloat16 and a
prefill matmul takes several times float32's (bench/engine_matmul.py; docs/decisions.md), so
the copy is float32 there.

The int4 groups have the shape of GGUF's Q4_1 (q in 0..15, w = scale * q + min, 32 weights a
group), so a GGUF stored that way is held exactly: its decode is the float32 reference's up to
rounding. The tied embedding / output matrix of the int formats is 8 bits with a scale per 32
(GGUF's Q8_0, which the bundled model's table already is). Activations stay in the engine's
dtype (float32 on CPU): the quantized kernel (rag.engine.kernels.qgemm) dequantizes in
registers and multiplies in float32; the bfloat16 copies round the activations to bfloat16 for
the matmul only.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from rag.engine.model import DecoderLayer, FusedDecode, LlamaModel, Table
from rag.engine.w8a8 import LINEARS, A8Linear, apply_w8a8, channel_maxima

log = logging.getLogger(__name__)

WeightFormat = Literal["float32", "bfloat16", "int8", "int4", "w8a8"]
FORMATS: tuple[WeightFormat, ...] = ("float32", "bfloat16", "int8", "int4", "w8a8")
GROUP = 32  # weights per 4-bit group (and per 8-bit group of the embedding table)
# Inputs of at most this many rows take the quantized kernel; more take the dense copy (the
# kernel multiplies in float32; from about here on, bfloat16 matmuls are faster on AVX512-BF16).
DECODE_ROWS = 4
# A decode step of at most this many rows runs through the fused step (csrc/decode.cpp, the
# quantized kernel's float32 products): on an AVX512-BF16 CPU without AMX a step of up to 16
# rows is faster fused than through the layers' bfloat16 matmuls (docs/decisions.md, measured
# with bench/engine_burst.py). With AMX tiles bfloat16 matmuls overtake from about DECODE_ROWS on.
FUSED_ROWS = 16
# Where bfloat16 is emulated (AVX2 only: the dense copy is float32, 4 bytes a weight), the
# quantized kernel stays ahead far longer: the fused step up to this many rows (the runs on an
# AVX2-only CPU are in docs/decisions.md, "CPUs without AVX512-BF16").
EMULATED_ROWS = 32


def _cpu_has(probe: str) -> bool:
    """torch's probe of a CPU feature (`torch.cpu._is_<feature>_supported`); False if absent."""
    return bool(getattr(torch.cpu, probe, lambda: False)())


def native_bf16(device: torch.device) -> bool:
    """Whether bfloat16 matmuls run natively on `device` (CUDA; AVX512-BF16 or AMX on a CPU)."""
    if device.type != "cpu":
        return True
    return _cpu_has("_is_avx512_bf16_supported") or _cpu_has("_is_amx_tile_supported")


def prefill_dtype(device: torch.device) -> torch.dtype:
    """The dtype of an int format's dense copy (what prefill multiplies with) on `device`."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def fused_rows() -> int:
    """The largest decode step the fused step takes on this CPU."""
    if _cpu_has("_is_amx_tile_supported"):
        return DECODE_ROWS
    return FUSED_ROWS if native_bf16(torch.device("cpu")) else EMULATED_ROWS


def kernel_rows() -> int:
    """The most rows a quantized linear takes through its kernel (more: its dense copy)."""
    return DECODE_ROWS if native_bf16(torch.device("cpu")) else EMULATED_ROWS


# ---------------------------------------------------------------- packing


def pack_int4(
    w: torch.Tensor, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float -> (packed uint8 [N, K/2], scales [N, K/group], mins [N, K/group]).

    Asymmetric per group: min = the group's smallest weight, scale = (max - min) / 15, so the
    group's extremes are exact. Scales and minimums are rounded to float16 first, as GGUF stores
    them: weights that came from a Q4_1 GGUF then come back exactly."""
    n, k = w.shape
    if k % group or group % 32:
        raise ValueError(f"int4 needs K ({k}) divisible by the group ({group}), itself by 32")
    g = w.float().reshape(n, k // group, group)
    mins = g.amin(-1).half().float()
    scales = ((g.amax(-1) - mins) / 15).half().float()
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    q = torch.clamp(torch.round((g - mins[..., None]) / safe[..., None]), 0, 15).to(torch.uint8)
    q = q.reshape(n, k // 32, 32)
    packed = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(n, k // 2).contiguous()
    return packed, scales.contiguous(), mins.contiguous()


def unpack_int4(
    packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group: int = GROUP
) -> torch.Tensor:
    n, half = packed.shape
    k = half * 2
    b = packed.reshape(n, k // 32, 16)
    q = torch.cat([b & 0x0F, b >> 4], dim=-1).reshape(n, k // group, group).float()
    return (q * scales[..., None] + mins[..., None]).reshape(n, k)


def pack_int8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], scales [N, K/group]), symmetric: w = scale * q. With
    `group` = K a scale per output row; with 32, GGUF's Q8_0 (float16 scales)."""
    n, k = w.shape
    if k % group or group % 32:
        raise ValueError(f"int8 needs K ({k}) divisible by the group ({group}), itself by 32")
    g = w.float().reshape(n, k // group, group)
    scales = (g.abs().amax(-1) / 127).half().float()
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    q = torch.clamp(torch.round(g / safe[..., None]), -127, 127).to(torch.int8)
    return q.reshape(n, k).contiguous(), scales.contiguous()


def unpack_int8(q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    n, k = q.shape
    return (q.reshape(n, k // group, group).float() * scales[..., None]).reshape(n, k)


# ---------------------------------------------------------------- modules


class QuantLinear(nn.Module):
    """A linear layer in a weight format: the quantized kernel for decode-sized inputs, the
    dense copy (bfloat16, or float32 where bfloat16 is emulated) for prefill-sized ones."""

    q: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    dense: torch.Tensor
    bias: torch.Tensor | None
    bits: int
    group: int

    def __init__(
        self,
        linear: nn.Linear,
        fmt: WeightFormat,
        kernels: Any,
        decode_rows: int | None = None,
        dense: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        w = linear.weight.detach()
        self.out_features, self.in_features = w.shape
        self.fmt = fmt
        self.kernels = kernels
        rows = kernel_rows() if decode_rows is None else decode_rows
        self.decode_rows = rows if kernels is not None else 0
        self.bits = 4 if fmt == "int4" else 8
        self.group = GROUP if fmt == "int4" else self.in_features
        if fmt == "int4":
            q, scales, mins = pack_int4(w, self.group)
        else:
            (q, scales), mins = pack_int8(w, self.group), torch.empty(0)
        # Buffers, so that .to(device) moves them (and nothing converts their dtype).
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.register_buffer("mins", mins, persistent=False)
        copy = prefill_dtype(torch.device("cpu")) if dense is None else dense
        self.register_buffer("dense", w.to(copy).contiguous(), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows <= self.decode_rows and x.device.type == "cpu":
            y = self.kernels.qgemm(x.float().contiguous(), self.q, self.scales, self.mins,
                                   self.bits, self.group).to(x.dtype)  # fmt: skip
        else:
            y = F.linear(x.to(self.dense.dtype), self.dense).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def dequantized(self) -> torch.Tensor:
        """The float32 weights this layer computes with in decode."""
        if self.bits == 4:
            return unpack_int4(self.q, self.scales, self.mins, self.group)
        return unpack_int8(self.q, self.scales, self.group)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scales, self.mins))


class DenseLinear(nn.Module):
    """A linear layer whose weights are stored in another dtype than the activations (bfloat16
    weights on a float32 engine): activations are rounded to it for the matmul only."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer(
            "weight", linear.weight.detach().to(dtype).contiguous(), persistent=False
        )
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


class Q8Table(nn.Module):
    """The embedding table (and, tied or not, an output matrix) in 8 bits with a scale per 32:
    rows are dequantized on lookup, logits come from the quantized kernel."""

    q: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight: torch.Tensor, kernels: Any) -> None:
        super().__init__()
        q, scales = pack_int8(weight.detach(), GROUP)
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.kernels = kernels

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.q8_rows(self.q, self.scales, ids, GROUP).to(dtype)
        return unpack_int8(self.q[ids], self.scales[ids], GROUP).to(dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.device.type == "cpu":
            empty = torch.empty(0)
            return self.kernels.qgemm(x.float().contiguous(), self.q, self.scales, empty, 8, GROUP)
        return x.float() @ unpack_int8(self.q, self.scales, GROUP).t()


class DenseTable(nn.Module):
    """The embedding / output matrix as one dense tensor (float32 or bfloat16)."""

    weight: torch.Tensor

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().to(dtype).contiguous(), persistent=False)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).float()


# ---------------------------------------------------------------- the transform


def apply_weight_format(
    model: LlamaModel,
    fmt: WeightFormat,
    act_dtype: torch.dtype,
    kernels: Any | None,
    device: torch.device | None = None,
    calibration: list[list[int]] | None = None,
) -> None:
    """Replace the model's linears and its embedding/output tables by `fmt` (in place, on the
    CPU, before the model moves to `device`, the CPU when None). The int formats' dense copy
    is `prefill_dtype(device)`; without the compiled kernels (or off the CPU) they compute
    through it: correct, not faster. w8a8 (rag.engine.w8a8) measures its activations on the
    `calibration` token sequences first (none: no smoothing)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")
    usable = kernels
    dense = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(fmt)
    if fmt == "w8a8":
        if device is not None and device.type != "cpu":
            raise ValueError("the w8a8 weight format runs on the CPU only")
        apply_w8a8(model, channel_maxima(model, calibration) if calibration else {}, kernels)
    else:
        copy = prefill_dtype(device or torch.device("cpu"))
        for layer in layers_of(model):
            for owner_name, name in LINEARS:
                owner = getattr(layer, owner_name)
                linear = getattr(owner, name)
                if dense is None:
                    setattr(owner, name, QuantLinear(linear, fmt, usable, dense=copy))
                elif dense != act_dtype:
                    setattr(owner, name, DenseLinear(linear, dense))
                else:
                    linear.to(act_dtype)
    # w8a8 keeps the embedding / output matrix as the int formats do (GGUF's Q8_0,
    # weight-only): 8-bit activations into the output matrix moved greedy choices.
    embed = model.embed_tokens.weight
    head = model.lm_head.weight
    tied = head is embed or head.data_ptr() == embed.data_ptr()
    table: Table
    if dense is not None:
        table = DenseTable(embed, dense)
        output: Table = table if tied else DenseTable(head, dense)
    else:
        table = Q8Table(embed, usable)
        output = table if tied else Q8Table(head, usable)
    model.set_tables(table, output)
    model.weight_format = fmt
    log.info("engine weights: %s (%d calibration sequences)", fmt, len(calibration or []))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights a decode step reads (the quantized form where there is one)."""
    total = 0
    seen: set[int] = set()
    for module in model.modules():
        tensors: list[torch.Tensor] = []
        if isinstance(module, QuantLinear):
            tensors = [module.q, module.scales, module.mins]
        elif isinstance(module, A8Linear):
            tensors = [module.packed, module.ws, module.wsum]
        elif isinstance(module, Q8Table):
            tensors = [module.q, module.scales]
        elif isinstance(module, (DenseLinear, DenseTable, nn.Linear)):
            tensors = [module.weight]
        for t in tensors:
            if t.numel() and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def layers_of(model: LlamaModel) -> list[DecoderLayer]:
    return [layer for layer in model.layers if isinstance(layer, DecoderLayer)]


def fused_decode(model: LlamaModel, kernels: Any | None) -> FusedDecode | None:
    """The compiled decode step for `model`, when it can run it: int weights on the CPU, float32
    activations (the KV cache float32 or bfloat16), the kernels built. None otherwise (the
    layers run as modules)."""
    if kernels is None or model.act_dtype != torch.float32:
        return None
    tensors: list[torch.Tensor] = []
    kinds: set[tuple[int, int]] = set()
    empty = torch.empty(0)
    for layer in layers_of(model):
        attn, mlp = layer.self_attn, layer.mlp
        if layer.input_layernorm.weight.device.type != "cpu":
            return None
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        in_norm = layer.input_layernorm.weight.detach().float().contiguous()
        post_norm = layer.post_attention_layernorm.weight.detach().float().contiguous()
        if all(isinstance(m, A8Linear) and m.kernels is not None for m in linears):
            a8 = [cast(A8Linear, m) for m in linears]
            padded = any(m.out_features % 16 for m in a8)
            if padded or any(m.bias.numel() for m in a8[1:]):
                return None
            kinds.add((0, 0))
            parts = [[m.packed, m.wsum, m.ws, m.smooth] for m in a8]
            tensors += [in_norm, *parts[0], a8[0].bias, *parts[1], post_norm, *parts[2], *parts[3]]
            continue
        quantized: list[QuantLinear] = []
        for module in linears:
            if not isinstance(module, QuantLinear) or module.kernels is None:
                return None
            quantized.append(module)
        qkv, o, gu, down = quantized
        kinds.update((lin.bits, lin.group if lin.bits == 4 else 0) for lin in quantized)
        if o.bias is not None or gu.bias is not None or down.bias is not None:
            return None
        tensors += [in_norm]
        tensors += [qkv.q, qkv.scales, qkv.mins, empty if qkv.bias is None else qkv.bias]
        tensors += [o.q, o.scales, o.mins, post_norm]
        tensors += [gu.q, gu.scales, gu.mins, down.q, down.scales, down.mins]
    if len(kinds) != 1:
        return None
    ((bits, group),) = kinds
    return FusedDecode(kernels, tensors, bits, group or GROUP, fused_rows())
