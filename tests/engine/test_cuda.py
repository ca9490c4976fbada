"""The CUDA paths (Triton decode attention, CUDA graphs) against the eager torch path; these
run only where there is a GPU (marker `gpu`). bench/gpu_check.sh checks the whole engine."""

import asyncio

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_triton_decode_attention_matches_the_torch_path():
    from rag.engine.cuda import _agrees, triton_paged_decode

    kernel = triton_paged_decode()
    if kernel is None:
        pytest.skip("triton is not installed")
    assert _agrees(kernel)


def test_decode_through_cuda_graphs_is_decode_without():
    from rag.engine.build import engine_for_model
    from rag.engine.config import EngineAdvanced, EngineSettings
    from rag.engine.sequence import SamplingParams
    from tests.engine.test_quant import tiny

    from .conftest import CharTokenizer

    def run(graphs: bool) -> list[list[int]]:
        settings = EngineSettings(
            device="cuda",
            max_model_len=200,
            advanced=EngineAdvanced(
                dtype="float32",
                weights="float32",
                cuda_graphs=graphs,
                speculative=False,
                num_kv_blocks=64,
            ),
        )
        eng = engine_for_model(tiny(), CharTokenizer(), (), settings)

        async def one(p: str) -> list[int]:
            ids: list[int] = []
            async for ev in eng.submit(p, SamplingParams(max_tokens=12, ignore_eos=True)):
                ids += ev.token_ids
            return ids

        async def all_of() -> list[list[int]]:
            return list(await asyncio.gather(*[one(p) for p in ("abc", "hello there", "zz")]))

        try:
            out = asyncio.run(all_of())
            if graphs:
                assert eng.runner.graphs is not None and eng.runner.graphs.enabled
            return out
        finally:
            eng.close()

    assert run(graphs=True) == run(graphs=False)
