"""A Llama-family decoder (Llama 2/3, SmolLM2, Qwen2 layouts) over a paged KV cache.

Shapes: T = tokens of the whole step (all sequences, flattened, no padding), H = query heads,
Hkv = key/value heads, D = head dim, E = hidden size, B = decode sequences, L = context length.
The KV cache of a layer is [2, num_blocks, Hkv, block_size, D] (block-major: a block of one
layer is one contiguous [Hkv, BS, D] piece, so gathering a sequence's blocks copies large
contiguous chunks); a token's slot is block_id * block_size + offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import CausalBias, causal_lower_right

from rag.engine.kernels import PagedDecode
from rag.engine.model_config import ModelConfig
from rag.engine.rope import position_runs, rope_inv_freq, rotate_half


@dataclass
class AttentionMetadata:
    """How the step's flattened tokens map onto sequences and the KV cache.

    Decode-like chunks (one token each) come first in the batch and are attended in one batched
    call; prefill chunks follow, one attention call each.
    """

    kv_rows: torch.Tensor  # [T * Hkv] long: rows of the cache viewed as [NB * Hkv * BS, D]
    num_decodes: int  # B: tokens 0..B-1 are single-token chunks
    decode_block_tables: torch.Tensor | None  # [B, max_blocks] long (padded with 0)
    decode_bias: torch.Tensor | None  # [B, 1, 1, max_blocks * block_size]: 0 or -inf
    prefills: list[tuple[int, int, int, torch.Tensor]]  # (q_start, q_len, ctx_len, blocks)
    # Per prefill, its queries as runs of consecutive positions (offset in the chunk, length,
    # the position after the run's last): each run sees every position before its own end,
    # causally (the flash kernel's lower-right causal mask, no mask tensor). None: the chunk
    # is positions 0..q_len-1 and sees only itself.
    prefill_runs: list[tuple[tuple[int, int, int], ...] | None] | None = None
    # An explicit [q_len, ctx_len] visibility mask instead, where given (True = visible).
    prefill_biases: list[torch.Tensor | None] | None = None
    # Recompute by deviation (rag.engine.passages): per prefill, which of its tokens are
    # reused passage tokens ([q_len] bool) and how many of those to carry past the first
    # layer (the rest keep their cached KV from the second layer on); None: all of them.
    prefill_select: list[tuple[torch.Tensor, int] | None] | None = None
    # The compiled decode kernel (rag.engine.kernels) and what it reads instead of the bias:
    # each decode's context length, [B] long. None: the torch path below.
    decode_kernel: PagedDecode | None = None
    decode_context_lens: torch.Tensor | None = None
    # The runs' lower-right causal masks, built by the first layer that needs one and read by
    # the others (keyed by (run length, end)).
    run_masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)

    def run_mask(self, n: int, end: int, device: torch.device) -> torch.Tensor | CausalBias:
        """The mask of a run of `n` queries ending at position `end`: each sees every position
        before its own. On CUDA the flash kernel takes it as a bias with no tensor; on CPU
        torch would build the same [n, end] tensor in every layer's call, so it is built once
        a step here (the same attention, bit for bit: tests/engine/test_model.py)."""
        if device.type == "cuda" or n == end:
            return causal_lower_right(n, end)
        mask = self.run_masks.get((n, end))
        if mask is None:
            mask = torch.ones(n, end, dtype=torch.bool, device=device).tril(end - n)
            self.run_masks[(n, end)] = mask
        return mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, (self.h + 2 * self.hkv) * self.d, bias=cfg.attention_bias
        )
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.scale = self.d**-0.5

    def forward(
        self,
        x: torch.Tensor,  # [T, E]
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        kv_cache: torch.Tensor,  # [2, NB, Hkv, BS, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        h, hkv, d = self.h, self.hkv, self.d
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) D]
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        q = q.view(t, h, d)  # q: [T, H, D]
        k = k.view(t, hkv, d)  # k: [T, Hkv, D]
        v = v.view(t, hkv, d)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [NB, Hkv, BS, D]
        # index_copy_ writes whole [D] rows: several times faster than advanced indexing. The
        # cache may keep another dtype than the activations (kv_dtype): rounded as written.
        if k_cache.dtype != k.dtype:
            # Attend to what the cache holds, so that a chunk computes the same whether its
            # context came from the cache or from itself.
            k, v = k.to(k_cache.dtype), v.to(k_cache.dtype)
        k_cache.view(-1, d).index_copy_(0, meta.kv_rows, k.reshape(t * hkv, d))
        v_cache.view(-1, d).index_copy_(0, meta.kv_rows, v.reshape(t * hkv, d))

        out = torch.empty_like(q)  # [T, H, D]
        b = meta.num_decodes
        if b:
            out[:b] = self._decode(q[:b], k_cache, v_cache, meta)
        biases = meta.prefill_biases or [None] * len(meta.prefills)
        all_runs = meta.prefill_runs or [None] * len(meta.prefills)
        for (q_start, q_len, ctx, blocks), runs, bias in zip(
            meta.prefills, all_runs, biases, strict=True
        ):
            qp = q[q_start : q_start + q_len].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            if runs is None and bias is None:
                # Nothing cached before this chunk: attend to the chunk's own K/V.
                kp = k[q_start : q_start + q_len].to(q.dtype).transpose(0, 1).unsqueeze(0)
                vp = v[q_start : q_start + q_len].to(q.dtype).transpose(0, 1).unsqueeze(0)
                op = F.scaled_dot_product_attention(
                    qp, kp, vp, is_causal=True, scale=self.scale, enable_gqa=True
                )
                out[q_start : q_start + q_len] = op[0].transpose(0, 1)
                continue
            kp = _context(k_cache, blocks, ctx).to(q.dtype).unsqueeze(0)  # [1, Hkv, L, D]
            vp = _context(v_cache, blocks, ctx).to(q.dtype).unsqueeze(0)
            if bias is not None:
                op = F.scaled_dot_product_attention(
                    qp, kp, vp, attn_mask=bias, scale=self.scale, enable_gqa=True
                )  # [1, H, q, D]
                out[q_start : q_start + q_len] = op[0].transpose(0, 1)
                continue
            assert runs is not None
            for offset, n, end in runs:
                op = F.scaled_dot_product_attention(
                    qp[:, :, offset : offset + n], kp[:, :, :end], vp[:, :, :end],
                    attn_mask=meta.run_mask(n, end, q.device), scale=self.scale, enable_gqa=True,
                )  # fmt: skip
                out[q_start + offset : q_start + offset + n] = op[0].transpose(0, 1)
        return self.o_proj(out.view(t, h * d))  # [T, E]

    def _decode(
        self,
        q: torch.Tensor,  # [B, H, D]: one new token per sequence
        k_cache: torch.Tensor,  # [NB, Hkv, BS, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Attention of B single-token queries over their paged contexts.

        The blocks are gathered whole (one contiguous [Hkv, BS, D] copy each) and attended
        block by block: scores per (sequence, block, KV head) as one batched matmul, softmax
        over the whole context, then the weighted values summed over blocks. Query heads are
        grouped by their KV head, so GQA needs no K/V repeat."""
        bt = meta.decode_block_tables  # [B, MB]
        assert bt is not None
        if meta.decode_kernel is not None:
            assert meta.decode_context_lens is not None
            return meta.decode_kernel(q, k_cache, v_cache, bt, meta.decode_context_lens, self.scale)
        assert meta.decode_bias is not None
        b, hkv, d = q.shape[0], self.hkv, self.d
        g = self.h // hkv
        mb, bs = bt.shape[1], k_cache.shape[2]
        kd = k_cache.index_select(0, bt.flatten()).view(b, mb, hkv, bs, d).to(q.dtype)
        vd = v_cache.index_select(0, bt.flatten()).view(b, mb, hkv, bs, d).to(q.dtype)
        qd = q.view(b, 1, hkv, g, d)
        scores = torch.matmul(qd, kd.transpose(-1, -2))  # [B, MB, Hkv, G, BS]
        scores = scores.permute(0, 2, 3, 1, 4).reshape(b, hkv, g, mb * bs)  # [B, Hkv, G, L]
        scores = torch.add(meta.decode_bias, scores, alpha=self.scale)  # masked: -inf
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        probs = probs.view(b, hkv, g, mb, bs).permute(0, 3, 1, 2, 4)  # [B, MB, Hkv, G, BS]
        od = torch.matmul(probs, vd).sum(dim=1)  # [B, Hkv, G, D]
        return od.reshape(b, self.h, d)  # [B, H, D]


def _context(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached positions of one sequence as [Hkv, L, D]."""
    gathered = cache.index_select(0, blocks)  # [n, Hkv, BS, D]
    hkv, d = gathered.shape[1], gathered.shape[3]
    return gathered.transpose(0, 1).reshape(hkv, -1, d)[:, :length]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)  # [T, I] each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Table(Protocol):
    """The embedding table or output matrix in some weight format (rag.engine.quant)."""

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...
    def logits(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class FusedDecode:
    """The compiled decode step (rag.engine.kernels.decode_layers) and the layers' weights as
    it reads them: 15 tensors a layer, in the order csrc/decode.cpp names."""

    kernels: Any
    tensors: list[torch.Tensor]
    bits: int
    group: int
    max_rows: int


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        # The dtype of activations and of the KV cache; weights may be stored otherwise.
        self.act_dtype = torch.float32
        self.weight_format = "float32"
        # Set by a weight format (rag.engine.quant); None: embed_tokens and lm_head as they are.
        self._input_table: Table | None = None
        self._output_table: Table | None = None
        self._fused: FusedDecode | None = None

    def set_tables(self, input_table: Table, output_table: Table) -> None:
        """Embed and score through these (a weight format's tables) from now on; the float
        embedding and output matrices are released."""
        self._input_table, self._output_table = input_table, output_table
        del self.embed_tokens, self.lm_head

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return emb.cos().to(self.act_dtype), emb.sin().to(self.act_dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._input_table is not None:
            return self._input_table.rows(input_ids, self.act_dtype)
        return self.embed_tokens(input_ids).to(self.act_dtype)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: torch.Tensor,  # [num_layers, 2, NB, Hkv, BS, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed(input_ids)  # [T, E]
        cos, sin = self.rope(positions)
        fused = self._fused
        if fused is not None and meta.num_decodes == x.shape[0] <= fused.max_rows:
            # Every sequence brings one token: the layers in one compiled call.
            assert meta.decode_block_tables is not None and meta.decode_context_lens is not None
            x = fused.kernels.decode_layers(
                x.contiguous(), cos, sin, kv_caches, meta.kv_rows, meta.decode_block_tables,
                meta.decode_context_lens, fused.tensors, fused.bits, fused.group,
                self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
                self.cfg.rms_norm_eps, self.cfg.head_dim**-0.5,
            )  # fmt: skip
            return self.norm(x)
        kept: torch.Tensor | None = None
        rows = x.shape[0]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_caches[i], meta)
            if i == 0 and meta.prefill_select is not None and len(self.layers) > 1:
                kept, meta = self._select(x, positions, kv_caches[1], meta)
                x, cos, sin = x[kept], cos[kept], sin[kept]
        x = self.norm(x)  # [T, E]
        if kept is None:
            return x
        out = x.new_zeros(rows, x.shape[1])  # the rows left behind are never sampled
        out[kept] = x
        return out

    def _select(
        self,
        x: torch.Tensor,  # [T, E]: after the first layer
        positions: torch.Tensor,
        kv_cache: torch.Tensor,  # the second layer's, holding the copied passages' KV
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, AttentionMetadata]:
        """CacheBlend's choice: the reused tokens whose values at the second layer, computed
        now in this prompt, deviate most from the cached ones, and every other token; the
        attention metadata for those rows alone."""
        assert meta.prefill_select is not None and meta.prefill_biases is None
        t, hkv, d = x.shape[0], self.cfg.num_kv_heads, self.cfg.head_dim
        second = cast(DecoderLayer, self.layers[1])
        v = second.self_attn.qkv_proj(second.input_layernorm(x))[:, -hkv * d :].view(t, hkv, d)
        cached = kv_cache[1].view(-1, d).index_select(0, meta.kv_rows).view(t, hkv, d)
        deviation = (v.float() - cached.float()).square().sum(dim=(1, 2))  # [T]
        keep = torch.ones(t, dtype=torch.bool, device=x.device)
        for (q_start, _q_len, _ctx, _blocks), sel in zip(
            meta.prefills, meta.prefill_select, strict=True
        ):
            if sel is None:
                continue
            candidates, n_keep = sel
            idx = torch.nonzero(candidates).flatten() + q_start
            if n_keep >= len(idx):
                continue
            dropped = torch.ones(len(idx), dtype=torch.bool, device=x.device)
            dropped[torch.topk(deviation[idx], n_keep).indices] = False
            keep[idx[dropped]] = False
        kept = torch.nonzero(keep).flatten()
        keep_list, pos_list = keep.tolist(), positions.tolist()
        prefills, runs = [], []
        start = meta.num_decodes
        all_runs = meta.prefill_runs or [None] * len(meta.prefills)
        for (q_start, q_len, ctx, blocks), old in zip(meta.prefills, all_runs, strict=True):
            own = [pos_list[i] for i in range(q_start, q_start + q_len) if keep_list[i]]
            prefills.append((start, len(own), ctx, blocks))
            runs.append(None if old is None else position_runs(own))
            start += len(own)
        rows = meta.kv_rows.view(t, hkv)[kept].flatten()
        return kept, replace(
            meta, kv_rows=rows, prefills=prefills, prefill_runs=runs, prefill_select=None
        )

    def fuse_decode(self, fused: FusedDecode | None) -> None:
        """Run decode steps of up to `fused.max_rows` sequences through compiled kernels
        (rag.engine.quant.fused_decode builds it); None: through the layers."""
        self._fused = fused

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._output_table is not None:
            return self._output_table.logits(hidden)  # [S, V] float32
        return self.lm_head(hidden).float()  # [S, V]

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face Llama weight names, fusing q/k/v and gate/up projections."""
        own: dict[str, torch.Tensor] = {}
        for i in range(self.cfg.num_layers):
            p = f"model.layers.{i}."
            own[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat(
                [sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
            )
            if self.cfg.attention_bias:
                own[f"layers.{i}.self_attn.qkv_proj.bias"] = torch.cat(
                    [sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]
                )
            own[f"layers.{i}.self_attn.o_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
            own[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(
                [sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]
            )
            own[f"layers.{i}.mlp.down_proj.weight"] = sd[p + "mlp.down_proj.weight"]
            for n in ("input_layernorm", "post_attention_layernorm"):
                own[f"layers.{i}.{n}.weight"] = sd[p + f"{n}.weight"]
        own["embed_tokens.weight"] = sd["model.embed_tokens.weight"]
        own["norm.weight"] = sd["model.norm.weight"]
        if self.cfg.tie_word_embeddings:
            own["lm_head.weight"] = own["embed_tokens.weight"]
        else:
            own["lm_head.weight"] = sd["lm_head.weight"]
        # assign=True: the model may have been built on the meta device (no init cost).
        self.load_state_dict(own, strict=True, assign=True)
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.inv_freq = rope_inv_freq(self.cfg).to(self.embed_tokens.weight.device)
        self.act_dtype = self.embed_tokens.weight.dtype
