"""The server's batch tokenizer: the first prompt of a burst goes to the tokenizer at once, the rest of the burst (which
arrived while it ran) in one more call; each handler gets its own prompt's ids (the same as encoding it alone),
special-token settings are kept apart, failures and cancellations stay local."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from tachyon.server.batch_encode import BatchEncoder


@pytest.fixture(scope="module")
def tokenizer(embedded_dir):
    return AutoTokenizer.from_pretrained(embedded_dir)


TEXTS = [f"request {i}: " + "tokens " * i + "end" for i in range(16)]


def recording(tokenizer) -> tuple[BatchEncoder, list]:
    """An encoder whose tokenizer calls are listed (each call's texts)."""
    calls = []

    class Recording:
        def __call__(self, texts, add_special_tokens):
            calls.append(list(texts))
            return tokenizer(texts, add_special_tokens=add_special_tokens)

    return BatchEncoder(Recording()), calls


def test_the_first_prompt_goes_at_once_and_the_rest_of_a_burst_is_one_call(tokenizer):
    enc, calls = recording(tokenizer)

    async def burst():
        first = asyncio.ensure_future(enc.encode(TEXTS[0]))
        await asyncio.sleep(0)  # its handler has run: the first text is in the thread before the rest arrive
        assert enc.num_batches == 1
        return await asyncio.gather(first, *(enc.encode(t) for t in TEXTS[1:]))

    got = asyncio.run(burst())
    assert got == [tokenizer.encode(t) for t in TEXTS]
    assert calls == [TEXTS[:1], TEXTS[1:]] and enc.num_batches == 2


def test_special_token_settings_are_kept_apart(tokenizer):
    enc = BatchEncoder(tokenizer)
    flags = [i % 2 == 0 for i in range(len(TEXTS))]

    async def burst():
        return await asyncio.gather(*(enc.encode(t, f) for t, f in zip(TEXTS, flags, strict=True)))

    got = asyncio.run(burst())
    want = [tokenizer.encode(t, add_special_tokens=f) for t, f in zip(TEXTS, flags, strict=True)]
    assert got == want
    assert enc.num_batches == 2  # the first text alone, then the other 15 (one tokenizer call per setting)


def test_arrivals_during_a_batch_form_the_next_and_cancelled_waiters_are_skipped(tokenizer):
    enc, calls = recording(tokenizer)

    async def scenario():
        first = asyncio.ensure_future(enc.encode(TEXTS[0]))
        gone = asyncio.ensure_future(enc.encode(TEXTS[1]))
        await asyncio.sleep(0)
        gone.cancel()  # its client left before the batch ran
        late = [enc.encode(t) for t in TEXTS[2:5]]
        return await first, await asyncio.gather(*late)

    first, late = asyncio.run(scenario())
    assert first == tokenizer.encode(TEXTS[0])
    assert late == [tokenizer.encode(t) for t in TEXTS[2:5]]
    assert TEXTS[1] not in [t for batch in calls for t in batch]


def test_a_failing_tokenizer_fails_its_batch_and_the_encoder_recovers(tokenizer):
    class Flaky:
        broken = True

        def __call__(self, texts, add_special_tokens):
            if self.broken:
                raise RuntimeError("tokenizer exploded")
            return tokenizer(texts, add_special_tokens=add_special_tokens)

    flaky = Flaky()
    enc = BatchEncoder(flaky)

    async def burst():
        return await asyncio.gather(*(enc.encode(t) for t in TEXTS[:3]), return_exceptions=True)

    failed = asyncio.run(burst())
    assert [str(e) for e in failed] == ["tokenizer exploded"] * 3
    flaky.broken = False
    assert asyncio.run(burst()) == [tokenizer.encode(t) for t in TEXTS[:3]]


def test_an_encoder_whose_loop_ended_mid_batch_serves_the_next_loop(tokenizer):
    """A batch still in the thread when its event loop closed never reports back; the next loop's prompts must not
    wait for it (a server app driven by several asyncio.run calls, as tests do)."""
    import threading

    release = threading.Event()

    class Slow:
        def __call__(self, texts, add_special_tokens):
            release.wait(5)
            return tokenizer(texts, add_special_tokens=add_special_tokens)

    enc = BatchEncoder(Slow())
    first = asyncio.new_event_loop()
    task = first.create_task(enc.encode(TEXTS[0]))
    first.run_until_complete(asyncio.sleep(0.01))  # its batch is in the thread, held there
    task.cancel()
    first.run_until_complete(asyncio.sleep(0))
    first.close()  # (without waiting for the thread: its batch can no longer report to this loop)
    release.set()

    async def again():
        return await asyncio.wait_for(enc.encode(TEXTS[1]), 10)

    assert asyncio.run(again()) == tokenizer.encode(TEXTS[1])
