"""Shared setup for the kernel tests: CPU runs go through Triton's interpreter; random paged batches."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit runs at import time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET") == "1":
    from triton.runtime import interpreter as _interpreter

    _patch_lang_tensor = _interpreter._patch_lang_tensor

    def _patch_lang_tensor_np24(tensor, scope):
        # The interpreter keeps scalars as 1-element arrays and turns them into loop bounds with int(array),
        # which numpy >= 2.4 refuses; take the element instead.
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interpreter._patch_lang_tensor = _patch_lang_tensor_np24

from tachyon.layers.attention import AttentionMetadata  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


# The interpreter mis-handles bf16, so bf16 only runs on a GPU.
@pytest.fixture(params=[
    torch.float32,
    torch.float16,
    pytest.param(torch.bfloat16, marks=[pytest.mark.gpu, pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")]),
], ids=lambda d: str(d).removeprefix("torch."))
def dtype(request) -> torch.dtype:
    return request.param


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; also fails on any non-finite output (outputs are poisoned with NaN first)."""
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), "output has non-finite values (unwritten poison?)"
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture
def rel_err():
    return _rel_err


@pytest.fixture
def make_batch():
    return _make_batch


def _make_batch(seqs: list[tuple[int, int]], num_q_heads: int, num_kv_heads: int, head_dim: int,
               dtype: torch.dtype, block_size: int = 16, num_padding: int = 0, seed: int = 0):
    """A packed batch over a randomly filled paged cache.

    seqs: (q_len, seq_len) per sequence, decodes (q_len 1) first. Block ids are shuffled, spare block-table
    entries point at live blocks of other sequences, and q/k/v are strided views of one fused qkv tensor.
    `num_padding` extra tokens at the end carry slot -1.
    """
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(sl + block_size - 1) // block_size for _, sl in seqs]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)
    block_tables = torch.randint(0, num_blocks, (len(seqs), max_blocks), generator=g, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        block_tables[i, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb

    slots, qsl = [], [0]
    for i, (ql, sl) in enumerate(seqs):
        for p in range(sl - ql, sl):
            slots.append(int(block_tables[i, p // block_size]) * block_size + p % block_size)
        qsl.append(qsl[-1] + ql)
    slots += [-1] * num_padding
    T = len(slots)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = randn(*cache_shape), randn(*cache_shape)
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    qkv = randn(T, q_size + 2 * kv_size)

    nd = 0  # the leading run of one-token sequences are the decodes
    while nd < len(seqs) and seqs[nd][0] == 1:
        nd += 1
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor([sl for _, sl in seqs], dtype=torch.int32),
        block_tables=block_tables,
        num_decodes=nd,
        max_query_len=max(ql for ql, _ in seqs),
        max_seq_len=max(sl for _, sl in seqs),
        query_lens_cpu=[ql for ql, _ in seqs],
        seq_lens_cpu=[sl for _, sl in seqs],
    )
    to = lambda t: t.to(DEVICE)
    meta.slot_mapping, meta.query_start_loc = to(meta.slot_mapping), to(meta.query_start_loc)
    meta.seq_lens, meta.block_tables = to(meta.seq_lens), to(meta.block_tables)
    qkv, k_cache, v_cache = to(qkv), to(k_cache), to(v_cache)
    q = qkv[:, :q_size].view(T, num_q_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(T, num_kv_heads, head_dim)
    v = qkv[:, q_size + kv_size:].view(T, num_kv_heads, head_dim)
    return q, k, v, k_cache, v_cache, meta
