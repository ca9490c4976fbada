"""The w8a8 weight format: the integer kernel computes what its definition says, a row's
result does not depend on the rows it shares a call with, smoothing keeps the product and
earns its place, and the fused decode step is the model's own layers."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rag.engine.quant import apply_weight_format, fused_decode  # noqa: E402
from rag.engine.w8a8 import (  # noqa: E402
    A8Linear,
    a8_reference,
    channel_maxima,
    smoothing,
)

from .conftest import greedy_paged as greedy  # noqa: E402
from .test_quant import PROMPTS, require_kernels, tiny  # noqa: E402


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def layer(n: int, k: int, bias: bool, seed: int = 0, kernels=None) -> A8Linear:  # type: ignore[no-untyped-def]
    w = torch.randn(n, k, generator=gen(seed)) * 0.05
    b = torch.randn(n, generator=gen(seed + 1)) if bias else None
    amax = torch.rand(k, generator=gen(seed + 2)) * 4 + 0.1
    return A8Linear(w, b, amax, kernels)


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
@pytest.mark.parametrize(("n", "bias"), [(48, False), (96, True), (40, True)])
def test_i8_linear_computes_its_definition(rows, n, bias):
    """The kernel gives the reference's integer sums times the two scales, to float32 rounding,
    for tiles of 6 rows and the rows left over; 40 outputs are padded to 48."""
    kernels = require_kernels()
    lin = layer(n, 64, bias, kernels=kernels)
    x = torch.randn(rows, 64, generator=gen(9)) * 3
    got = lin(x)
    want = a8_reference(x, lin.weights(), lin.ws, lin.smooth, lin.bias)[:, :n]
    assert got.shape == (rows, n)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """Bit for bit: a row alone, among 16 and among 40 gives the same floats, so a prompt
    computes alike however it is cut and a decode in any batch."""
    kernels = require_kernels()
    lin = layer(96, 64, True, kernels=kernels)
    x = torch.randn(40, 64, generator=gen(4))
    together = lin(x)
    assert torch.equal(lin(x[:16].contiguous()), together[:16])
    assert torch.equal(torch.cat([lin(x[i : i + 1]) for i in range(40)]), together)


def test_smoothing_keeps_the_product_and_earns_its_place():
    """(x / s) (W s)^T is x W^T; with a few large input channels (what a language model's
    activations carry), quantizing after smoothing loses far less than before."""
    w = torch.randn(32, 64, generator=gen(1)) * 0.05
    x = torch.randn(200, 64, generator=gen(2))
    x[:, [3, 40]] *= 60  # outlier channels
    s = smoothing(x.abs().amax(0), w)
    exact = x.double() @ w.double().t()
    torch.testing.assert_close((x.double() / s.double()) @ (w.double() * s.double()).t(), exact)
    smoothed = A8Linear(w, None, x.abs().amax(0), None)
    plain = A8Linear(w, None, None, None)
    assert torch.equal(plain.smooth, torch.ones(64))
    err_smoothed = (smoothed(x).double() - exact).abs().mean()
    err_plain = (plain(x).double() - exact).abs().mean()
    assert err_smoothed < 0.5 * err_plain


def test_channel_maxima_are_the_largest_inputs_each_linear_saw():
    model = tiny()
    seqs = [[5, 9, 17, 3, 4], list(range(20, 40))]
    maxima = channel_maxima(model, seqs)
    assert len(maxima) == 4 * len(model.layers) and maxima["layers.0.gate_up_proj"].shape == (64,)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        model.layers[1].mlp.down_proj.register_forward_pre_hook(
            lambda _m, a: seen.__setitem__("x", torch.cat([seen.get("x", a[0][:0]), a[0]]))
        )
    ]
    from rag.engine.w8a8 import prefill_alone

    for s in seqs:
        prefill_alone(model, s)
    hooks[0].remove()
    assert torch.equal(maxima["layers.1.down_proj"], seen["x"].abs().amax(0))


@pytest.mark.parametrize("bias", [False, True], ids=["llama", "qwen2-bias"])
@pytest.mark.parametrize("kv", [None, torch.bfloat16], ids=["kv-float32", "kv-bfloat16"])
def test_w8a8_decode_through_the_fused_step_is_decode_through_the_layers(bias, kv):
    kernels = require_kernels()
    layered, fused = tiny(bias), tiny(bias)
    calibration = [list(range(3, 40))]
    for model in (layered, fused):
        apply_weight_format(model, "w8a8", torch.float32, kernels, calibration=calibration)
    step = fused_decode(fused, kernels)
    assert step is not None and step.bits == 0
    fused.fuse_decode(step)
    prompts = [*PROMPTS, *([[3 + i, 9, 17 + i, 3] for i in range(5)])]
    expected = greedy(layered, prompts, 12, kernel=True, kv_dtype=kv, max_seqs=8)
    assert greedy(fused, prompts, 12, kernel=True, kv_dtype=kv, max_seqs=8) == expected


def test_w8a8_without_kernels_computes_the_same_in_torch():
    """No compiler: the torch reference computes the format (same tokens as the kernels)."""
    kernels = require_kernels()
    compiled, plain = tiny(), tiny()
    apply_weight_format(compiled, "w8a8", torch.float32, kernels, calibration=[[1, 2, 3, 4]])
    apply_weight_format(plain, "w8a8", torch.float32, None, calibration=[[1, 2, 3, 4]])
    assert fused_decode(plain, None) is None
    assert greedy(plain, PROMPTS, 8, kernel=False) == greedy(compiled, PROMPTS, 8, kernel=False)


def test_w8a8_is_for_the_cpu():
    with pytest.raises(ValueError, match="CPU"):
        apply_weight_format(tiny(), "w8a8", torch.float32, None, torch.device("cuda"))


def test_a_linear_whose_inputs_do_not_come_in_fours_is_refused():
    """The kernel reads inputs 4 bytes at a time: K = 62 is refused at load, not misread."""
    with pytest.raises(ValueError, match="divisible by 4"):
        A8Linear(torch.randn(16, 62), None, None, None)


def test_w8a8_greedy_with_drafts_is_greedy_without():
    """Drafts are verified through the same integer matmuls as single decodes."""
    from rag.engine.spec import SpecConfig

    from .conftest import generate_drafting

    kernels = require_kernels()
    prompts = [[5, 9, 17, 3] * 4, list(range(20, 40)) * 2, [7, 8] * 6]

    def generate(spec):  # type: ignore[no-untyped-def]
        model = tiny()
        apply_weight_format(model, "w8a8", torch.float32, kernels, calibration=[prompts[1]])
        model.fuse_decode(fused_decode(model, kernels))
        return generate_drafting(model, prompts, spec, attention_kernel=True)

    plain, _ = generate(None)
    drafted, verified = generate(SpecConfig(k_max=4))
    assert drafted == plain and verified > 0


@pytest.mark.slow
def test_w8a8_on_the_real_model_stays_close_to_float32(smollm):
    """SmolLM2 in w8a8, calibrated on the shipped text, against float32 on texts of its own:
    the next-token choice agrees at nine positions in ten and perplexity moves by a few percent
    (bench/engine_accuracy.py measures it on held-out passages)."""
    from rag.engine import EngineAdvanced, EngineSettings, build_engine
    from rag.engine.w8a8 import prefill_alone

    require_kernels()
    text = (
        "The lighthouse keeper climbed the one hundred and twelve steps every evening at dusk. "
        "He trimmed the wick, polished the great lens and wrote the weather in the log: wind "
        "from the south-west, a falling glass, rain before midnight. Ships passing the point "
        "kept two miles off the reef, as the chart warned, and the light turned once every "
        "twenty seconds until dawn.\n\n"
        "To reset a forgotten password, open the sign-in page and choose 'Forgot password'. "
        "Enter the e-mail address of your account; a link valid for thirty minutes arrives "
        "within a few minutes. If it does not, check the spam folder, then ask your "
        "administrator, who can send a new link from the users page.\n\n"
        "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. It takes "
        "place in the chloroplasts of plant cells, where chlorophyll absorbs mostly red and "
        "blue light and reflects green, which is why leaves look green to us. In autumn the "
        "chlorophyll breaks down and the yellow and orange pigments show through.\n\n"
        "The committee met on Tuesday to review the budget. Travel costs rose by twelve per "
        "cent over the year, mostly because of two conferences abroad, while printing fell by "
        "half once the newsletter moved online. The chair proposed a cap on travel for the "
        "next quarter, and the motion passed by five votes to two."
    )
    ids = smollm.tokenizer.encode_prompt(text)
    w8a8 = build_engine(
        EngineSettings(
            device="cpu", advanced=EngineAdvanced(dtype="float32", weights="w8a8", num_kv_blocks=64)
        )
    )
    try:
        scores = {}
        for name, engine in (("float32", smollm), ("w8a8", w8a8)):
            model = engine.runner.model
            with torch.inference_mode():
                logits = model.compute_logits(prefill_alone(model, ids)[:-1])
            scores[name] = logits
    finally:
        w8a8.close()
    target = torch.tensor(ids[1:])
    agree = (scores["w8a8"].argmax(-1) == scores["float32"].argmax(-1)).float().mean().item()

    def ppl(logits: torch.Tensor) -> float:
        return torch.nn.functional.cross_entropy(logits, target).exp().item()

    # The bounds leave room for this short text and catch a broken format (wrong scales,
    # smoothing applied twice: agreement falls far below), not a percent: bench/engine_accuracy.py
    # measures that on held-out passages.
    assert agree >= 0.85
    assert abs(ppl(scores["w8a8"]) / ppl(scores["float32"]) - 1) < 0.05


def test_auto_takes_w8a8_wherever_its_kernel_has_a_vector_path():
    """VNNI or AVX2: w8a8; a build with neither (plain loops): int4; no kernels or CUDA:
    bfloat16. An explicit format is kept as asked."""
    from types import SimpleNamespace

    from rag.engine.build import resolve_weights

    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def built(vnni: bool, simd: bool) -> SimpleNamespace:
        return SimpleNamespace(i8_fast=lambda: vnni, i8_simd=lambda: simd)

    assert resolve_weights("auto", cpu, built(True, True)) == "w8a8"
    assert resolve_weights("auto", cpu, built(False, True)) == "w8a8"
    assert resolve_weights("auto", cpu, built(False, False)) == "int4"
    assert resolve_weights("auto", cpu, None) == "bfloat16"
    assert resolve_weights("auto", cuda, None) == "bfloat16"
    assert resolve_weights("int4", cpu, built(True, True)) == "int4"
    kernels = require_kernels()
    assert kernels.i8_simd() == (kernels.i8_fast() or torch.backends.cpu.get_cpu_capability()
                                 in ("AVX2", "AVX512"))  # fmt: skip


def test_the_kernel_lets_other_threads_run_while_it_computes():
    """A prefill's matmul must not hold the GIL: while long i8_linear calls run in a thread,
    Python in this one goes on. With the GIL held, this thread's longest pause would be a
    whole call; without it, it is the interpreter's switch interval, far shorter."""
    import sys
    import threading
    import time

    kernels = require_kernels()
    lin = layer(2048, 2048, False, kernels=kernels)
    # Rows enough that one call is long against the switch interval on this CPU.
    x = torch.randn(1024, 2048, generator=gen(5))
    while True:
        t0 = time.perf_counter()
        kernels.i8_linear(x, lin.packed, lin.wsum, lin.ws, lin.smooth, lin.bias)
        if time.perf_counter() - t0 > 40 * sys.getswitchinterval() or len(x) >= 65536:
            break
        x = torch.cat([x, x])
    calls: list[float] = []

    def call() -> None:
        for _ in range(3):
            t0 = time.perf_counter()
            kernels.i8_linear(x, lin.packed, lin.wsum, lin.ws, lin.smooth, lin.bias)
            calls.append(time.perf_counter() - t0)

    t = threading.Thread(target=call)
    longest, last = 0.0, time.perf_counter()
    t.start()
    while t.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    t.join()
    shortest_call = min(calls)
    assert shortest_call > 20 * sys.getswitchinterval()  # long enough to tell the two apart
    assert longest < shortest_call / 2
