"""The engine's CUDA paths: decode attention over the paged blocks in a Triton kernel (no
gather), and decode steps captured as CUDA graphs.

Both are checked against the eager torch path where they start (the kernel on random data,
each graph on its first replay) and turned off, with a warning, if they disagree; neither is
needed for correctness: without them the engine runs the same computation eagerly. They are
exercised by `bench/gpu_check.sh` on a GPU machine and by the tests marked `gpu`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

PagedDecode = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


def triton_paged_decode() -> PagedDecode | None:
    """Decode attention in Triton: one program per (sequence, query head), reading that
    sequence's blocks where they lie with an online softmax. None when Triton is missing or
    the kernel disagrees with the torch path on a random check."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit  # type: ignore[misc]
    def _kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, scale, max_blocks,
        H: tl.constexpr, HKV: tl.constexpr, BS: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // (H // HKV)
        length = tl.load(lens_ptr + b)
        d = tl.arange(0, D)
        t = tl.arange(0, BS)
        q = tl.load(q_ptr + (b * H + h) * D + d).to(tl.float32)
        m = tl.full((), -1e30, tl.float32)
        l_sum = tl.zeros((), tl.float32)
        acc = tl.zeros((D,), tl.float32)
        for j in range(0, tl.cdiv(length, BS)):
            block = tl.load(bt_ptr + b * max_blocks + j)
            base = (block * HKV + kvh) * BS * D
            valid = j * BS + t < length
            offs = base + t[:, None] * D + d[None, :]
            k = tl.load(k_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            s = tl.where(valid, s, -1e30)
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            p = tl.where(valid, p, 0.0)
            correction = tl.exp(m - m_new)
            l_sum = l_sum * correction + tl.sum(p, axis=0)
            acc = acc * correction + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        tl.store(out_ptr + (b * H + h) * D + d, acc / l_sum)

    def paged_decode(
        q: torch.Tensor,  # [B, H, D]
        k_cache: torch.Tensor,  # [NB, Hkv, BS, D]
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [B, MB]
        context_lens: torch.Tensor,  # [B]
        scale: float,
    ) -> torch.Tensor:
        b, h, d = q.shape
        hkv, bs = k_cache.shape[1], k_cache.shape[2]
        out = torch.empty(b, h, d, dtype=torch.float32, device=q.device)
        _kernel[(b, h)](
            q.contiguous(), k_cache, v_cache, block_tables.contiguous(),
            context_lens.contiguous(), out, scale, block_tables.shape[1],
            H=h, HKV=hkv, BS=bs, D=d,
        )  # fmt: skip
        return out.to(q.dtype)

    try:
        if not _agrees(paged_decode):
            log.warning("triton decode attention disagrees with the torch path; not used")
            return None
    except Exception:
        log.warning("triton decode attention failed its check; not used", exc_info=True)
        return None
    log.info("decode attention: triton")
    return paged_decode


def _agrees(kernel: PagedDecode) -> bool:
    """The kernel against a plain gather-and-softmax on random paged data (on the GPU)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    h, hkv, d, bs, nb = 9, 3, 64, 16, 40
    lens = torch.tensor([1, 17, 100, 5 * bs], device="cuda")
    mb = int((lens.max() + bs - 1) // bs)
    tables = torch.randperm(nb, device="cuda", generator=gen)[: len(lens) * mb].view(len(lens), mb)
    k = torch.randn(nb, hkv, bs, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    v = torch.randn(nb, hkv, bs, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    q = torch.randn(len(lens), h, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    got = kernel(q, k, v, tables, lens, d**-0.5).float()
    for i, n in enumerate(lens.tolist()):
        kk = k[tables[i]].transpose(0, 1).reshape(hkv, -1, d)[:, :n].float()
        vv = v[tables[i]].transpose(0, 1).reshape(hkv, -1, d)[:, :n].float()
        qq = q[i].float().view(hkv, h // hkv, d)
        w = torch.softmax(qq @ kk.transpose(-1, -2) * d**-0.5, dim=-1)
        want = (w @ vv).reshape(h, d)
        if not torch.allclose(got[i], want, atol=2e-2, rtol=2e-2):
            return False
    return True


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket(n: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int | None:
    return next((b for b in buckets if b >= n), None)


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class DecodeGraphs:
    """Decode steps as CUDA graphs, keyed by (batch bucket, block-table width bucket).

    A graph replays the captured launches on static buffers: the step's ids, positions, cache
    rows, block tables and bias are copied into them, padded (padding rows write into the
    spare block `scratch_block` and attend only to it). The first replay of each graph is
    compared with the eager step; a disagreement turns graphs off for good."""

    def __init__(self, forward: Callable[..., torch.Tensor], scratch_block: int, block_size: int):
        self.forward = forward
        self.scratch = scratch_block
        self.bs = block_size
        self.enabled = True
        self.pool: Any = None
        self.graphs: dict[tuple[int, int], tuple[Any, dict[str, torch.Tensor], Any]] = {}
        self.checked: set[tuple[int, int]] = set()

    def run(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        kv_caches: torch.Tensor,
        meta: Any,
        hkv: int,
        eager: Callable[[], torch.Tensor],
    ) -> torch.Tensor | None:
        """The step's hidden states through a graph, or None (not graphable: run eager)."""
        b = ids.shape[0]
        tables = meta.decode_block_tables
        bb = bucket(b)
        if not self.enabled or bb is None or tables is None or meta.prefills:
            return None
        key = (bb, pow2_at_least(tables.shape[1]))
        try:
            entry = self.graphs.get(key)
            if entry is None:
                entry = self._capture(key, kv_caches, meta, hkv)
                self.graphs[key] = entry
            graph, static, out = entry
            self._fill(static, ids, pos, meta, hkv, b)
            graph.replay()
            hidden = out[:b]
            if key not in self.checked:
                self.checked.add(key)
                want = eager()
                if not torch.allclose(hidden.float(), want.float(), atol=5e-2, rtol=5e-2):
                    log.warning("CUDA graph of decode step %s disagrees with eager; off", key)
                    self.enabled = False
                    return want
            return hidden.clone()
        except Exception:
            log.warning("CUDA graphs failed; decode steps run eagerly", exc_info=True)
            self.enabled = False
            return None

    def _capture(self, key: tuple[int, int], kv_caches: torch.Tensor, meta: Any, hkv: int) -> Any:
        from dataclasses import replace

        bb, mb = key
        dev = kv_caches.device
        static = {
            "ids": torch.zeros(bb, dtype=torch.long, device=dev),
            "pos": torch.zeros(bb, dtype=torch.long, device=dev),
            "kv_rows": torch.zeros(bb * hkv, dtype=torch.long, device=dev),
            "tables": torch.full((bb, mb), self.scratch, dtype=torch.long, device=dev),
            "lens": torch.ones(bb, dtype=torch.long, device=dev),
            "bias": torch.full(
                (bb, 1, 1, mb * self.bs), float("-inf"), dtype=kv_caches.dtype, device=dev
            ),
        }
        static["bias"][..., 0] = 0
        self._scratch_rows(static, 0, bb, hkv)
        graph_meta = replace(
            meta,
            kv_rows=static["kv_rows"],
            decode_block_tables=static["tables"],
            decode_bias=static["bias"] if meta.decode_bias is not None else None,
            decode_context_lens=static["lens"],
            num_decodes=bb,
        )

        def step() -> torch.Tensor:
            return self.forward(static["ids"], static["pos"], kv_caches, graph_meta)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()
        log.info("captured the decode step for batch %d, %d blocks", bb, mb)
        return graph, static, out

    def _scratch_rows(
        self, static: dict[str, torch.Tensor], start: int, end: int, hkv: int
    ) -> None:
        heads = torch.arange(hkv, device=static["kv_rows"].device)
        rows = (self.scratch * hkv + heads) * self.bs  # slot 0 of the scratch block, per head
        static["kv_rows"].view(-1, hkv)[start:end] = rows

    def _fill(
        self, static: dict[str, torch.Tensor], ids: torch.Tensor, pos: torch.Tensor, meta: Any,
        hkv: int, b: int,
    ) -> None:  # fmt: skip
        bb, mb = static["tables"].shape
        static["ids"][:b] = ids
        static["ids"][b:] = 0
        static["pos"][:b] = pos
        static["pos"][b:] = 0
        static["kv_rows"][: b * hkv] = meta.kv_rows
        self._scratch_rows(static, b, bb, hkv)
        tables = meta.decode_block_tables
        static["tables"].fill_(self.scratch)
        static["tables"][:b, : tables.shape[1]] = tables
        static["lens"][:b] = meta.decode_context_lens
        static["lens"][b:] = 1
        if meta.decode_bias is not None:
            static["bias"].fill_(float("-inf"))
            static["bias"][b:, ..., 0] = 0
            static["bias"][:b, ..., : meta.decode_bias.shape[-1]] = meta.decode_bias
