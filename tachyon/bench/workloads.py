"""The standard workloads (../shared/WORKLOADS.md) and the generators behind custom ones.

A workload is a list of `BenchRequest`s: token ids in, an exact output length out (EOS ignored, greedy).
Prompts are random token ids drawn uniformly from [1000, vocab-1000) with Python `random.Random(seed)`;
lengths drawn from a range use their own seed, so the same name gives the same requests on every machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

CHAT_MESSAGE = "Write a short story about a robot who learns to paint, in about two hundred words."


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int
    prompt: str | None = None  # text, where the workload has it (chat prompt, JSONL file)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class WorkloadSpec:
    """What to generate; `build(vocab_size)` turns it into requests."""

    name: str
    num_prompts: int
    input_len: int | tuple[int, int] = 128  # an int, or an inclusive range [lo, hi] drawn uniformly
    output_len: int | tuple[int, int] = 128
    input_seed: int = 12
    output_seed: int = 13
    seed: int = 0  # the token-id generator's seed
    prefix_len: int = 0  # tokens shared by every prompt, in front of its unique part
    chat: bool = False  # one fixed chat message through the model's chat template
    jsonl: str | None = None
    concurrencies: list[int] = field(default_factory=list)  # sweep: the default concurrency list
    prompts_at: dict[int, int] = field(default_factory=dict)  # sweep: requests per run at a concurrency
    notes: str = ""

    def describe(self) -> dict:
        d = asdict(self)
        return {k: v for k, v in d.items() if v not in (None, [], "", 0, False) or k in ("num_prompts", "seed")}


# Every entry of ../shared/WORKLOADS.md, by name.
NAMED: dict[str, WorkloadSpec] = {
    "single": WorkloadSpec("single", 1, 512, 512, notes="decode tok/s = 511 / (t(512 out) - t(1 out)), TTFT"),
    "sweep": WorkloadSpec("sweep", 0, 512, 256, concurrencies=[1, 4, 16, 64, 256],
                          notes="c requests at once for each c; output tok/s per c"),
    "throughput": WorkloadSpec("throughput", 1000, 512, 512),
    "random": WorkloadSpec("random", 256, (100, 1024), (100, 1024), input_seed=12, output_seed=13, seed=12),
    "serve": WorkloadSpec("serve", 1000, 512, 256, concurrencies=[1, 16, 64, 256],
                          prompts_at={1: 16, 16: 128, 64: 256, 256: 1000},
                          notes="16/128/256/1000 prompts at max-concurrency 1/16/64/256; 600 at 20 req/s"),
    "prefix": WorkloadSpec("prefix", 256, 128, 128, prefix_len=2048),
    "cpu-single": WorkloadSpec("cpu-single", 1, 0, 128, chat=True, notes="a chat prompt; decode tok/s, TTFT"),
    "cpu-batch": WorkloadSpec("cpu-batch", 32, (16, 256), (16, 128), input_seed=12, output_seed=13, seed=12,
                              notes="output tok/s, useful tokens only"),
}


def parse_len(text: str) -> int | tuple[int, int]:
    """'128' -> 128; '16:256' or '16-256' -> (16, 256) (inclusive, drawn uniformly)."""
    for sep in (":", "-", ","):
        if sep in text:
            lo, hi = (int(x) for x in text.split(sep, 1))
            if not 1 <= lo <= hi:
                raise ValueError(f"length range {text!r} needs 1 <= lo <= hi")
            return lo, hi
    n = int(text)
    if n < 0:
        raise ValueError(f"length {text!r} must be >= 0")
    return n


def _lengths(spec: int | tuple[int, int], n: int, seed: int) -> list[int]:
    if isinstance(spec, int):
        return [spec] * n
    rng = random.Random(seed)
    return [rng.randint(spec[0], spec[1]) for _ in range(n)]


def random_token_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    lo, hi = 1000, vocab_size - 1000
    if hi <= lo:
        lo, hi = 0, vocab_size
    return [rng.randrange(lo, hi) for _ in range(n)]


def build(spec: WorkloadSpec, vocab_size: int, chat_ids: list[int] | None = None) -> list[BenchRequest]:
    """The requests of a workload. `chat_ids` are the chat prompt's ids (for `chat` workloads)."""
    if spec.jsonl:
        return load_jsonl(spec.jsonl, spec.output_len if isinstance(spec.output_len, int) else None)
    n = spec.num_prompts
    out_lens = _lengths(spec.output_len, n, spec.output_seed)
    if spec.chat:
        if chat_ids is None:
            raise ValueError(f"workload {spec.name!r} is a chat prompt: it needs the model's tokenizer "
                             f"and chat template")
        return [BenchRequest(list(chat_ids), out_lens[i], CHAT_MESSAGE) for i in range(n)]
    in_lens = _lengths(spec.input_len, n, spec.input_seed)
    rng = random.Random(spec.seed)
    prefix = random_token_ids(rng, spec.prefix_len, vocab_size) if spec.prefix_len else []
    return [BenchRequest(prefix + random_token_ids(rng, in_lens[i], vocab_size), out_lens[i]) for i in range(n)]


def load_jsonl(path: str, default_output_len: int | None) -> list[BenchRequest]:
    """One request a line: {"prompt_token_ids": [...] | "prompt": "text", "output_len": N}.

    Text prompts keep their text; the backend tokenizes them. A bad line raises ValueError naming file:line.
    """
    reqs = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise FileNotFoundError(f"workload file {path}: {e.strerror}") from None
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            ids = row.get("prompt_token_ids")
            text = row.get("prompt")
            if ids is None and not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: needs 'prompt' (text) or 'prompt_token_ids' (list of ints)")
            if ids is not None and (not isinstance(ids, list) or not ids
                                    or not all(isinstance(t, int) and t >= 0 for t in ids)):
                raise ValueError(f"{path}:{lineno}: 'prompt_token_ids' must be a non-empty list of ints >= 0")
            out = row.get("output_len", row.get("max_tokens", default_output_len))
            if not isinstance(out, int) or out < 1:
                raise ValueError(f"{path}:{lineno}: 'output_len' must be an integer >= 1 "
                                 f"(or give --output-len for every line)")
            reqs.append(BenchRequest(list(ids) if ids is not None else [], out, text))
    if not reqs:
        raise ValueError(f"{path}: no requests in the file")
    return reqs


def tokenize_text_prompts(reqs: list[BenchRequest], tokenizer) -> None:
    """Fill prompt_token_ids of text-only requests (JSONL prompts) with the model's tokenizer."""
    for r in reqs:
        if not r.prompt_token_ids and r.prompt is not None:
            if tokenizer is None:
                raise ValueError("the workload has text prompts but the model has no tokenizer")
            r.prompt_token_ids = list(tokenizer.encode(r.prompt))
