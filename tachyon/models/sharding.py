"""Which slice of the Llama family rank r of N holds under tensor parallelism, and how a checkpoint tensor is cut
to it while it is read (a safetensors slice reads only those bytes, so no rank holds the whole model).

Attention is split by KV groups, so every rank runs plain GQA over whole groups:

    N <= num_kv_heads: the KV heads are split as evenly as they go, each rank taking its KV heads' query heads
                       SmolLM2-135M (9 query, 3 KV heads) on 2 ranks:  rank 0: KV 0      q 0-2
                                                                        rank 1: KV 1-2    q 3-8
    N >  num_kv_heads: every KV head is replicated on N / num_kv_heads ranks, which split its query heads
                       (N must be a multiple of num_kv_heads, and the query heads per KV head of N / num_kv_heads)
                       4 query, 1 KV head on 2 ranks:  rank 0: KV 0  q 0-1;  rank 1: KV 0  q 2-3

Uneven splits cost balance, not exactness. The MLP's intermediate features split evenly (in whole quantization
groups for AWQ), the vocabulary in equal padded shards (tachyon.layers.parallel.vocab_shard).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tachyon.config import ModelConfig
from tachyon.layers.linear import shard_dims
from tachyon.layers.parallel import vocab_shard

_COLUMN = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "gate_proj": "i", "up_proj": "i"}
_ROW = {"o_proj": "q", "down_proj": "i"}


@dataclass(frozen=True)
class ShardPlan:
    rank: int
    size: int
    q_heads: tuple[int, int]  # [first, end) of the query heads this rank holds
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    head_dim: int
    vocab_size: int

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The model this rank builds: its heads and intermediate features (vocabulary and hidden size whole)."""
        (q0, q1), (k0, k1), (i0, i1) = self.q_heads, self.kv_heads, self.intermediate
        return dataclasses.replace(cfg, num_heads=q1 - q0, num_kv_heads=k1 - k0, intermediate_size=i1 - i0)

    def _features(self, what: str) -> tuple[int, int]:
        """[start, end) of this rank's features of the checkpoint's q, k/v or intermediate dimension."""
        if what == "i":
            return self.intermediate
        a, b = self.q_heads if what == "q" else self.kv_heads
        return a * self.head_dim, b * self.head_dim

    def read(self, name: str, src, cfg: ModelConfig, int8_whole_rows: bool = False) -> torch.Tensor:
        """This rank's part of checkpoint tensor `name` (HF name without `model.`), read from `src` (a tensor or a
        safetensors slice). `int8_whole_rows`: a dense checkpoint quantized to int8 while loading reads a
        row-parallel weight whole, so each output feature's scale is its whole row's, as unsharded."""
        module, _, kind = name.rpartition(".")
        proj = module.rpartition(".")[2]
        quant = cfg.quantization
        fmt = quant.checkpoint_format if quant is not None else "dense"
        group = quant.group_size if quant is not None and quant.method == "awq" else 1
        if proj in ("embed_tokens", "lm_head"):
            start, held, padded = vocab_shard(self.vocab_size, self.rank, self.size)
            part = _take(src, 0, start, start + held)
            return torch.cat([part, part.new_zeros(padded - held, *part.shape[1:])]) if padded > held else part
        if proj not in _COLUMN and proj not in _ROW:
            return _take(src)  # norms: every rank holds them whole
        column = proj in _COLUMN
        a, b = self._features(_COLUMN[proj] if column else _ROW[proj])
        if kind == "weight_shape":  # compressed-tensors: the shape of the part this rank holds
            n, k = (int(v) for v in _take(src).reshape(-1))
            return torch.tensor([b - a, k] if column else [n, b - a], dtype=torch.int64)
        out_dim, out_div, in_dim, in_div = shard_dims(fmt, kind, group)
        dim, div = (out_dim, out_div) if column else (in_dim, in_div)
        if dim is None:  # a row-parallel layer's per-output-feature tensors (scales, bias): whole
            if kind == "bias":
                raise ValueError(f"checkpoint tensor {name}: a bias on a row-parallel projection is not supported "
                                 f"with tensor parallelism")
            return _take(src)
        if not column and int8_whole_rows and kind == "weight":
            return _take(src)
        if a % div or b % div:
            raise ValueError(f"checkpoint tensor {name}: rank {self.rank}'s features {a}..{b} do not fall on its "
                             f"{div}-feature packing: choose a tensor_parallel_size that splits them evenly")
        return _take(src, dim, a // div, b // div)


def _take(src, dim: int | None = None, start: int = 0, stop: int = 0) -> torch.Tensor:
    if dim is None:
        return src if isinstance(src, torch.Tensor) else src[:]
    return src[(slice(None),) * dim + (slice(start, stop),)]


def plan_shards(cfg: ModelConfig, rank: int, size: int) -> ShardPlan:
    """Rank `rank`'s slice of `cfg` on `size` ranks; a ValueError that says which sizes work if none fits."""
    heads, kv = cfg.num_heads, cfg.num_kv_heads
    group = heads // kv
    if size <= kv:
        k0, k1 = kv * rank // size, kv * (rank + 1) // size
        q = (k0 * group, k1 * group)
    else:
        replicas = size // kv
        if size % kv or group % replicas:
            ok = [n for n in range(1, 2 * heads + 1) if n <= kv or (n % kv == 0 and group % (n // kv) == 0)]
            raise ValueError(f"tensor_parallel_size={size} does not fit {heads} query heads over {kv} KV heads: "
                             f"above {kv} it must be a multiple of the KV heads that splits each KV head's {group} "
                             f"query heads evenly; sizes that work: {ok}")
        k0 = rank // replicas
        k1 = k0 + 1
        per = group // replicas
        q0 = k0 * group + (rank % replicas) * per
        q = (q0, q0 + per)
    quant = cfg.quantization
    align = quant.group_size if quant is not None and quant.method == "awq" else 1
    units = cfg.intermediate_size // align
    if units < size:
        raise ValueError(f"tensor_parallel_size={size}: the MLP's {cfg.intermediate_size} intermediate features "
                         f"do not split into {size} parts of whole {align}-feature groups")
    inter = (units * rank // size * align, units * (rank + 1) // size * align)
    if rank == size - 1:
        inter = (inter[0], cfg.intermediate_size)
    if align > 1 and (q[1] - q[0]) * cfg.head_dim % align:
        raise ValueError(f"tensor_parallel_size={size}: rank {rank}'s {q[1] - q[0]} query heads of {cfg.head_dim} "
                         f"are not a whole number of AWQ groups of {align} input features of o_proj: choose a "
                         f"size that gives every rank a multiple of {align} features")
    return ShardPlan(rank, size, q, (k0, k1), inter, cfg.head_dim, cfg.vocab_size)
