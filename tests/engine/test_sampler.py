import pytest

torch = pytest.importorskip("torch")

from rag.engine.sampler import Sampler  # noqa: E402
from rag.engine.sequence import InvalidRequest, SamplingParams  # noqa: E402


def test_greedy_is_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    out = Sampler(torch.device("cpu"))(logits, ["a", "b"], [SamplingParams()] * 2)
    assert out == [1, 0]


def test_top_k_keeps_only_k_tokens():
    probs = Sampler.probs(
        torch.tensor([1.0, 4.0, 3.0, 2.0]), SamplingParams(temperature=1.0, top_k=2)
    )
    assert (probs > 0).tolist() == [False, True, True, False]


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = Sampler.probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs > 0).tolist() == [True, True, False, False]
    probs = Sampler.probs(logits, SamplingParams(temperature=1.0, top_p=0.1))
    assert (probs > 0).tolist() == [True, False, False, False]


def test_seed_makes_sampling_reproducible_per_request():
    logits = torch.randn(1, 1000)
    p = SamplingParams(temperature=1.0, seed=1234)
    draws = []
    for _ in range(2):
        s = Sampler(torch.device("cpu"))
        draws.append([s(logits, ["r"], [p])[0] for _ in range(5)])
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1  # the generator advances between steps


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=0),
        SamplingParams(max_tokens=-3),
        SamplingParams(max_tokens=5000),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
        SamplingParams(temperature=-0.1),
        SamplingParams(temperature=float("nan")),
        SamplingParams(top_k=-1),
        SamplingParams(stop=("",)),
    ],
)
def test_bad_params_are_refused(params):
    with pytest.raises(InvalidRequest):
        params.validate(max_model_len=2048)
    assert issubclass(InvalidRequest, ValueError)
