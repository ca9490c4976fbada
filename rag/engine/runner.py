"""Model runner: turns a SchedulerOutput into one forward pass and sampled tokens (a
ModelRunnerOutput). The only module that builds tensors."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from rag.engine.kernels import PagedDecode, paged_decode_kernel
from rag.engine.model import AttentionMetadata, LlamaModel
from rag.engine.sampler import Sampler
from rag.engine.scheduler import ModelRunnerOutput, ScheduledChunk, SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int


def kv_bytes_per_block(model: LlamaModel, block_size: int, dtype: torch.dtype) -> int:
    cfg = model.cfg
    elem = torch.empty((), dtype=dtype).element_size()
    return cfg.num_layers * 2 * cfg.num_kv_heads * block_size * cfg.head_dim * elem


class ModelRunner:
    """Owns the model, the KV cache tensor and the sampler. The only place tensors are built."""

    def __init__(
        self,
        model: LlamaModel,
        spec: KVCacheSpec,
        device: torch.device,
        *,
        attention_kernel: bool = False,
    ):
        self.model = model
        self.device = device
        self.block_size = spec.block_size
        cfg = model.cfg
        dtype = model.act_dtype
        # kv_caches: [num_layers, 2, NB, Hkv, BS, D]
        self.kv_caches = torch.zeros(
            cfg.num_layers, 2, spec.num_blocks, cfg.num_kv_heads, spec.block_size,
            cfg.head_dim, dtype=dtype, device=device,
        )  # fmt: skip
        self.sampler = Sampler(device)
        # Decode attention: the compiled kernel where it applies (CPU, float32), else torch.
        self.decode_kernel: PagedDecode | None = None
        if attention_kernel and device.type == "cpu" and dtype == torch.float32:
            self.decode_kernel = paged_decode_kernel()

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in out.finished:
            self.sampler.forget(request_id)
        if not out.chunks:
            return ModelRunnerOutput(sampled={})
        # Single-token chunks first: they share one batched attention call.
        decodes = [c for c in out.chunks if len(c.token_ids) == 1]
        prefills = [c for c in out.chunks if len(c.token_ids) > 1]
        chunks = decodes + prefills
        input_ids, positions, meta, sample_rows = self._prepare(decodes, prefills)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [T, E]
        sampling = [chunks[i] for i in sample_rows]
        if not sampling:
            return ModelRunnerOutput(sampled={})
        last_index = self._last_token_index(chunks)
        rows = torch.tensor([last_index[i] for i in sample_rows], device=self.device)
        logits = self.model.compute_logits(hidden[rows])  # [S, V]
        tokens = self.sampler(
            logits, [c.request_id for c in sampling], [c.params for c in sampling]
        )
        return ModelRunnerOutput(
            sampled={c.request_id: t for c, t in zip(sampling, tokens, strict=True)}
        )

    @staticmethod
    def _last_token_index(chunks: list[ScheduledChunk]) -> list[int]:
        idx, pos = [], 0
        for c in chunks:
            pos += len(c.token_ids)
            idx.append(pos - 1)
        return idx

    def _prepare(
        self, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        for row, c in enumerate(decodes + prefills):
            n = len(c.token_ids)
            ids.extend(c.token_ids)
            p = range(c.start_pos, c.start_pos + n)
            pos.extend(p)
            table = c.block_table
            slots.extend(table[i // bs] * bs + i % bs for i in p)
            if c.sample:
                sample_rows.append(row)
        dev = self.device

        def t(x: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.long, device=dev)

        decode_tables = decode_bias = None
        if decodes:
            max_blocks = max(len(c.block_table) for c in decodes)
            decode_tables = t(
                [c.block_table + [0] * (max_blocks - len(c.block_table)) for c in decodes]
            )  # [B, MB]
            ctx = t([c.start_pos + 1 for c in decodes])  # [B]
            if self.decode_kernel is None:
                arange = torch.arange(max_blocks * bs, device=dev)
                visible = arange[None, :] < ctx[:, None]  # [B, L]
                dtype = self.model.act_dtype
                decode_bias = torch.zeros(visible.shape, dtype=dtype, device=dev)
                decode_bias = decode_bias.masked_fill(~visible, float("-inf"))[:, None, None, :]
                # decode_bias: [B, 1, 1, L]
        meta_prefills = []
        biases: list[torch.Tensor | None] = []
        q_start = len(decodes)
        for c in prefills:
            n = len(c.token_ids)
            nblocks = -(-(c.start_pos + n) // bs)
            meta_prefills.append((q_start, n, c.start_pos, t(c.block_table[:nblocks])))
            if c.start_pos == 0:
                biases.append(None)  # plain causal over the chunk itself
            else:
                # Query i (at position start_pos + i) sees positions 0..start_pos + i.
                q_pos = torch.arange(c.start_pos, c.start_pos + n, device=dev)
                ctx_pos = torch.arange(c.start_pos + n, device=dev)
                biases.append(ctx_pos[None, :] <= q_pos[:, None])
            q_start += n
        # Row of each (token, KV head) in a layer's cache viewed as [NB * Hkv * BS, D].
        hkv = self.model.cfg.num_kv_heads
        slot_t = t(slots)
        heads = torch.arange(hkv, device=dev)
        kv_rows = ((slot_t[:, None] // bs) * hkv + heads[None, :]) * bs + slot_t[:, None] % bs
        meta = AttentionMetadata(
            kv_rows=kv_rows.flatten(),
            num_decodes=len(decodes),
            decode_block_tables=decode_tables,
            decode_bias=decode_bias,
            prefills=meta_prefills,
            prefill_biases=biases,
            decode_kernel=self.decode_kernel if decodes else None,
            decode_context_lens=ctx if decodes else None,
        )
        return t(ids), t(pos), meta, sample_rows
