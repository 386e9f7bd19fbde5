"""Perplexity on held-out text, computed by Tachyon's own model forward (the layers the engine runs, quantized
ones included) with the torch attention backend.

The text ships with Python: `pydoc_data.topics`, the Language Reference's topics (what `help("for")` prints).
`text_split` splits them once by name: every fourth topic in sorted order is held out for evaluation, the rest
is the calibration text of `tachyon quantize --method awq`, so the two never share a topic. The held-out text is
tokenized without special tokens and cut into windows of `seq_len` tokens; each window runs as one fresh
sequence (positions from 0, its own KV slots) and every token but its first is scored:

    tokens:  | window 0: L tokens | window 1: L tokens | ... | last: n < L tokens (if n >= 2) |
    scored:          L - 1                L - 1                       n - 1

    ppl = exp(sum of -log p(token | the window's tokens before it) / tokens scored)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tachyon.config import ModelConfig
from tachyon.layers.attention import AttentionMetadata

HELDOUT_EVERY = 4  # topic i (sorted) is held out when i % 4 == 3
HELDOUT_DESCRIPTION = "pydoc_data.topics, every 4th topic in sorted order (disjoint from the AWQ calibration text)"
DEFAULT_MAX_TOKENS = 16384  # the held-out text is ~16.9k tokens with SmolLM2's tokenizer
DEFAULT_SEQ_LEN = 512


# -- the text -------------------------------------------------------------------------------------------------
def text_split() -> tuple[list[str], list[str]]:
    """(calibration topics, held-out topics) of pydoc_data.topics, by name."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    held = [n for i, n in enumerate(names) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    return [n for n in names if n not in held], held


def topics_text(names: list[str]) -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[n] for n in names)


def heldout_text() -> str:
    return topics_text(text_split()[1])


def calibration_text() -> str:
    return topics_text(text_split()[0])


def encode(tokenizer, text: str, what: str) -> list[int]:
    if tokenizer is None:
        raise ValueError(f"the model has no tokenizer to encode the {what} text with: pass --tokenizer DIR")
    return tokenizer.encode(text, add_special_tokens=False)


# -- one forward over packed prefills ---------------------------------------------------------------------------
def prefill_metadata(seq_lens: list[int], block_size: int, device) -> tuple[AttentionMetadata, int]:
    """Metadata for fresh sequences of `seq_lens` tokens laid end to end, each in its own run of blocks
    (sequence i starts at block sum(ceil(len_j / block_size), j < i)); returns it and the blocks it uses."""
    nblocks = [-(-n // block_size) for n in seq_lens]
    first = [sum(nblocks[:i]) for i in range(len(seq_lens))]
    slots = torch.cat([first[i] * block_size + torch.arange(n) for i, n in enumerate(seq_lens)])
    tables = torch.zeros(len(seq_lens), max(nblocks), dtype=torch.int32)
    for i, nb in enumerate(nblocks):
        tables[i, :nb] = torch.arange(first[i], first[i] + nb, dtype=torch.int32)
    starts = torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=slots.to(device), query_start_loc=starts.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device), block_tables=tables.to(device),
        num_decodes=0, max_query_len=max(seq_lens), max_seq_len=max(seq_lens),
        query_lens_cpu=list(seq_lens), seq_lens_cpu=list(seq_lens))
    return meta, sum(nblocks)


def positions_of(seq_lens: list[int], device) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in seq_lens]).to(device)


def kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's (K, V) pages; zeros, as the engine's pool (padding must not be NaN)."""
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


# -- the model ------------------------------------------------------------------------------------------------
@dataclass
class LoadedModel:
    model: torch.nn.Module  # tachyon.models.llama.LlamaForCausalLM, weights as the engine holds them
    backend: object  # the torch attention backend
    config: object  # EngineConfig
    path: str  # the checkpoint directory
    tokenizer: object | None


def load_model(args) -> LoadedModel:
    """The model of `args` (an EngineArgs) built by the engine's own runner, attention on the torch backend."""
    from tachyon.build import front_end_tokenizer, model_path
    from tachyon.models.loader import load_config
    from tachyon.worker.model_runner import ModelRunner

    args = dataclasses.replace(args, attention_backend="torch", enforce_eager=True)
    path = model_path(args)
    config = args.create_engine_config(load_config(path), args.resolve_device())
    dummy_only = args.load_format == "dummy" and path.endswith(".json")  # a bare config.json: random weights
    runner = ModelRunner(config, None if dummy_only else path, args.load_format)
    return LoadedModel(runner.model, runner.backend, config, path, front_end_tokenizer(args))


@dataclass
class Perplexity:
    ppl: float
    num_tokens: int  # tokens scored
    num_windows: int
    seq_len: int
    nll: float  # mean negative log-likelihood per scored token (nats)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@torch.inference_mode()
def perplexity(lm: LoadedModel, token_ids: list[int], seq_len: int = DEFAULT_SEQ_LEN,
               progress: bool = False) -> Perplexity:
    """ppl of `token_ids` cut into windows of `seq_len` (module docstring), one fresh sequence per window."""
    if seq_len < 2:
        raise ValueError(f"--seq-len {seq_len}: a window needs at least 2 tokens")
    cfg = lm.config
    if seq_len > cfg.scheduler.max_model_len:
        raise ValueError(f"--seq-len {seq_len} is longer than the model's {cfg.scheduler.max_model_len} positions")
    windows = [token_ids[i:i + seq_len] for i in range(0, len(token_ids), seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise ValueError(f"{len(token_ids)} tokens: perplexity needs at least 2")
    device, block_size = cfg.device, cfg.cache.block_size
    _, num_blocks = prefill_metadata([seq_len], block_size, "cpu")
    kv = [kv_cache(cfg.model, num_blocks, block_size, cfg.cache.dtype, device) for _ in range(cfg.model.num_layers)]
    total, count = 0.0, 0
    it = windows
    if progress:
        from tqdm import tqdm

        it = tqdm(windows, desc="perplexity", unit="window", dynamic_ncols=True)
    for w in it:
        ids = torch.tensor(w, device=device)
        meta, _ = prefill_metadata([len(w)], block_size, device)
        hidden = lm.model(ids, positions_of([len(w)], device), kv, meta, lm.backend)
        logits = lm.model.compute_logits(hidden[:-1])
        total += F.cross_entropy(logits, ids[1:], reduction="sum").item()
        count += len(w) - 1
    nll = total / count
    return Perplexity(math.exp(nll), count, len(windows), seq_len, nll)


def heldout_perplexity(args, max_tokens: int = DEFAULT_MAX_TOKENS, seq_len: int = DEFAULT_SEQ_LEN,
                       progress: bool = False) -> Perplexity:
    """`tachyon eval ppl`: the model of `args` (an EngineArgs) on the first max_tokens of the held-out text."""
    lm = load_model(args)
    ids = encode(lm.tokenizer, heldout_text(), "held-out")
    if max_tokens:
        ids = ids[:max_tokens]
    return perplexity(lm, ids, seq_len, progress)
