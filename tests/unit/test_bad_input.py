"""Bad input fails before it enters the engine, with a message that says what to change."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tachyon import LLM, SamplingParams


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(temperature=-0.1), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(n=0), "n="), (dict(max_tokens=0), "max_tokens"),
    (dict(min_p=2.0), "min_p"), (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(logprobs=-1), "logprobs"),
    (dict(stop=[""]), "stop"),
    # types and sizes the sampler's tensors cannot hold: refused here, not raised inside a step
    (dict(top_k=2**63), "top_k"), (dict(seed=2**64), "seed"), (dict(seed=-(2**63) - 1), "seed"),
    (dict(temperature=float("inf")), "temperature"), (dict(top_p=float("nan")), "top_p"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"), (dict(temperature=True), "temperature"),
    (dict(n=True), "n"), (dict(max_tokens=2.5), "max_tokens"), (dict(min_tokens=-1), "min_tokens"),
    (dict(ignore_eos="yes"), "ignore_eos"), (dict(stop=[1]), "stop"), (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(stop_token_ids="5"), "stop_token_ids"), (dict(stop=["x"] * 129), "stop"),
    (dict(stop_token_ids=list(range(1025))), "stop_token_ids"),
])
def test_out_of_range_sampling_values(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        SamplingParams(**kwargs)
    assert e.value.param == match.rstrip("=")


@pytest.mark.parametrize("kwargs, param, match", [
    (dict(stop_token_ids=[10**9], min_tokens=2), "stop_token_ids", "outside the vocabulary"),
    (dict(stop_token_ids=[-5]), "stop_token_ids", "outside the vocabulary"),
    (dict(n=129), "n", "--max-n"),
    (dict(logprobs=21), "logprobs", "--max-logprobs"),
    (dict(max_tokens=10**6), "max_tokens", "exceeds the model's context"),
])
def test_engine_limits(llm, kwargs, param, match):
    with pytest.raises(ValueError, match=match) as e:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, **kwargs) if "max_tokens" not in kwargs
                     else SamplingParams(**kwargs))
    assert e.value.param == param
    assert not llm.engine.has_unfinished_requests()


def test_prompt_ids_must_be_plain_ints(llm):
    with pytest.raises(ValueError, match="outside the vocabulary") as e:
        llm.engine.add_request("b", None, [1, True, 3], SamplingParams(max_tokens=1))
    assert e.value.param == "prompt"


def test_bad_requests_leave_running_ones_alone(llm):
    engine = llm.engine
    engine.add_request("keep", None, [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.step()
    max_len = engine.config.scheduler.max_model_len
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", SamplingParams())
    with pytest.raises(ValueError, match="exceeds the model's context"):
        llm.engine.add_request("long", None, [5] * 10, SamplingParams(max_tokens=max_len))
    with pytest.raises(ValueError, match="shorten the prompt"):
        llm.engine.add_request("toolong", None, [5] * max_len, SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.engine.add_request("vocab", None, [10 ** 9], SamplingParams(max_tokens=1))
    with pytest.raises(TypeError, match="prompt is a string"):
        llm.generate([3.5], SamplingParams())
    done = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done = o
    assert done.request_id == "keep" and len(done.outputs[0].token_ids) == 6
    engine.check_integrity()


def test_abort_returns_blocks(llm):
    engine = llm.engine
    engine.add_request("ab", None, list(range(50, 90)), SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.kv.num_free_blocks < engine.kv.num_blocks
    engine.abort_request("ab")
    outs = engine.step()
    assert outs and outs[0].outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_unknown_model_path():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(model="/nonexistent/model")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        LLM(model=str(tmp_path))


def test_malformed_safetensors(tmp_path):
    from tests.conftest import make_tiny_checkpoint

    make_tiny_checkpoint("llama", str(tmp_path))
    shard = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))[0]
    (tmp_path / shard).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        LLM(model=str(tmp_path))


def test_malformed_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        LLM(model=str(bad))


def test_unknown_engine_argument():
    with pytest.raises(TypeError, match="unknown arguments"):
        LLM(modle="x")


def _mostly(valid, *invalid):
    """Valid values nine times in ten, so most examples get past validation and run."""
    return st.one_of(*[valid] * 9, st.sampled_from(invalid))


_FIELDS = {
    "n": _mostly(st.integers(1, 2), 0, 129, 2**63), "temperature": _mostly(st.floats(0, 2), -1.0, float("inf")),
    "top_p": _mostly(st.floats(0.01, 1), 0.0, 1.5, float("nan")),
    "top_k": _mostly(st.integers(-1, 60_000), 2**63, 10**30, -5), "min_p": _mostly(st.floats(0, 1), 2.0),
    "repetition_penalty": _mostly(st.floats(0.5, 2), 0.0, float("inf")),
    "presence_penalty": _mostly(st.floats(-2, 2), 3.0), "frequency_penalty": _mostly(st.floats(-2, 2), float("nan")),
    "seed": _mostly(st.integers(-(2**63), 2**63 - 1), 2**63, 2**64),
    "stop": _mostly(st.lists(st.text(min_size=1, max_size=3), max_size=3), [""], 5),
    "stop_token_ids": st.lists(st.integers(0, 49_151) | st.sampled_from([49_152, 2**31, 2**63, -1]), max_size=3),
    "min_tokens": _mostly(st.integers(0, 3), -1, 4), "logprobs": _mostly(st.integers(0, 20), 21, -1),
    "ignore_eos": st.booleans(), "skip_special_tokens": st.booleans(), "include_stop_str_in_output": st.booleans(),
}


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(kwargs=st.fixed_dictionaries({}, optional=_FIELDS),
       prompt=st.lists(st.integers(0, 49_151), min_size=1, max_size=8))
def test_whatever_passes_validation_runs_without_error(llm, kwargs, prompt):
    """The first wall is whole: parameters are refused with their field named, or the request runs to a normal
    finish (never finish_reason "error", which would mean the second wall had to catch it)."""
    try:
        sp = SamplingParams(max_tokens=3, **kwargs)
        llm.engine.validate(prompt, sp)
    except ValueError as e:
        assert e.param, e
        return
    out = llm.generate([prompt], sp)[0]
    assert out.error is None and all(c.finish_reason in ("stop", "length") for c in out.outputs), out
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
