"""Verifying proposed tokens: the rejection sampling that makes speculative decoding exact.

A sequence that speculates runs its last known token x and k proposals d1..dk in one forward, so the target
gives k + 1 distributions: p_0 for the token after x, p_1 for the token after d1, ..., p_k after dk. Proposals
are checked left to right. With a draft distribution q_i (the proposer's, for the token in p_i's place):

    accept d_{i+1} with probability  min(1, p_i(d_{i+1}) / q_i(d_{i+1}))
    first rejection at i:   emit a token from  r_i = max(0, p_i - q_i) / sum(max(0, p_i - q_i)), stop
    all k accepted:         emit a bonus token from p_k

Why it is exact (Leviathan et al., 2023): the emitted token at a position takes the value t with probability

    q(t) min(1, p(t)/q(t)) + (1 - sum_s min(q(s), p(s))) r(t) = min(q(t), p(t)) + max(0, p(t) - q(t)) = p(t)

so every output token is distributed as plain sampling from the target would have it, whatever the proposer.
Our proposers are deterministic (n-gram lookup, a greedy draft): q_i is a point mass on d_{i+1}, and the rule
becomes

    accept d with probability p(d);   on rejection emit a token from p with d removed, renormalised

Greedy rows (temperature 0, p one-hot on the argmax) accept d exactly when it is the argmax, and emit the
argmax where they stop: the tokens of plain greedy decoding. Draws: one uniform per proposal and one
exponential race (argmax of r / Exp(1)) at the stopping position, from the sequence's own generator when it is
seeded.
"""

from __future__ import annotations

import numpy as np
import torch

from tachyon.worker.sampler import Sampler, to_device


def verify(sampler: Sampler, logits: torch.Tensor, reqs: list, drafts: list[list[int]],
           num_outputs: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [sum(k_b + 1), V]: each sequence's k_b + 1 rows in order, sequences in `reqs` order; drafts[b]: its
    k_b >= 1 proposals; num_outputs[b]: its output tokens before the first verified position. Returns, on the
    device, each sequence's token after its accepted proposals [B] and how many it accepted [B]."""
    dev = logits.device
    ks = [len(d) for d in drafts]
    B, K = len(reqs), max(ks)
    row_reqs = [r for r, k in zip(reqs, ks, strict=True) for _ in range(k + 1)]
    row_outputs = [n + i for n, k in zip(num_outputs, ks, strict=True) for i in range(k + 1)]
    logits = sampler.process_logits(logits, row_reqs, row_outputs)  # min_tokens holds per position

    # [B, K+1] row of each (sequence, position); positions past k_b repeat the sequence's last row
    k_t = to_device(ks, dev)
    first = torch.cumsum(k_t + 1, 0) - (k_t + 1)
    pos = torch.arange(K + 1, device=dev)
    rows = first.unsqueeze(1) + torch.minimum(pos.unsqueeze(0), k_t.unsqueeze(1))
    d_host = np.zeros((B, K), dtype=np.int64)  # proposals, padded; one copy to the device
    for b, dr in enumerate(drafts):
        d_host[b, : len(dr)] = dr
    d = to_device(d_host, dev)
    valid = pos[:K].unsqueeze(0) < k_t.unsqueeze(1)

    greedy = [r.sampling_params.greedy for r in reqs]
    argmax = logits.argmax(dim=-1)
    accept = argmax[rows[:, :K]] == d
    probs = None
    if not all(greedy):
        probs = sampler.target_probs(logits, row_reqs, [greedy[b] for b, k in enumerate(ks) for _ in range(k + 1)])
        probs = probs / probs.sum(dim=-1, keepdim=True)
        p_d = probs[rows[:, :K], d]  # [B, K] target probability of each proposal
        u = torch.rand(B, K, device=dev, generator=sampler.generator)
        for b, r in enumerate(reqs):
            if r.generator is not None:
                u[b] = torch.rand(K, device=dev, generator=r.generator)
        g = to_device(greedy, dev).unsqueeze(1)
        accept = torch.where(g, accept, u < p_d)
    accept &= valid
    num_accepted = torch.cumprod(accept.long(), dim=1).sum(dim=1)  # leading accepted proposals

    stop_rows = rows.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # [B] the position each one emits at
    tokens = argmax[stop_rows]
    if probs is not None:
        residual = probs[stop_rows].clone()
        rejected = num_accepted < k_t  # stopped on a rejection: the rejected proposal leaves the distribution
        rejected_tok = d.gather(1, num_accepted.clamp(max=K - 1).unsqueeze(1))  # [B, 1]
        kept = residual.gather(1, rejected_tok).masked_fill(rejected.unsqueeze(1), 0.0)
        residual.scatter_(1, rejected_tok, kept)  # (no boolean indexing: nothing waits for the device)
        # a proposal rejected at p(d) ~ 1 by rounding leaves no mass: emit from p itself (probability ~ 0 anyway)
        empty = residual.sum(dim=-1, keepdim=True) <= 0
        residual = torch.where(empty, probs[stop_rows], residual)
        sampled = (residual / sampler.exponential_noise(residual, reqs)).argmax(dim=-1)
        tokens = torch.where(to_device(greedy, dev), tokens, sampled)
    return tokens, num_accepted
