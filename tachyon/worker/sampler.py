"""Sampling on the device: grammar masks, logit bias, allowed tokens, bad words, penalties, temperature, top-k,
top-p, min-p, per-request seeds, logprobs (of the model's raw distribution, as vLLM's default).

Random rows sample with the exponential race: argmax(p / q) with q ~ Exp(1) picks token i with
probability p_i. A seeded request draws its q from its own generator, one vector per step, so what it
samples does not depend on what else is in the batch.

A sequence with a grammar (structured outputs) fills one row of an int32 bitmask on the host, and its logits row
keeps only the allowed tokens; the other rows of the batch are untouched:

    bitmask [R, ceil(V/32)] int32      word w, bit j  ─►  token 32*w + j allowed
    logits[rows[r]] = -inf where the bit is 0          (after the model, so CUDA-graph replays are unaffected)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Sequence = Any  # tachyon.engine.sequence.Sequence: sampling_params, token_ids, output_token_ids, eos_token_ids,
                # generator, grammar (the sampler reads nothing else)

_NEG_INF = float("-inf")


def to_device(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A host list as a tensor on `device`, without waiting for the device: on a GPU it is staged in pinned
    memory and copied asynchronously. (`torch.tensor(data, device="cuda")` synchronizes the stream, so the host
    would wait for every kernel queued before it: the forward a sampling step follows.)"""
    if device.type != "cuda":
        return torch.as_tensor(data, dtype=dtype, device=device)
    if isinstance(data, list | tuple):
        staged = torch.tensor(data, dtype=dtype, pin_memory=True)
    else:  # a numpy array or a host tensor (torch cannot pin a tensor made from numpy in place)
        staged = torch.as_tensor(data, dtype=dtype).pin_memory()
    return staged.to(device, non_blocking=True)


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [S, V] with the rows `rows` [R] limited to the tokens their bitmask [R, ceil(V/32)] allows
    (a new tensor; others untouched)."""
    V = logits.shape[1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :V]  # [R, W*32] -> [R, V]
    if allowed.shape[1] < V:  # the bitmask may be narrower than padded logits: the rest is not allowed
        allowed = torch.nn.functional.pad(allowed, (0, V - allowed.shape[1]), value=False)
    out = logits.clone()
    out[rows] = logits[rows].masked_fill(~allowed, _NEG_INF)
    return out


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # per row: {token_id: logprob} of the top-N and the sampled token, or None
    logprobs: list[dict[int, float] | None]
    sampled_logprobs: list[float | None]
    sampled_ranks: list[int | None]  # 1 + how many tokens were more likely than the sampled one


@dataclass
class DeviceSample:
    """One step's sampling, still on the device (nothing has waited for it)."""

    token_ids: torch.Tensor  # [S]
    want_logprobs: list[int | None]
    chosen: torch.Tensor | None = None  # [S] logprob of each sampled token
    top_vals: torch.Tensor | None = None  # [S, k]
    top_ids: torch.Tensor | None = None
    ranks: torch.Tensor | None = None  # [S] rank of each sampled token (1 = the most likely)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.token_ids, self.chosen, self.top_vals, self.top_ids, self.ranks) if t is not None]

    def with_tensors(self, ts: list[torch.Tensor]) -> DeviceSample:
        it = iter(ts)
        pick = lambda t: None if t is None else next(it)  # noqa: E731
        return DeviceSample(pick(self.token_ids), self.want_logprobs, pick(self.chosen), pick(self.top_vals),
                            pick(self.top_ids), pick(self.ranks))

    def to_output(self) -> SamplerOutput:
        """The host lists (waits for the device if the tensors live there)."""
        token_list = self.token_ids.tolist()
        S = len(token_list)
        out_lp: list[dict[int, float] | None] = [None] * S
        sampled_lp: list[float | None] = [None] * S
        sampled_rank: list[int | None] = [None] * S
        if self.chosen is not None:
            chosen = self.chosen.tolist()
            ranks = self.ranks.tolist() if self.ranks is not None else [None] * S
            top_vals = self.top_vals.tolist() if self.top_vals is not None else None
            top_ids = self.top_ids.tolist() if self.top_ids is not None else None
            for i, n in enumerate(self.want_logprobs):
                if n is None:
                    continue
                d = {token_list[i]: chosen[i]}
                if n > 0:
                    for tid, v in zip(top_ids[i][:n], top_vals[i][:n], strict=True):
                        d.setdefault(tid, v)
                out_lp[i] = d
                sampled_lp[i] = chosen[i]
                sampled_rank[i] = ranks[i]
        return SamplerOutput(token_list, out_lp, sampled_lp, sampled_rank)


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int = 0):
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def request_generator(self, seed: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        return g

    def sample_tokens(self, logits: torch.Tensor, reqs: list[Sequence],
                      num_outputs: list[int] | None = None) -> torch.Tensor:
        """The sampled ids as a device tensor [S] (no host sync). num_outputs: each row's output tokens before
        the one sampled now (default: those its sequence knows; a step queued ahead counts pending ones)."""
        logits = self.process_logits(logits, reqs, num_outputs)
        greedy = [r.sampling_params.greedy for r in reqs]
        if all(greedy):
            return logits.argmax(dim=-1)
        return self._sample_random(logits, reqs, greedy)

    def sample(self, logits: torch.Tensor, reqs: list[Sequence], num_outputs: list[int] | None = None
               ) -> DeviceSample:
        """logits: [S, V] float32 (one row per sequence that samples this step), rows in `reqs` order. Ids and
        logprobs stay on the device (DeviceSample.to_output brings them over)."""
        logits = logits[:, : self.vocab_size]
        want_logprobs = [r.sampling_params.logprobs for r in reqs]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(n is not None for n in want_logprobs) else None
        tokens = self.sample_tokens(logits, reqs, num_outputs)
        out = DeviceSample(tokens, want_logprobs)
        if raw_logprobs is not None:
            k = max(n or 0 for n in want_logprobs)
            if k > 0:
                out.top_vals, out.top_ids = raw_logprobs.topk(k, dim=-1)
            out.chosen = raw_logprobs.gather(1, tokens.view(-1, 1)).squeeze(1)
            out.ranks = (raw_logprobs > out.chosen.unsqueeze(1)).sum(dim=-1) + 1
        return out

    def __call__(self, logits: torch.Tensor, reqs: list[Sequence], num_outputs: list[int] | None = None
                 ) -> SamplerOutput:
        return self.sample(logits, reqs, num_outputs).to_output()

    # -- logits processing ----------------------------------------------------------------------------------
    def process_logits(self, logits: torch.Tensor, reqs: list[Sequence], num_outputs: list[int] | None = None
                       ) -> torch.Tensor:
        """Grammar masks, logit_bias / allowed_token_ids / bad words, penalties, and stop tokens masked before
        min_tokens (num_outputs: as in sample_tokens)."""
        logits = logits[:, : self.vocab_size]
        logits = self._apply_grammars(logits, reqs)
        logits = self._apply_logit_processors(logits, reqs)
        logits = self._apply_penalties(logits, reqs)
        if num_outputs is None:
            num_outputs = [r.num_output_tokens for r in reqs]
        return self._mask_stop_before_min_tokens(logits, reqs, num_outputs)

    def _apply_logit_processors(self, logits: torch.Tensor, reqs: list[Sequence]) -> torch.Tensor:
        """logit_bias (added), allowed_token_ids (all others -inf), bad words (a word's last token -inf where the
        output ends with the rest of it; a one-token word always). Multi-token bad words read the output, so
        their steps' sampling waits for the step before to land (scheduler.reads_history, defer_sampling)."""
        rows = [i for i, r in enumerate(reqs) if (r.sampling_params.logit_bias or r.sampling_params.allowed_token_ids
                                                  or r.sampling_params.bad_words_token_ids)]
        if not rows:
            return logits
        logits = logits.clone()
        dev = logits.device
        for i in rows:
            r, sp = reqs[i], reqs[i].sampling_params
            if sp.allowed_token_ids:
                keep = to_device(sp.allowed_token_ids, dev)
                row = torch.full_like(logits[i], _NEG_INF)
                row[keep] = logits[i, keep]
                logits[i] = row
            if sp.logit_bias:
                ids = to_device(list(sp.logit_bias), dev)
                logits[i, ids] += to_device(list(sp.logit_bias.values()), dev, logits.dtype)
            banned = [w[-1] for w in sp.bad_words_token_ids or ()
                      if len(w) == 1 or r.output_token_ids[-(len(w) - 1):] == w[:-1]]
            if banned:
                logits[i].index_fill_(0, to_device(banned, dev), _NEG_INF)  # a scalar put would copy it synchronously
        return logits

    def _apply_grammars(self, logits: torch.Tensor, reqs: list[Sequence]) -> torch.Tensor:
        # a sequence that finished while this step was in flight (its sampling deferred) is not masked: its
        # grammar may be terminated, and its token is dropped anyway
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None and not r.is_finished]
        if not rows:
            return logits
        bitmask = torch.empty((len(rows), (self.vocab_size + 31) // 32), dtype=torch.int32,
                              pin_memory=logits.device.type == "cuda")
        grammars = [reqs[i].grammar for i in rows]
        grammars[0].fill_bitmasks(grammars, bitmask)  # row j for grammars[j]
        dev = logits.device
        return apply_token_bitmask(logits, to_device(rows, dev), bitmask.to(dev, non_blocking=True))

    def _apply_penalties(self, logits: torch.Tensor, reqs: list[Sequence]) -> torch.Tensor:
        rows = [i for i, r in enumerate(reqs) if (r.sampling_params.repetition_penalty != 1.0
                                                  or r.sampling_params.presence_penalty != 0.0
                                                  or r.sampling_params.frequency_penalty != 0.0)]
        if not rows:
            return logits
        logits = logits.clone()
        V = logits.shape[1]
        for i in rows:
            r, sp = reqs[i], reqs[i].sampling_params
            row = logits[i]
            if sp.repetition_penalty != 1.0:
                seen = to_device(sorted(set(t for t in r.token_ids if t < V)), logits.device, torch.long)
                if seen.numel():
                    vals = row[seen]
                    row[seen] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
            if sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0:
                out = [t for t in r.output_token_ids if t < V]
                if out:  # (not bincount: it reads the largest id back to size its answer, a stream sync)
                    counts = torch.zeros(V, dtype=row.dtype, device=logits.device).index_add_(
                        0, to_device(out, logits.device, torch.long), torch.ones(len(out), dtype=row.dtype,
                                                                               device=logits.device))
                    row -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(row.dtype)
        return logits

    def _mask_stop_before_min_tokens(self, logits: torch.Tensor, reqs: list[Sequence],
                                     num_outputs: list[int]) -> torch.Tensor:
        cloned = False
        for i, r in enumerate(reqs):
            sp = r.sampling_params
            if num_outputs[i] < sp.min_tokens:
                banned = set(sp.stop_token_ids)
                if not sp.ignore_eos:
                    banned |= r.eos_token_ids
                if banned:
                    if not cloned:
                        logits, cloned = logits.clone(), True
                    logits[i].index_fill_(0, to_device(sorted(banned), logits.device), _NEG_INF)
        return logits

    def _sample_random(self, logits: torch.Tensor, reqs: list[Sequence], greedy: list[bool]) -> torch.Tensor:
        probs = self.target_probs(logits, reqs, greedy)
        tokens = (probs / self.exponential_noise(probs, reqs)).argmax(dim=-1)
        if any(greedy):
            g = to_device(greedy, logits.device)
            tokens = torch.where(g, logits.argmax(dim=-1), tokens)
        return tokens

    def target_probs(self, logits: torch.Tensor, reqs: list[Sequence], greedy: list[bool]) -> torch.Tensor:
        """[S, V] the distribution each row samples from: temperature, then top-k, top-p and min-p (greedy rows
        at temperature 1; their caller takes the argmax). Rows with top-p or min-p are left unnormalised."""
        V = logits.shape[1]
        params = [r.sampling_params for r in reqs]
        dev = logits.device
        temp = to_device([1.0 if g else sp.temperature for g, sp in zip(greedy, params, strict=True)], dev)
        x = logits / temp.unsqueeze(1)
        top_k = [sp.top_k for sp in params]
        if any(k > 0 for k in top_k):
            k_t = to_device([k if k > 0 else V for k in top_k], dev)
            kth = x.sort(dim=-1, descending=True).values.gather(1, (k_t.clamp(max=V) - 1).view(-1, 1))
            x = x.masked_fill(x < kth, _NEG_INF)
        probs = x.softmax(dim=-1)
        top_p = [sp.top_p for sp in params]
        if any(p < 1.0 for p in top_p):
            p_t = to_device(top_p, dev).view(-1, 1)
            sorted_p, idx = probs.sort(dim=-1, descending=True)
            cum = sorted_p.cumsum(dim=-1)
            drop_sorted = (cum - sorted_p) >= p_t  # keep the smallest set whose mass reaches top_p
            drop = torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
        min_p = [sp.min_p for sp in params]
        if any(m > 0 for m in min_p):
            m_t = to_device(min_p, dev).view(-1, 1)
            probs = probs.masked_fill(probs < m_t * probs.max(dim=-1, keepdim=True).values, 0.0)
        return probs

    def exponential_noise(self, like: torch.Tensor, reqs: list[Sequence]) -> torch.Tensor:
        """Exp(1) draws shaped like `like` [S, ...]: a seeded row's from its own generator, the rest from the
        sampler's (argmax(p / q) then picks i with probability p_i / sum p)."""
        S = like.shape[0]
        q = torch.empty_like(like)
        unseeded = [i for i, r in enumerate(reqs) if r.generator is None]
        if unseeded:
            if len(unseeded) == S:
                q.exponential_(generator=self.generator)
            else:
                draws = torch.empty((len(unseeded), *like.shape[1:]), device=like.device,
                                    dtype=like.dtype).exponential_(generator=self.generator)
                q.index_copy_(0, to_device(unseeded, like.device, torch.long), draws)  # (a list index would sync)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                q[i].exponential_(generator=r.generator)
        return q
