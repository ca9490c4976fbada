"""Model runner: turns a SchedulerOutput into one forward pass and sampled tokens (a
ModelRunnerOutput). The only module that builds tensors."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rag.engine.kernels import PagedDecode, paged_decode_kernel
from rag.engine.model import AttentionMetadata, LlamaModel
from rag.engine.passages import Entry, PassageKVCache
from rag.engine.rope import position_runs, rotated_into
from rag.engine.rules import LogitRules
from rag.engine.sampler import Sampler
from rag.engine.step import ModelRunnerOutput, ScheduledChunk, SchedulerOutput

if TYPE_CHECKING:
    from rag.engine.cuda import DecodeGraphs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int
    dtype: torch.dtype | None = None  # None: the activations'


def kv_rows(block_table: list[int], positions: range, block_size: int, hkv: int) -> list[int]:
    """Rows of (token, KV head) pairs in a layer's cache viewed as [NB * Hkv * BS, D], in
    token-major order."""
    out: list[int] = []
    for i in positions:
        block, offset = block_table[i // block_size], i % block_size
        out.extend((block * hkv + h) * block_size + offset for h in range(hkv))
    return out


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
        cuda_graphs: bool = False,
        passages: PassageKVCache | None = None,
        token_texts: Callable[[], Sequence[str]] | None = None,
    ):
        self.model = model
        self.device = device
        self.block_size = spec.block_size
        cfg = model.cfg
        dtype = spec.dtype or model.act_dtype
        on_cuda = device.type == "cuda"
        # kv_caches: [num_layers, 2, NB, Hkv, BS, D]; on CUDA one block more, the scratch
        # block the padding rows of a captured decode step write into.
        self.kv_caches = torch.zeros(
            cfg.num_layers, 2, spec.num_blocks + (1 if on_cuda else 0), cfg.num_kv_heads,
            spec.block_size, cfg.head_dim, dtype=dtype, device=device,
        )  # fmt: skip
        self.sampler = Sampler(device)
        self.rules = LogitRules(token_texts)
        self.passages = passages
        self._copy_buffer: torch.Tensor | None = None  # _copy_in's, reused
        # Decode attention: the compiled kernel where it applies (CPU, float32 activations,
        # a float32 or bfloat16 cache), Triton on CUDA, else the torch path.
        self.decode_kernel: PagedDecode | None = None
        cpu_kernel = model.act_dtype == torch.float32 and dtype in (torch.float32, torch.bfloat16)
        if attention_kernel and device.type == "cpu" and cpu_kernel:
            self.decode_kernel = paged_decode_kernel()
        elif attention_kernel and on_cuda:
            from rag.engine.cuda import triton_paged_decode

            self.decode_kernel = triton_paged_decode()
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs and on_cuda:
            from rag.engine.cuda import DecodeGraphs

            self.graphs = DecodeGraphs(model, spec.num_blocks, spec.block_size)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in out.finished:
            self.sampler.forget(request_id)
        if not out.chunks:
            return ModelRunnerOutput(sampled={})
        input_ids, positions, meta, wanted = self._prepare(out.chunks)
        for chunk in out.chunks:  # every copy before any store: a store may evict
            if chunk.copies:
                self._copy_in(chunk)
        hidden = None
        if self.graphs is not None and meta.num_decodes == input_ids.shape[0]:
            hidden = self.graphs.run(
                input_ids, positions, self.kv_caches, meta, self.model.cfg.num_kv_heads,
                eager=lambda: self.model(input_ids, positions, self.kv_caches, meta),
            )  # fmt: skip
        if hidden is None:
            hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [T, E]
        for chunk in out.chunks:
            if chunk.stores:
                self._store(chunk)
        if not wanted:
            return ModelRunnerOutput(sampled={})
        rows = torch.tensor([r for _, chunk_rows in wanted for r in chunk_rows], device=self.device)
        logits = self.model.compute_logits(hidden[rows])  # [S, V]
        sampled: dict[str, int] = {}
        accepted: dict[str, list[int]] = {}
        plain: list[tuple[ScheduledChunk, int]] = []
        at = 0
        for chunk, chunk_rows in wanted:
            if chunk.params.needs_history:
                self._apply_rules(logits[at : at + len(chunk_rows)], chunk)
            if chunk.num_draft:
                drafts = chunk.token_ids[-chunk.num_draft :]
                tokens = self.sampler.verify(
                    logits[at : at + len(chunk_rows)], chunk.request_id, chunk.params, drafts
                )
                accepted[chunk.request_id], sampled[chunk.request_id] = tokens[:-1], tokens[-1]
            else:
                plain.append((chunk, at))
            at += len(chunk_rows)
        if plain:
            picked = logits[torch.tensor([a for _, a in plain], device=self.device)]
            tokens = self.sampler(
                picked, [c.request_id for c, _ in plain], [c.params for c, _ in plain]
            )
            sampled.update({c.request_id: t for (c, _), t in zip(plain, tokens, strict=True)})
        return ModelRunnerOutput(sampled=sampled, accepted=accepted)

    def _apply_rules(self, logits: torch.Tensor, chunk: ScheduledChunk) -> None:
        """Penalties and the citation mask on a chunk's rows: row i comes after the output so
        far and the chunk's first i drafts."""
        generated = chunk.history[chunk.num_prompt :] if chunk.history is not None else []
        drafts = chunk.token_ids[len(chunk.token_ids) - chunk.num_draft :]
        for i in range(logits.shape[0]):
            self.rules.apply(logits[i], chunk.params, [*generated, *drafts[:i]])

    def _prepare(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[
        torch.Tensor, torch.Tensor, AttentionMetadata, list[tuple[ScheduledChunk, list[int]]]
    ]:
        """The step's tokens as rows: single tokens first (decodes, and the tokens of a chunk
        with drafts, each a decode of its own that sees the context up to itself), then the
        prefill chunks. Also which rows each sampling chunk needs logits of."""
        bs = self.block_size
        decodes = [c for c in chunks if len(c.token_ids) == 1 or c.num_draft]
        prefills = [c for c in chunks if len(c.token_ids) > 1 and not c.num_draft]
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []  # per decode row
        ctx_lens: list[int] = []
        wanted: list[tuple[ScheduledChunk, list[int]]] = []
        for c in decodes + prefills:
            n = len(c.token_ids)
            first = len(ids)
            ids.extend(c.token_ids)
            p = c.positions if c.positions is not None else range(c.start_pos, c.start_pos + n)
            pos.extend(p)
            slots.extend(c.block_table[i // bs] * bs + i % bs for i in p)
            if len(c.token_ids) == 1 or c.num_draft:
                tables.extend([c.block_table] * n)
                ctx_lens.extend(i + 1 for i in p)
            if c.sample:
                last = first + n - 1
                wanted.append((c, list(range(last - c.num_draft, last + 1))))
        dev = self.device

        def t(x: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.long, device=dev)

        num_decodes = len(tables)
        decode_tables = decode_bias = ctx = None
        if num_decodes:
            max_blocks = max(len(b) for b in tables)
            decode_tables = t([b + [0] * (max_blocks - len(b)) for b in tables])  # [B, MB]
            ctx = t(ctx_lens)  # [B]
            if self.decode_kernel is None:
                arange = torch.arange(max_blocks * bs, device=dev)
                visible = arange[None, :] < ctx[:, None]  # [B, L]
                dtype = self.model.act_dtype
                decode_bias = torch.zeros(visible.shape, dtype=dtype, device=dev)
                decode_bias = decode_bias.masked_fill(~visible, float("-inf"))[:, None, None, :]
                # decode_bias: [B, 1, 1, L]
        meta_prefills = []
        runs: list[tuple[tuple[int, int, int], ...] | None] = []
        select: list[tuple[torch.Tensor, int] | None] = []
        q_start = num_decodes
        for c in prefills:
            if c.candidates is not None and any(c.candidates):
                keep = round(c.recompute_ratio * sum(c.candidates))
                select.append((torch.tensor(c.candidates, device=dev), keep))
            else:
                select.append(None)
            n = len(c.token_ids)
            ctx_len = (c.positions[-1] if c.positions is not None else c.start_pos + n - 1) + 1
            nblocks = -(-ctx_len // bs)
            meta_prefills.append((q_start, n, ctx_len, t(c.block_table[:nblocks])))
            if c.start_pos == 0 and c.positions is None:
                runs.append(None)  # plain causal over the chunk itself
            elif c.positions is None:
                runs.append(((0, n, ctx_len),))  # one run after the cached positions
            else:
                runs.append(position_runs(c.positions))
            q_start += n
        # Row of each (token, KV head) in a layer's cache viewed as [NB * Hkv * BS, D].
        hkv = self.model.cfg.num_kv_heads
        slot_t = t(slots)
        heads = torch.arange(hkv, device=dev)
        kv_rows = ((slot_t[:, None] // bs) * hkv + heads[None, :]) * bs + slot_t[:, None] % bs
        meta = AttentionMetadata(
            kv_rows=kv_rows.flatten(),
            num_decodes=num_decodes,
            decode_block_tables=decode_tables,
            decode_bias=decode_bias,
            prefills=meta_prefills,
            prefill_runs=runs,
            prefill_select=select if any(x is not None for x in select) else None,
            decode_kernel=self.decode_kernel if num_decodes else None,
            decode_context_lens=ctx,
        )
        return t(ids), t(pos), meta, wanted

    # ----- passage KV (rag.engine.passages)
    def _rows(self, chunk: ScheduledChunk, start: int, n: int) -> torch.Tensor:
        rows = kv_rows(chunk.block_table, range(start, start + n), self.block_size,
                       self.model.cfg.num_kv_heads)  # fmt: skip
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _copy_in(self, chunk: ScheduledChunk) -> None:
        """Write the cached passages of a prompt into its blocks, keys rotated to their new
        positions (all layers in one copy per passage)."""
        assert self.passages is not None, "a plan with copies needs the passage cache"
        cfg = self.model.cfg
        cache = self.kv_caches.view(cfg.num_layers, 2, -1, cfg.head_dim)
        for key, start, n in chunk.copies:
            entry = self.passages.get(key)
            assert entry is not None and entry.tokens == n, "a planned passage went missing"
            stored = entry.kv.to(device=cache.device)  # [L, 2, n * Hkv, D]
            kv = self._scratch(stored.shape)
            rotated_into(kv[:, 0], stored[:, 0], start - entry.start, self.model.inv_freq)
            kv[:, 1].copy_(stored[:, 1])
            cache.index_copy_(2, self._rows(chunk, start, n), kv)
            self.passages.stats.reused_tokens += n

    def _scratch(self, shape: torch.Size) -> torch.Tensor:
        """A buffer of the cache's dtype kept from one copy to the next: fresh memory costs
        its page faults on first touch, about as much as the copy itself."""
        need = shape.numel()
        if self._copy_buffer is None or self._copy_buffer.numel() < need:
            self._copy_buffer = torch.empty(
                need, dtype=self.kv_caches.dtype, device=self.kv_caches.device
            )
        return self._copy_buffer[:need].view(shape)

    def _store(self, chunk: ScheduledChunk) -> None:
        """Keep the KV of the passages this prompt computed, for the prompts to come."""
        if self.passages is None:
            return
        cfg = self.model.cfg
        cache = self.kv_caches.view(cfg.num_layers, 2, -1, cfg.head_dim)
        for key, start, n, chunk_id in chunk.stores:
            kv = cache.index_select(2, self._rows(chunk, start, n))  # [L, 2, n * Hkv, D]
            kv = kv.to(device=self.passages.device, dtype=self.passages.dtype)
            self.passages.put(key, Entry(kv, start, chunk_id, cfg.num_kv_heads))
