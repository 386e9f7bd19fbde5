"""Structured outputs: grammars compiled by xgrammar (an optional dependency, imported when first used), cached
by their spec, and one matcher per constrained sequence.

    front end                                          engine core
    ─────────                                          ───────────
    StructuredOutputsParams ─► GrammarCompiler.compile  EngineCore: compile_async(spec) in a thread; the request
    (in a worker thread: a schema that does not           waits beside the scheduler until its grammar is ready,
    compile is a 400 naming xgrammar's complaint)         then each of its sequences gets a GrammarMatcher
                                                        sampler: matcher.fill_bitmask ─► mask on the device
                                                        scheduler.update: matcher.accept(token)

What crosses to the core is the spec (a few strings), not the compiled grammar: xgrammar's compiled grammars
do not pickle, and deserializing one costs as much as compiling it (~7 ms for a small schema with SmolLM2's
49k vocabulary). In one process (LLMEngine) the front end and the core share one compiler, so the core's compile
is a cache hit; `tachyon serve` compiles once more in the core process, in a thread, and then from its cache.
Either way no step waits for a compile: only the request that needs the grammar waits.

The bitmask is xgrammar's: int32 words, bit j of word w allows token 32 * w + j. The tokenizer info is built for
the model's vocabulary (the logits' width), with the engine's EOS ids as the grammar's stop tokens, so a
constrained sequence can end only where its grammar accepts. A spec whose grammar no token of the vocabulary can
start (JSON with a tokenizer of words that has no `{`) is refused at compile, once per spec: a 400. A grammar that
dead-ends later leaves its mask row all zero; the token then sampled fails `accept`, which says which case it is.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from tachyon.sampling_params import InvalidRequestError, StructuredOutputsParams


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise InvalidRequestError("structured outputs need xgrammar, which this server lacks: "
                                  "pip install xgrammar (or tachyon[serve])", "structured_outputs") from None
    return xgrammar


# what each kind of StructuredOutputsParams.key() is called in an error message
_SPEC_NAMES = {"json": "JSON schema", "json_object": "JSON object grammar", "regex": "regex", "choice": "choice list",
               "grammar": "EBNF grammar"}


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly these strings (JSON string literals are EBNF ones too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles StructuredOutputsParams into xgrammar grammars for one model's tokenizer; thread-safe.

    Give the tokenizer, or `load_tokenizer` (the core process loads it only when the first constrained
    request arrives). Compiled grammars are kept in an LRU of `cache_size` specs."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids, cache_size: int = 256, load_tokenizer=None):
        self._tokenizer = tokenizer
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._lock = threading.Lock()
        self._compiler = None
        self._pool: ThreadPoolExecutor | None = None

    def _xgr_compiler(self):
        with self._lock:
            if self._compiler is None:
                xgr = _xgrammar()
                tok = self._tokenizer if self._load_tokenizer is None else self._load_tokenizer()
                if tok is None:
                    raise InvalidRequestError("structured outputs need the model's tokenizer, and this model has "
                                              "none", "structured_outputs")
                info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.eos_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar (cached), or InvalidRequestError saying why xgrammar refused the spec."""
        key = spec.key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiler = self._xgr_compiler()
        kind, text = key
        try:
            if kind == "json":
                json.loads(text)  # a clear message for text that is not JSON at all
                compiled = compiler.compile_json_schema(text, any_whitespace=False)
            elif kind == "json_object":
                compiled = compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            elif kind == "regex":
                compiled = compiler.compile_regex(text)
            elif kind == "choice":
                compiled = compiler.compile_grammar(choice_ebnf(json.loads(text)))
            else:
                compiled = compiler.compile_grammar(text)
        except (RuntimeError, ValueError, TypeError) as e:
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise InvalidRequestError(f"the {_SPEC_NAMES[kind]} cannot be compiled: {_strip_location(why)}",
                                      "structured_outputs") from None
        if not self.matcher(compiled).allows_any_token():  # once per spec: a cached grammar passed it
            raise InvalidRequestError(f"the {_SPEC_NAMES[kind]} cannot be produced with this model's tokenizer: "
                                      f"no token of its vocabulary can start it", "structured_outputs")
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def compile_async(self, spec: StructuredOutputsParams) -> Future:
        """compile(spec) in the compiler's own thread; a cached spec's future is done at once."""
        with self._lock:
            hit = self._cache.get(spec.key())
        if hit is not None:
            f: Future = Future()
            f.set_result(hit)
            return f
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tachyon-grammar")
        return self._pool.submit(self.compile, spec)

    def matcher(self, compiled) -> GrammarMatcher:
        return GrammarMatcher(_xgrammar().GrammarMatcher(compiled), self.vocab_size)


_batch_matcher = None  # xgrammar's BatchGrammarMatcher (its threads), made at the first batch of grammars


class GrammarMatcher:
    """One sequence's position in its grammar: which tokens may come next, and the tokens it has taken."""

    __slots__ = ("_m", "vocab_size")

    def __init__(self, matcher, vocab_size: int):
        self._m = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed-token bits of the next token into row `row` of an int32 [rows, ceil(V/32)] tensor."""
        self._m.fill_next_token_bitmask(bitmask, row)

    def fill_bitmasks(self, grammars: list[GrammarMatcher], bitmask) -> None:
        """Row i of the bitmask for grammars[i] (this one among them): one call over xgrammar's thread pool, so
        a batch of 64 constrained sequences costs about what one does per core."""
        if len(grammars) == 1:
            return self.fill_bitmask(bitmask, 0)
        global _batch_matcher
        if _batch_matcher is None:
            _batch_matcher = _xgrammar().BatchGrammarMatcher()
        _batch_matcher.batch_fill_next_token_bitmask([g._m for g in grammars], bitmask)

    def allows_any_token(self) -> bool:
        """Whether some token (a stop token included) may come next: False at a dead end of the grammar, where
        the model's vocabulary cannot spell anything the grammar allows."""
        bitmask = _xgrammar().allocate_token_bitmask(1, self.vocab_size)
        self._m.fill_next_token_bitmask(bitmask, 0)
        return bool(bitmask.any())

    def accept(self, token: int) -> None:
        if not self._m.accept_token(token):  # the matcher is unchanged: ask it why, off the per-step path
            if not self.allows_any_token():
                raise RuntimeError("the grammar allows no token here: no token of this model's vocabulary can "
                                   "continue the output (its tokenizer cannot spell what the grammar needs next)")
            raise RuntimeError(f"token {token} does not follow the grammar (the sampler's mask allowed it)")

    @property
    def is_terminated(self) -> bool:
        return self._m.is_terminated()


def _strip_location(msg: str) -> str:
    """xgrammar's messages start with `[time] /path/file.cc:line: `: the reader needs the rest."""
    if msg.startswith("[") and ".cc:" in msg:
        return msg.split(": ", 1)[-1] if ": " in msg else msg
    return msg
