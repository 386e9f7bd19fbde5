"""GrammarCompiler and GrammarMatcher against a tokenizer that cannot spell JSON (a word-level vocabulary of a few
words): a grammar no token can start is refused at compile, naming the tokenizer; a grammar that reaches a dead end
later says so when its sequence is updated, rather than blaming the sampled token."""

from __future__ import annotations

import os

import pytest

from tachyon.engine.structured_output import GrammarCompiler
from tachyon.engine.tokenizer import load_tokenizer
from tachyon.sampling_params import InvalidRequestError, StructuredOutputsParams
from tests.tiny_checkpoint import write_wordlevel_tokenizer

pytest.importorskip("xgrammar")

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks",
                      "models")
WORDS = ["a", "x", "hello"]  # ids 3, 4, 5
A, X = 3, 4


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    path = tmp_path_factory.mktemp("wordlevel")
    write_wordlevel_tokenizer(path, WORDS)
    return GrammarCompiler(load_tokenizer(str(path)), vocab_size=40, eos_token_ids=[2])


@pytest.mark.parametrize("spec,what", [
    ({"json_object": True}, "JSON object grammar"),
    ({"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}, "JSON schema"),
    ({"choice": ["b", "c"]}, "choice list"),
    ({"regex": "[0-9]+"}, "regex")])
def test_a_grammar_no_token_can_start_is_refused_at_compile(grammars, spec, what):
    with pytest.raises(InvalidRequestError) as e:
        grammars.compile(StructuredOutputsParams(**spec))
    assert str(e.value) == (f"the {what} cannot be produced with this model's tokenizer: no token of its vocabulary "
                            f"can start it")
    assert e.value.param == "structured_outputs"


def test_a_dead_end_later_is_named_as_such(grammars):
    compiled = grammars.compile(StructuredOutputsParams(regex="ab"))  # "a" starts it; no token spells the "b"
    assert grammars.compile(StructuredOutputsParams(regex="ab")) is compiled  # cached, checked once
    m = grammars.matcher(compiled)
    with pytest.raises(RuntimeError, match=f"^token {X} does not follow the grammar"):
        m.accept(X)  # "a" was allowed: the sampler's mask should have kept x out
    m.accept(A)
    assert not m.allows_any_token()
    with pytest.raises(RuntimeError, match="^the grammar allows no token here: no token of this model's vocabulary "
                                           "can continue the output"):
        m.accept(0)  # what argmax picks from a row the mask set all to -inf
    assert grammars.compile(StructuredOutputsParams(choice=["a", "xa"])) is not None  # spellable: compiles


def test_the_gpu_benchmark_models_and_the_benchmark_schema():
    """benchmarks/structured_overhead.py's schema on the GPU: llama3-8b-structured (Llama-3-8B's body, SmolLM2's
    BPE tokenizer) spells it; llama3-8b-serve's synthetic word vocabulary is refused at compile."""
    from benchmarks.structured_overhead import SCHEMA
    from tachyon.config import ModelConfig

    spec = StructuredOutputsParams(json=SCHEMA)
    structured = os.path.join(MODELS, "llama3-8b-structured")
    cfg, tok = ModelConfig.from_file(structured), load_tokenizer(structured)
    assert (cfg.vocab_size, len(tok), cfg.eos_token_ids, tok.convert_ids_to_tokens(2)) == (49152, 49152, [2],
                                                                                           "<|im_end|>")
    grammars = GrammarCompiler(tok, cfg.vocab_size, cfg.eos_token_ids)
    m = grammars.matcher(grammars.compile(spec))
    for token in tok.encode('[{"name": "', add_special_tokens=False):
        m.accept(token)
    assert m.allows_any_token()
    serve = os.path.join(MODELS, "llama3-8b-serve")
    grammars = GrammarCompiler(load_tokenizer(serve), ModelConfig.from_file(serve).vocab_size, [128009])
    with pytest.raises(InvalidRequestError, match="^the JSON schema cannot be produced with this model's tokenizer"):
        grammars.compile(spec)
