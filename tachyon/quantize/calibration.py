"""Calibration: token windows of the calibration text, run through the dense model, and what the inputs of its
linears leave behind (InputStats: per input channel sum |x| and max |x|, and the Gram matrix X^T X)."""

from __future__ import annotations

import functools

import torch

from tachyon.quantize.checkpoint import LINEARS

MAX_CHUNK_TOKENS = 4096  # calibration sequences run through a layer this many tokens at a time


class InputStats:
    """What a linear's calibration inputs leave behind: sum |x| and max |x| per input channel, and the Gram
    matrix X^T X (None when not asked for)."""

    def __init__(self, in_features: int, device, gram: bool = True):
        self.abs_sum = torch.zeros(in_features, dtype=torch.float64, device=device)
        self.abs_max = torch.zeros(in_features, dtype=torch.float32, device=device)
        self.gram = torch.zeros(in_features, in_features, dtype=torch.float64, device=device) if gram else None
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.abs_sum += x.abs().sum(0, dtype=torch.float64)
        torch.maximum(self.abs_max, x.abs().amax(0), out=self.abs_max)
        if self.gram is not None:
            self.gram += (x.T @ x).double()  # fp32 per chunk, summed in fp64
        self.count += x.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        return self.abs_sum / max(self.count, 1)

    def scaled(self, s: torch.Tensor) -> InputStats:
        """The stats of x / s."""
        out = InputStats(0, s.device, gram=False)
        d = s.double()
        out.abs_sum, out.abs_max, out.count = self.abs_sum / d, self.abs_max / s.float(), self.count
        if self.gram is not None:
            out.gram = self.gram / (d[:, None] * d[None, :])
        return out


def record_input(stats: InputStats, module, args) -> None:
    """A forward pre-hook: the module's input into `stats`."""
    stats.add(args[0])


@torch.no_grad()
def input_stats(lm, samples: list[list[int]], names: tuple[str, ...] = LINEARS,
                gram: bool = True) -> list[dict[str, InputStats]]:
    """Per decoder layer, the InputStats of linears `names` over the calibration sequences, in one pass of the
    dense lm.model (a tachyon.eval.ppl.LoadedModel). gram False: sums and maxima only."""
    from tachyon.eval.ppl import kv_cache

    model, cfg = lm.model, lm.model.cfg
    device, block_size = lm.config.device, lm.config.cache.block_size
    steps = packed_prefills(samples, block_size, device)
    kv = [kv_cache(cfg, max(st[2] for st in steps), block_size, lm.config.dtype, device)
          for _ in range(cfg.num_layers)]
    stats = [{n: InputStats(layer.get_submodule(n).in_features, device, gram) for n in names}
             for layer in model.layers]
    hooks = [layer.get_submodule(n).register_forward_pre_hook(functools.partial(record_input, st[n]))
             for layer, st in zip(model.layers, stats, strict=True) for n in names]
    try:
        for meta, pos, _, ids in steps:
            model(ids, pos, kv, meta, lm.backend)
    finally:
        for h in hooks:
            h.remove()
    return stats


def calibration_samples(token_ids: list[int], num_samples: int, seq_len: int) -> list[list[int]]:
    """num_samples windows of seq_len tokens spread evenly over the calibration text (fewer if it is short)."""
    if num_samples < 1 or seq_len < 1:
        raise ValueError(f"--calib-samples {num_samples} --calib-seq-len {seq_len}: both must be >= 1")
    windows = len(token_ids) // seq_len
    if windows == 0:
        raise ValueError(f"the calibration text has {len(token_ids)} tokens, fewer than --calib-seq-len {seq_len}")
    n = min(num_samples, windows)
    starts = [(j * windows // n) * seq_len for j in range(n)]
    return [token_ids[s:s + seq_len] for s in starts]


def packed_prefills(samples: list[list[int]], block_size: int, device, max_tokens: int = MAX_CHUNK_TOKENS):
    """The calibration sequences as prefill batches of up to max_tokens tokens laid end to end: (metadata,
    positions, KV blocks used, token ids) each (tachyon.eval.ppl.prefill_metadata)."""
    from tachyon.eval.ppl import positions_of, prefill_metadata

    chunks: list[list[list[int]]] = []
    for s in samples:
        if not chunks or sum(map(len, chunks[-1])) + len(s) > max_tokens:
            chunks.append([])
        chunks[-1].append(s)
    steps = []
    for c in chunks:
        lens = [len(s) for s in c]
        meta, nblocks = prefill_metadata(lens, block_size, device)
        ids = torch.tensor([t for s in c for t in s], device=device)
        steps.append((meta, positions_of(lens, device), nblocks, ids))
    return steps
