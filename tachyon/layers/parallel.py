"""Tensor parallelism's layers: the process group a model shard talks through, and the vocabulary-parallel
embedding and LM head.

Rank r of N holds a contiguous slice of every projection (tachyon.models.sharding says which):

    qkv_proj, gate_up_proj   column-parallel: its own output features (its heads, its intermediate slice)
    o_proj, down_proj        row-parallel: its own input features; the partial sums meet in one all-reduce
    embed_tokens             its vocabulary rows; a token outside them looks up zeros; one all-reduce
    lm_head                  its vocabulary rows; the logits are gathered to rank 0, which samples

So a layer costs two all-reduces of [tokens, hidden] (after o_proj and after down_proj), and the step one more
(the embedding) plus the gather of the sampled rows' logits. `bytes_all_reduced` counts what went through
`all_reduce` (eager steps; a CUDA graph counts once, at capture).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn


@dataclass(eq=False)
class TensorParallel:
    """One rank's view of the tensor-parallel group: `group` carries the activations (NCCL on GPUs, gloo on
    the CPU), `cpu_group` (gloo) the host-side messages: each step's batch arrays, start-up agreements."""

    rank: int
    size: int
    group: object = None
    cpu_group: object = None
    local_rank: int = 0  # the GPU this rank uses on its host
    bytes_all_reduced: int = 0
    bytes_gathered: int = 0
    counts: dict = field(default_factory=lambda: {"all_reduce": 0, "gather": 0})

    @property
    def is_driver(self) -> bool:
        """Rank 0: the one that schedules, samples and talks to the engine."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        dist.all_reduce(x, group=self.group)
        self.bytes_all_reduced += x.numel() * x.element_size()
        self.counts["all_reduce"] += 1
        return x

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x on every rank, in place."""
        dist.broadcast(x, src=0, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0: the ranks' x side by side along the last dimension; other ranks: their own x."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.is_driver else None
        dist.gather(x, parts, dst=0, group=self.group)
        self.bytes_gathered += x.numel() * x.element_size() * (self.size - 1) if self.is_driver else 0
        self.counts["gather"] += 1
        return torch.cat(parts, dim=-1) if self.is_driver else x

    def broadcast_object(self, obj=None):
        """Rank 0's obj on every rank (over the CPU group): each step's batch, or None to stop."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def destroy(self) -> None:
        """Leave the group (so this process may build another tensor-parallel engine)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def min_over_ranks(self, value: int) -> int:
        """The smallest of the ranks' values (the KV pool's block count, which every rank must share)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())


def vocab_shard(vocab_size: int, rank: int, size: int) -> tuple[int, int, int]:
    """(first row, rows held, padded rows): equal shards of ceil(V / N) rows, the last one padded with zeros, so
    the gathered logits are N equal blocks (the padding's columns are cut off after the gather)."""
    per = -(-vocab_size // size)
    start = min(rank * per, vocab_size)
    return start, min(per, vocab_size - start), per


class _VocabRows(nn.Module):
    """This rank's rows [start, start + held) of a [vocabulary, hidden] weight, padded to an equal share."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.start, self.held, padded = vocab_shard(vocab_size, tp.rank, tp.size)
        self.weight = nn.Parameter(torch.empty(padded, hidden_size), requires_grad=False)


class VocabParallelEmbedding(_VocabRows):
    """The embedding rows [start, start + held) of the vocabulary (padded to `padded` rows); a token another rank
    holds looks up zeros here, so the all-reduce sums exactly one real row per token."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.held)
        hidden = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        hidden = hidden.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(hidden)

    def extra_repr(self) -> str:
        return (f"rows {self.start}..{self.start + self.held} of {self.vocab_size}, padded to {self.weight.shape[0]}, "
                f"hidden={self.weight.shape[1]}, rank {self.tp.rank} of {self.tp.size}")


class ParallelLMHead(_VocabRows):
    """This rank's vocabulary rows of the LM head: rank 0 gets the whole [rows, vocab] logits (gathered, in the
    model's dtype as unsharded), the others their own [rows, padded shard] block."""

    @property
    def logits_size(self) -> int:
        return self.vocab_size if self.tp.is_driver else self.weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.tp.gather_last_dim(nn.functional.linear(hidden, self.weight))
        return logits[..., :self.vocab_size] if self.tp.is_driver else logits

    def extra_repr(self) -> str:
        return (f"rows {self.start}..{self.start + self.held} of {self.vocab_size}, gathered to rank 0, "
                f"rank {self.tp.rank} of {self.tp.size}")
