"""Structured outputs through the official `openai` client against the live server (embedded model): every
constrained answer parses and validates, whatever the seed; a schema xgrammar refuses is a 400; free requests
batched with constrained ones get the tokens they get alone. Offline: the same through SamplingParams, and a
constrained sequence runs one step ahead of its own tokens, its sampling deferred (num_scheduler_steps > 1)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests.integration.conftest import API_KEY

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "role": {"enum": ["admin", "user", "guest"]},
    "active": {"type": "boolean"}}, "required": ["name", "role", "active"], "additionalProperties": False}
NESTED = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99},
    "owner": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 6},
                                               "team": {"enum": ["red", "blue"]}},
              "required": ["first", "team"], "additionalProperties": False},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
    "required": ["id", "owner", "tags"], "additionalProperties": False}
LIST = {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"],
                                    "additionalProperties": False}, "minItems": 1, "maxItems": 2}
SCHEMAS = [PERSON, NESTED, LIST]


@pytest.fixture(scope="module")
def aclient(server):
    return lambda: openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _run(coro):
    return asyncio.run(coro)


def test_json_schema_outputs_parse_and_validate_for_every_seed(aclient):
    """Chat with response_format json_schema: greedy and sampled (several seeds, high temperature), together."""
    async def one(client, schema, seed):
        kw = {"temperature": 0} if seed is None else {"temperature": 1.2, "seed": seed}
        r = await client.chat.completions.create(
            model=None, messages=[{"role": "user", "content": "Make up a record as JSON."}], max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "rec", "schema": schema}}, **kw)
        return schema, r.choices[0]

    async def main():
        client = aclient()
        return await asyncio.gather(*(one(client, s, seed) for s in SCHEMAS for seed in (None, 1, 2)))

    for schema, choice in _run(main()):
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_choice_regex_and_grammar_on_both_endpoints(client):
    r = client.chat.completions.create(
        model=None, messages=[{"role": "user", "content": 'Give a JSON object with a key "a" set to 1.'}],
        max_tokens=40, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict) and r.choices[0].finish_reason == "stop"
    choices = ["Paris", "Rome", "Berlin"]
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        r = client.completions.create(model=None, prompt="The capital of France is", max_tokens=8, temperature=0.9,
                                      seed=5, extra_body=extra)
        assert r.choices[0].text in choices and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=None, prompt="A phone number:", max_tokens=16, temperature=1.0, seed=2,
                                  extra_body={"guided_regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text), r.choices[0].text
    r = client.completions.create(model=None, prompt="Answer yes or no:", max_tokens=8, temperature=0,
                                  extra_body={"structured_outputs": {"grammar": 'root ::= ("yes" | "no") "!"'}})
    assert r.choices[0].text in ("yes!", "no!")
    r = client.completions.create(model=None, prompt="JSON:", max_tokens=60, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "p", "schema": PERSON}}})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


def test_a_schema_xgrammar_refuses_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=None, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}})
    assert e.value.response.json() == {"error": {
        "message": 'response_format: the JSON schema cannot be compiled: Unsupported type "objectx"',
        "type": "BadRequestError", "param": "response_format", "code": 400}}


def test_free_requests_keep_their_tokens_beside_constrained_ones(server, aclient):
    prompts = ["The capital of Italy is", "def fib(n):", "Once upon a time", "1, 2, 3,"]

    async def free(client, p):
        r = await client.completions.create(model=None, prompt=p, max_tokens=12, temperature=0, logprobs=0,
                                            extra_body={"ignore_eos": True})
        return r.choices[0].logprobs.tokens

    async def constrained(client, i):
        r = await client.completions.create(model=None, prompt="Record:", max_tokens=60, temperature=0.8, seed=i,
                                            extra_body={"guided_json": SCHEMAS[i % len(SCHEMAS)]})
        return r.choices[0].text

    async def main(with_constrained: bool):
        client = aclient()
        others = [constrained(client, i) for i in range(4)] if with_constrained else []
        return await asyncio.gather(*(free(client, p) for p in prompts), *others)

    alone = _run(main(False))
    mixed = _run(main(True))
    assert mixed[:len(prompts)] == alone
    for i, text in enumerate(mixed[len(prompts):]):
        jsonschema.validate(json.loads(text), SCHEMAS[i % len(SCHEMAS)])
    kv = server.engine.kv
    assert kv.num_free_blocks == kv.num_blocks


def test_offline_structured_outputs_run_one_step_ahead_with_deferred_sampling():
    """LLM.generate with SamplingParams(structured_outputs=...) on an engine that queues steps ahead: a
    constrained sequence is scheduled behind its token still being sampled only with its step's sampling
    deferred (queued once that token has landed and its grammar took it) and one step ahead at most; the
    free one runs further ahead. Every output equals the engine's without any step ahead."""
    from tachyon import LLM, SamplingParams
    from tachyon.sampling_params import StructuredOutputsParams

    llm = LLM(kv_cache_memory_gib=0.1, swap_space=0, num_scheduler_steps=3)
    seen = []
    real = llm.engine.scheduler.schedule

    def spy(num_in_flight=0):
        out = real(num_in_flight)
        seen.append(out)
        for s in out.seqs:
            if s.seq.grammar is not None:
                assert out.max_in_flight <= 1
                assert out.defer_sampling or s.start < len(s.seq.token_ids)
        return out

    llm.engine.scheduler.schedule = spy
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate("Tell me a story:", free)[0].outputs[0].token_ids
    assert any(out.max_in_flight > 0 for out in seen)  # without a grammar it runs ahead
    params = [free, SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=NESTED)),
              SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=8,
                             structured_outputs=StructuredOutputsParams(choice=["alpha", "beta", "gamma"]))]
    outs = llm.generate(["Tell me a story:", "A record:", "Pick one:"], params)
    assert any(out.defer_sampling for out in seen)
    assert outs[0].outputs[0].token_ids == alone
    llm.engine.scheduler.config.num_scheduler_steps = 1  # the same requests, no step ever ahead
    again = llm.generate(["Tell me a story:", "A record:", "Pick one:"], params)
    assert [[c.token_ids for c in o.outputs] for o in again] == [[c.token_ids for c in o.outputs] for o in outs]
    llm.engine.scheduler.config.num_scheduler_steps = 3
    jsonschema.validate(json.loads(outs[1].outputs[0].text), NESTED)
    assert all(c.text in ("alpha", "beta", "gamma") and c.finish_reason == "stop" for c in outs[2].outputs)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    with pytest.raises(ValueError, match="the regex cannot be compiled"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="a(")))


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def wordlevel_llm(tmp_path_factory):
    """A tiny random Llama whose tokenizer has the words a, x, hello and nothing that spells JSON."""
    from tachyon import LLM
    from tests.tiny_checkpoint import write_wordlevel_tokenizer

    path = tmp_path_factory.mktemp("wordlevel_llama")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "bos_token_id": 1, "eos_token_id": 2}))
    write_wordlevel_tokenizer(path, ["a", "x", "hello"])
    return LLM(str(path), load_format="dummy", dtype="float32", swap_space=0, kv_cache_memory_gib=0.01)


def test_a_grammar_the_tokenizer_cannot_spell_is_a_400_and_a_dead_end_ends_its_request(wordlevel_llm):
    """JSON from a vocabulary of words: refused before it runs (LLM.generate and HTTP alike), naming the tokenizer.
    A regex whose first character it can spell and whose second it cannot: the request ends with an error that
    says the grammar allows no token there; the blocks all come back."""
    import httpx

    from tachyon import SamplingParams
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.sampling_params import StructuredOutputsParams
    from tachyon.server.app import create_app

    llm = wordlevel_llm
    refused = "the JSON object grammar cannot be produced with this model's tokenizer: no token of its vocabulary " \
              "can start it"
    with pytest.raises(ValueError, match=f"^{refused}$"):
        llm.generate("a", SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json_object=True)))

    async def post() -> httpx.Response:
        # no lifespan: the request is refused before it reaches the engine loop
        app = create_app(AsyncEngine(llm.engine), "tiny")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4,
                                                              "response_format": {"type": "json_object"}})

    r = _run(post())
    assert (r.status_code, r.json()) == (400, {"error": {"message": f"response_format: {refused}",
                                                         "type": "BadRequestError", "param": "response_format",
                                                         "code": 400}})
    out = llm.generate("hello", SamplingParams(temperature=0, max_tokens=4,
                                               structured_outputs=StructuredOutputsParams(regex="ab")))[0]
    assert out.outputs[0].finish_reason == "error"
    assert out.error == ("RuntimeError: the grammar allows no token here: no token of this model's vocabulary can "
                         "continue the output (its tokenizer cannot spell what the grammar needs next)")
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
