"""SamplingParams: how one request samples and when it stops (vLLM's names, so users can switch)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 128  # each is searched for after every token: bounded work per step
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries of logit_bias, allowed_token_ids, bad words: bounded work per step
MAX_BAD_WORDS = 128


class InvalidRequestError(ValueError):
    """A request the engine refuses before it enters; `param` names the field to change."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _out_of_range(name: str, value, allowed: str):
    shown = repr(value) if len(repr(value)) < 80 else f"{type(value).__name__} of {len(value)}"
    raise InvalidRequestError(f"SamplingParams.{name}={shown} is out of range: {allowed}", name)


@dataclass
class StructuredOutputsParams:
    """Output constrained to a grammar (vLLM's names): exactly one of these. `json` is a JSON schema (a dict or
    its text), `regex` a regular expression the whole output matches, `choice` the strings the output may be,
    `grammar` an EBNF grammar (xgrammar's GBNF dialect: `root ::= ...`), `json_object` any JSON object."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(f"structured outputs take exactly one of json, regex, choice, grammar, "
                                      f"json_object; got {given or 'none'}", "structured_outputs")
        checks = {"json": lambda v: isinstance(v, (str, dict)), "regex": lambda v: isinstance(v, str),
                  "grammar": lambda v: isinstance(v, str), "json_object": lambda v: v is True,
                  "choice": lambda v: isinstance(v, (list, tuple)) and v and all(isinstance(c, str) for c in v)}
        if not checks[given[0]](getattr(self, given[0])):
            raise InvalidRequestError(f"structured_outputs.{given[0]} has the wrong type: json is a schema (object "
                                      f"or string), regex and grammar are strings, choice a non-empty list of "
                                      f"strings", "structured_outputs")

    def key(self) -> tuple[str, str]:
        """(kind, text): what a compiled grammar is cached by."""
        import json

        if self.json is not None:
            text = self.json if isinstance(self.json, str) else json.dumps(self.json)  # property order is output order
            return "json", text
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(list(self.choice))
        if self.grammar is not None:
            return "grammar", self.grammar
        return "json_object", ""


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None = up to the model's context
    min_tokens: int = 0
    logprobs: int | None = None  # top-N logprobs of each generated token (plus the sampled one)
    # top-N logprobs at each prompt position (plus the prompt token's own): the prefill computes logits at every
    # prompt position of such a request, and its prompt skips the prefix cache (so every position is computed)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    allowed_token_ids: list[int] | None = None  # sample only among these
    bad_words: list[str] | None = None  # words never generated (the front end tokenizes them)
    # bad_words as token-id sequences: set by the front end from its tokenizer (each word with and without a
    # leading space, as vLLM does); the sampler bans a word's last token when the output ends with the rest
    bad_words_token_ids: list[list[int]] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    stop_strings: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.top_k == 0 and not isinstance(self.top_k, bool):
            self.top_k = -1
        self.verify()

    def verify(self) -> None:
        """Check every field's type and range (InvalidRequestError naming the field), before the request
        reaches the engine: whatever passes here, the sampler's tensors and the stop checks can hold.
        Limits that depend on the engine (vocabulary, context, --max-n, --max-logprobs) are LLMEngine.validate's."""
        bad = _out_of_range

        def integer(name, lo, hi, allowed, none_ok=False):
            v = getattr(self, name)
            if v is None and none_ok:
                return
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
                bad(name, v, allowed)
            setattr(self, name, int(v))

        def real(name, ok, allowed):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not ok(v):
                bad(name, v, allowed)
            setattr(self, name, float(v))

        def flag(name):
            if not isinstance(getattr(self, name), bool):
                bad(name, getattr(self, name), "it must be true or false")

        integer("n", 1, INT64_MAX, "it must be an integer >= 1")
        real("temperature", lambda v: v >= 0, "it must be a finite number >= 0 (0 = greedy)")
        real("top_p", lambda v: 0 < v <= 1, "it must be in (0, 1]")
        integer("top_k", -1, INT64_MAX, "it must be -1 (off) or a positive integer")
        real("min_p", lambda v: 0 <= v <= 1, "it must be in [0, 1]")
        real("repetition_penalty", lambda v: v > 0, "it must be a finite number > 0 (1 = off)")
        real("presence_penalty", lambda v: -2 <= v <= 2, "it must be in [-2, 2]")
        real("frequency_penalty", lambda v: -2 <= v <= 2, "it must be in [-2, 2]")
        integer("seed", INT64_MIN, INT64_MAX, "it must be an integer in the int64 range", none_ok=True)
        integer("max_tokens", 1, INT64_MAX, "it must be an integer >= 1, or None for up to the context length",
                none_ok=True)
        integer("min_tokens", 0, self.max_tokens if self.max_tokens is not None else INT64_MAX,
                "it must be an integer >= 0 and <= max_tokens")
        integer("logprobs", 0, INT64_MAX, "it must be an integer >= 0 (the number of top logprobs)", none_ok=True)
        integer("prompt_logprobs", 0, INT64_MAX, "it must be an integer >= 0 (the number of top logprobs at each "
                                                 "prompt position)", none_ok=True)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            flag(name)
        stop = self.stop
        strings = [stop] if isinstance(stop, str) else stop
        if strings is None:
            strings = []
        if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) and s for s in strings):
            bad("stop", stop, "it must be a non-empty string or a list of non-empty strings")
        if len(strings) > MAX_STOP_STRINGS:
            bad("stop", stop, f"at most {MAX_STOP_STRINGS} stop strings")
        self.stop_strings = list(strings)
        ids = self.stop_token_ids if self.stop_token_ids is not None else []
        if (not isinstance(ids, (list, tuple))
                or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids)):
            bad("stop_token_ids", self.stop_token_ids, "it must be a list of token ids (integers)")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            bad("stop_token_ids", self.stop_token_ids, f"at most {MAX_STOP_TOKEN_IDS} token ids")
        self.stop_token_ids = [int(t) for t in ids]
        so = self.structured_outputs
        if so is not None:
            if not isinstance(so, StructuredOutputsParams):
                bad("structured_outputs", so, "it must be a StructuredOutputsParams")
            if self.min_tokens:
                bad("min_tokens", self.min_tokens, "it must be 0 with structured outputs (the grammar decides "
                                                   "where the output ends)")
        self._verify_logit_processors()

    def _verify_logit_processors(self) -> None:
        bad = _out_of_range

        def token_ids(name, value, lo):
            if value is None:
                return None
            if (not isinstance(value, (list, tuple)) or not lo <= len(value) <= MAX_LOGIT_BIAS
                    or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value)):
                bad(name, value, f"it must be a list of {lo} to {MAX_LOGIT_BIAS} token ids (integers)")
            return [int(t) for t in value]

        bias = self.logit_bias
        if bias is not None:
            if (not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS
                    or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in bias)
                    or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                               and -100 <= v <= 100 for v in bias.values())):
                bad("logit_bias", bias, f"it must map at most {MAX_LOGIT_BIAS} token ids to numbers in [-100, 100]")
            self.logit_bias = {int(t): float(v) for t, v in bias.items()}
        self.allowed_token_ids = token_ids("allowed_token_ids", self.allowed_token_ids, 1)
        words = self.bad_words
        if words is not None and (not isinstance(words, (list, tuple)) or len(words) > MAX_BAD_WORDS
                                  or not all(isinstance(w, str) and w.strip() for w in words)):
            bad("bad_words", words, f"it must be a list of at most {MAX_BAD_WORDS} non-empty strings")
        seqs = self.bad_words_token_ids
        if seqs is not None:
            if not isinstance(seqs, (list, tuple)) or len(seqs) > 2 * MAX_BAD_WORDS:
                bad("bad_words", seqs, f"at most {MAX_BAD_WORDS} bad words")
            self.bad_words_token_ids = [token_ids("bad_words", list(w), 1) for w in seqs]

    def resolve_bad_words(self, tokenizer) -> None:
        """bad_words as token ids, each word with and without a leading space (how it may start mid-text)."""
        if not self.bad_words:
            return
        if tokenizer is None:
            raise InvalidRequestError("bad_words needs the model's tokenizer; this model has none", "bad_words")
        seqs = []
        for word in self.bad_words:
            for text in dict.fromkeys((word.strip(), " " + word.strip())):
                ids = tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in seqs:
                    seqs.append(ids)
        self.bad_words_token_ids = seqs
        self._verify_logit_processors()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def clone(self) -> SamplingParams:
        import copy

        return copy.deepcopy(self)
