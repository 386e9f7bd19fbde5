"""Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`): the logprob of each prompt token given the tokens
before it, with its rank and the top-N at that position, computed from the prefill's own hidden states.

A step's chunk of a prompt computes positions start .. start+n-1; position p's logits score token p+1. The last
prompt position scores the first output token (that row is sampled, not reported here), so a prompt of P tokens
has P-1 prompt logprobs, the first token none:

    prompt      t0   t1   t2   t3   t4          P = 5
    position    0    1    2    3    4
    scores      t1   t2   t3   t4   (sampled)   chunk [0, 3) then [3, 5): rows 0 1 2, then 3

Only the sequences that ask pay: their rows' logits are computed apart from the sampled rows, a slice at a time
(a long prompt's [rows, vocab] float32 logits would not fit at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_ROWS_PER_SLICE = 512  # logits of this many prompt positions at a time: [512, vocab] float32


@dataclass
class PromptRows:
    """The step's prompt positions that report logprobs: per sequence (seq, its first position, row count),
    and for every row its token index in the batch and the prompt token it scores."""

    seqs: list[tuple[object, int, int]]
    token_index: np.ndarray  # [R] into the step's packed tokens
    targets: np.ndarray  # [R] the prompt token each row scores
    top_k: int  # the most top logprobs any of the sequences asks for


def prompt_rows(ordered: list, query_start_loc: np.ndarray) -> PromptRows | None:
    """The rows of a step's scheduled sequences (`ordered`, in batch order) that want prompt logprobs."""
    seqs, index, targets, top_k = [], [], [], 0
    for i, s in enumerate(ordered):
        seq = s.seq
        if not seq.wants_prompt_logprobs:
            continue
        first, last = s.start, min(s.start + s.num_new_tokens, seq.num_prompt_tokens - 1)
        if last <= first:
            continue
        seqs.append((seq, first, last - first))
        index.append(np.arange(query_start_loc[i], query_start_loc[i] + last - first))
        targets.append(np.asarray(seq.prompt_token_ids[first + 1:last + 1], dtype=np.int64))
        top_k = max(top_k, seq.sampling_params.prompt_logprobs)
    if not seqs:
        return None
    return PromptRows(seqs, np.concatenate(index), np.concatenate(targets), top_k)


@dataclass
class PromptLogprobs:
    """Device (then host) tensors for PromptRows: each row's prompt-token logprob and rank, and its top-k."""

    rows: PromptRows
    chosen: torch.Tensor  # [R]
    ranks: torch.Tensor  # [R] 1 = the most likely token at that position
    top_vals: torch.Tensor  # [R, k]
    top_ids: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [self.chosen, self.ranks, self.top_vals, self.top_ids]

    def with_tensors(self, ts: list[torch.Tensor]) -> PromptLogprobs:
        return PromptLogprobs(self.rows, *ts)

    def to_host(self) -> list[tuple[object, int, list[dict[int, float]], list[int]]]:
        """Per sequence: (seq, first position, {token_id: logprob} per position, the prompt token's rank per
        position), the prompt token first in each dict, then its top-k."""
        chosen, ranks = self.chosen.tolist(), self.ranks.tolist()
        top_vals, top_ids = self.top_vals.tolist(), self.top_ids.tolist()
        targets = self.rows.targets.tolist()
        out, r = [], 0
        for seq, first, count in self.rows.seqs:
            k = seq.sampling_params.prompt_logprobs
            entries = []
            for j in range(r, r + count):
                d = {targets[j]: chosen[j]}
                for tid, v in zip(top_ids[j][:k], top_vals[j][:k], strict=True):
                    d.setdefault(tid, v)
                entries.append(d)
            out.append((seq, first, entries, ranks[r:r + count]))
            r += count
        return out


def compute_prompt_logprobs(model, hidden: torch.Tensor, rows: PromptRows, vocab_size: int,
                            driver: bool = True) -> PromptLogprobs | None:
    """Log-softmax of the model's logits at the rows' positions (hidden: the step's [T, H] hidden states), a
    slice of rows at a time; nothing waits for the device. Under tensor parallelism every rank computes the
    slices' logits (the LM head gathers them to rank 0, a collective); only the driver (rank 0) goes on."""
    dev = hidden.device
    index = torch.from_numpy(rows.token_index).to(dev)
    if not driver:
        for a in range(0, len(rows.token_index), _ROWS_PER_SLICE):
            model.compute_logits(hidden[index[a:a + _ROWS_PER_SLICE]])
        return None
    targets = torch.from_numpy(rows.targets).to(dev)
    chosen, ranks, vals, ids = [], [], [], []
    for a in range(0, len(rows.token_index), _ROWS_PER_SLICE):
        b = a + _ROWS_PER_SLICE
        lp = torch.log_softmax(model.compute_logits(hidden[index[a:b]])[:, :vocab_size].float(), dim=-1)
        c = lp.gather(1, targets[a:b].view(-1, 1))
        chosen.append(c.squeeze(1))
        ranks.append((lp > c).sum(dim=-1) + 1)
        v, i = lp.topk(rows.top_k, dim=-1)
        vals.append(v)
        ids.append(i)
    return PromptLogprobs(rows, torch.cat(chosen), torch.cat(ranks), torch.cat(vals), torch.cat(ids))
