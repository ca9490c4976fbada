"""Front-end behaviour with a counting fake runner: streaming, stops, overload, cancel."""

import asyncio

import pytest

from rag.engine import EngineOverloaded, FinishReason, InvalidRequest, SamplingParams

from .conftest import make_fake_engine

pytestmark = pytest.mark.timeout(60)


async def collect(stream):
    events = [ev async for ev in stream]
    return "".join(e.text for e in events), events[-1]


async def wait_until(cond, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_streams_tokens_and_final_usage(fake_engine):
    async def main():
        text, last = await collect(fake_engine.submit("ab", SamplingParams(max_tokens=4)))
        assert text == "cdef"
        assert last.finish_reason is FinishReason.LENGTH
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 4)
        # The time to first token, split: waiting for admission, then the prefill itself.
        assert last.usage.queue_ms is not None and last.usage.queue_ms >= 0
        assert last.usage.prefill_ms is not None and last.usage.prefill_ms >= 0

    asyncio.run(main())


def test_a_request_submitted_from_a_thread_streams_on_the_given_loop(fake_engine):
    """Tokenizing a long prompt need not hold the event loop: submit in a worker thread,
    iterate on the loop."""

    async def main():
        loop = asyncio.get_running_loop()
        params = SamplingParams(max_tokens=3)
        stream = await asyncio.to_thread(fake_engine.submit, "ab", params, loop=loop)
        text, last = await collect(stream)
        assert text == "cde" and last.finish_reason is FinishReason.LENGTH

    asyncio.run(main())


def test_concurrent_requests_are_batched():
    # Steps take 10 ms, as a model's would: the later submits join the first one's steps
    # even when the engine thread runs ahead of the event loop (on a busy machine it ran all
    # six steps of an instant runner before the second submit).
    engine = make_fake_engine(step_delay_s=0.01)

    async def main():
        prompts = ["a", "hello", "xyz" * 5]
        outs = await asyncio.gather(
            *[collect(engine.submit(p, SamplingParams(max_tokens=6))) for p in prompts]
        )
        for p, (text, _) in zip(prompts, outs, strict=True):
            assert text == "".join(chr(ord(p[-1]) + i) for i in range(1, 7))
        assert any(len(s.chunks) > 1 for s in engine.runner.steps)

    try:
        asyncio.run(main())
    finally:
        engine.close()


def test_stop_string_truncates_and_finishes(fake_engine):
    async def main():
        text, last = await collect(
            fake_engine.submit("a", SamplingParams(max_tokens=20, stop=("ef",)))
        )
        assert text == "bcd" and last.finish_reason is FinishReason.STOP
        await wait_until(lambda: fake_engine.metrics().kv_blocks_used == 0)

    asyncio.run(main())


def test_bad_requests_are_refused_before_any_work(fake_engine):
    async def main():
        for params in (
            SamplingParams(max_tokens=0),
            SamplingParams(top_p=0),
            SamplingParams(temperature=-1),
            SamplingParams(max_tokens=1000),
        ):
            with pytest.raises(InvalidRequest):
                fake_engine.submit("hi", params)
        with pytest.raises(InvalidRequest):
            fake_engine.submit("x" * 200, SamplingParams(max_tokens=4))  # context is 128
        assert fake_engine.runner.steps == []

    asyncio.run(main())


def test_overload_refuses_and_nothing_gets_stuck():
    # Steps slow enough that nothing finishes while the 20 submissions are made (each request
    # needs 5 steps), so at most 1 running + 3 waiting are accepted.
    engine = make_fake_engine(max_waiting=3, max_num_seqs=1, step_delay_s=0.05)

    async def main():
        streams = []
        with pytest.raises(EngineOverloaded):
            for _ in range(20):
                streams.append(engine.submit("ab", SamplingParams(max_tokens=5)))
        assert 1 <= len(streams) <= 4
        results = await asyncio.gather(*[collect(s) for s in streams])
        assert all(text == "cdefg" for text, _ in results)
        m = engine.metrics()
        assert (m.running, m.waiting, m.kv_blocks_used) == (0, 0, 0)
        # Room again once the queue drained.
        text, _ = await collect(engine.submit("ab", SamplingParams(max_tokens=5)))
        assert text == "cdefg"

    try:
        asyncio.run(main())
    finally:
        engine.close()


def test_cancel_mid_stream_frees_every_block():
    engine = make_fake_engine(step_delay_s=0.01)

    async def main():
        stream = engine.submit("abc", SamplingParams(max_tokens=100))
        other = engine.submit("abc", SamplingParams(max_tokens=3))
        first = await stream.__anext__()
        assert first.text
        engine.cancel(stream.request_id)
        rest = [ev async for ev in stream]
        assert rest[-1].finish_reason is FinishReason.CANCELLED
        assert rest[-1].usage.completion_tokens < 100
        text, _ = await collect(other)  # the neighbour is unaffected
        assert text == "def"
        await wait_until(lambda: engine.metrics().kv_blocks_used == 0)
        assert engine.metrics().running == 0

    try:
        asyncio.run(main())
    finally:
        engine.close()


def test_closing_the_stream_cancels_the_request():
    engine = make_fake_engine(step_delay_s=0.01)

    async def main():
        stream = engine.submit("abc", SamplingParams(max_tokens=100))
        await stream.__anext__()
        await stream.aclose()
        await wait_until(lambda: engine.metrics().running == 0)
        assert engine.metrics().kv_blocks_used == 0

    try:
        asyncio.run(main())
    finally:
        engine.close()


def test_a_request_that_breaks_its_step_fails_alone():
    """An exception that one request brings into the step loop (a sampler that refuses its
    parameters, say) fails that request, with an error, and the others carry on: the step is
    run again one sequence at a time."""
    from rag.engine import EngineError

    engine = make_fake_engine()
    execute = engine.runner.execute

    def fussy(out):
        if any(c.params.top_k == 13 for c in out.chunks):
            raise RuntimeError("the sampler refuses this request")
        return execute(out)

    engine.runner.execute = fussy

    async def main():
        honest = asyncio.ensure_future(collect(engine.submit("ab", SamplingParams(max_tokens=6))))
        bad = engine.submit("xy", SamplingParams(max_tokens=6, top_k=13))
        with pytest.raises(EngineError):
            await collect(bad)
        text, last = await honest
        assert text == "cdefgh" and last.finish_reason is FinishReason.LENGTH
        assert last.usage.completion_tokens == 6

    try:
        asyncio.run(main())
    finally:
        engine.close()


def test_an_out_of_range_seed_is_refused_before_any_work(fake_engine):
    async def main():
        with pytest.raises(InvalidRequest, match="seed"):
            fake_engine.submit("ab", SamplingParams(max_tokens=4, temperature=0.7, seed=10**30))

    asyncio.run(main())
