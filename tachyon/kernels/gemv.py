"""Skinny GEMM (y = x @ W.T + b for a handful of rows): the decode step of a small batch.

With 1 to 64 tokens a linear layer only has to stream its weight once, so its time is the weight's bytes over
the memory bandwidth. cuBLAS picks GEMM tiles for these shapes that leave bandwidth unused; this kernel gives
each program a strip of BLOCK_N output features and walks K with wide, coalesced loads of W.

`tune_linears` times this kernel against `F.linear` on the model's own weights (all layers in turn, as a
decode step reads them, so nothing is served from L2) for each row count a CUDA graph is captured at, and
installs it only where it measures faster: a layer never gets slower than cuBLAS.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tachyon import envs
from tachyon.kernels import pdl
from tachyon.kernels.splits import sum_splits
from tachyon.kernels.timing import median_replay_ms

# (BLOCK_N, BLOCK_K, num_warps, num_stages): the candidates the tuner times on the device
CONFIGS = [(8, 512, 4, 4), (16, 256, 4, 4), (16, 512, 8, 3), (32, 256, 4, 4), (32, 128, 4, 6), (64, 128, 8, 4)]
# 2-64 rows, K split in SPLIT parts (a sixth entry; the fifth, late reduce, is a one-row option; timed by the tuner
# only with TACHYON_GEMV_SPLIT=1 until a GPU run has measured them: split_candidates_enabled): a layer with few
# output strips (o_proj's 4096 features in strips of 32 are 128 programs, under one per SM of a 132-SM card; qkv's
# 192 leave the second wave half empty) gets SPLIT times the programs, and a second kernel sums the fp32 partials
# in split order (deterministic). cuBLAS read o_proj/qkv at 2.5-3.2 of the H200's 4.24 TB/s at 2-16 rows
# (benchmarks/results/h200/session_20261207c) and at 2.0-2.5 of the H100's ~3.0 at 2-64 (h100/session_20261207f)
SPLIT_CONFIGS = [(16, 256, 4, 4, False, 2), (16, 256, 4, 4, False, 4), (32, 256, 4, 4, False, 2),
                 (32, 256, 4, 4, False, 4), (32, 128, 4, 6, False, 4), (64, 128, 8, 4, False, 2)]
# one-row candidates that keep a [BLOCK_N, BLOCK_K] fp32 accumulator and reduce it once at the end, instead of
# a cross-thread reduction every K step (a fifth entry, True, says so)
ONE_ROW_CONFIGS = [(8, 512, 4, 4, True), (4, 1024, 4, 4, True), (16, 256, 4, 4, True), (8, 1024, 8, 3, True)]
# the largest row count this kernel is considered for. 17-64 rows (a Poisson load's decode steps) were cuBLAS's
# alone until session 2026-12-07c, where cuBLAS read o_proj/qkv at 2.5-3.2 of the H200's 4.24 TB/s at 1-16 rows;
# the tuner installs the kernel there too only where it measures faster
MAX_ROWS = 64
MAX_X_TILE = 16384  # above 16 rows: BLOCK_K x the padded rows at most this (the x tile of every pipeline stage)


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, ONE_ROW: tl.constexpr, M_PAD: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LATE_REDUCE: tl.constexpr,
    PDL: tl.constexpr = False, K_SPLIT=0,
):
    """y[:, strip] = x @ W[strip].T (+ bias). With a K split (grid axis 1, K_SPLIT > 0: the K elements of each
    part, a multiple of BLOCK_K) program (n, s) writes the fp32 partial of K part s to y + s * M * N (y is then
    [split, M, N]; no bias: sum_splits adds it); only the several-rows path splits."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    if ONE_ROW:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if LATE_REDUCE:  # elementwise products kept per (n, k) lane, summed over k once after the loop
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            mask_k = kk < K
            w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            x = tl.load(x_ptr + kk, mask=mask_k, other=0.0)
            prod = w.to(tl.float32) * x.to(tl.float32)[None, :]
            if LATE_REDUCE:
                acc2 += prod
            else:
                acc += tl.sum(prod, axis=1)
        if LATE_REDUCE:
            acc = tl.sum(acc2, axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mask_n)
    else:
        offs_m = tl.arange(0, M_PAD)
        mask_m = offs_m < M
        acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
        k_start = 0
        k_end = K
        if K_SPLIT > 0:
            k_start = tl.program_id(1) * K_SPLIT
            k_end = tl.minimum(k_start + K_SPLIT, K)
            y_ptr += tl.program_id(1).to(tl.int64) * M * N
        for k0 in range(k_start, k_end, BLOCK_K):
            kk = k0 + offs_k
            mask_k = kk < K
            w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=mask_m[:, None] & mask_k[None, :],
                        other=0.0)
            if IEEE:  # fp32 weights: no tf32 rounding
                acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
            else:
                acc = tl.dot(w, tl.trans(x), acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
        y = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: tuple = (16, 256, 4, 4), out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS) @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype, accumulated in fp32.
    config: (BLOCK_N, BLOCK_K, num_warps, num_stages[, late_reduce[, split]]) (CONFIGS, ONE_ROW_CONFIGS,
    SPLIT_CONFIGS; a split applies from 2 rows)."""
    M, K = x.shape
    N = weight.shape[0]
    if M > MAX_ROWS:
        raise ValueError(f"gemv handles at most {MAX_ROWS} rows, got {M}: use F.linear")
    if weight.shape[1] != K:
        raise ValueError(f"x has {K} columns but the weight has {weight.shape[1]}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    y = out if out is not None else torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    block_n, block_k, warps, stages = config[:4]
    late = len(config) > 4 and bool(config[4]) and M == 1
    block_k = min(block_k, max(triton.next_power_of_2(K), 16))
    split, k_split = 1, 0
    if M > 1:
        block_n = max(block_n, 16)  # tl.dot's smallest tile
        if len(config) > 5 and config[5] > 1:
            k_split = triton.cdiv(triton.cdiv(K, block_k), config[5]) * block_k
            split = triton.cdiv(K, k_split)
    dst = y if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    _gemv_kernel[(triton.cdiv(N, block_n), split)](
        x, weight, bias if bias is not None else weight, dst,
        M, N, K, x.stride(0), weight.stride(0), dst.stride(-2),
        HAS_BIAS=bias is not None and split == 1, ONE_ROW=M == 1, M_PAD=m_pad(M), IEEE=x.dtype == torch.float32,
        BLOCK_N=block_n, BLOCK_K=block_k, LATE_REDUCE=late, num_warps=warps, num_stages=stages,
        K_SPLIT=k_split, **pdl.launch_args(),
    )
    if split > 1:
        sum_splits(dst, bias, y)
    return y


def m_pad(m: int) -> int:
    """The rows the tl.dot path computes for m rows: a power of two, at least tl.dot's 16."""
    return max(16, triton.next_power_of_2(m))


def row_bucket(m: int) -> int:
    """The tuned row count that covers m rows: 1, 2, 4, 8, 16, 32 or 64."""
    return 1 if m <= 1 else triton.next_power_of_2(m)


def split_candidates_enabled() -> bool:
    """TACHYON_GEMV_SPLIT=1: the tuner also times SPLIT_CONFIGS from 2 rows. Off by default until a GPU run has
    measured them against cuBLAS (each adds compiles to start-up): `benchmarks/gemv_tune_check.py` sets it."""
    return bool(envs.flag("TACHYON_GEMV_SPLIT"))


def candidates(m: int, split: bool | None = None) -> list[tuple]:
    """The configs the tuner times for a row bucket: above 16 rows, those whose x tile fits MAX_X_TILE; from 2
    rows, the K-split ones too where `split` (default: split_candidates_enabled())."""
    if m == 1:
        return CONFIGS + ONE_ROW_CONFIGS
    split = split_candidates_enabled() if split is None else split
    return [c for c in CONFIGS + (SPLIT_CONFIGS if split else []) if m <= 16 or c[1] * m_pad(m) <= MAX_X_TILE]


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2 and x.shape[0] <= MAX_ROWS:
        cfg = self.gemv_configs.get(row_bucket(x.shape[0]))
        if cfg is not None:
            return gemv(x, self.weight, self.bias, cfg)
    return F.linear(x, self.weight, self.bias)


def use_gemv(linear: torch.nn.Linear, configs: dict[int, tuple]) -> None:
    """Route this layer's calls with up to MAX_ROWS rows to `gemv` (per row bucket: config, absent = cuBLAS)."""
    linear.gemv_configs = dict(configs)
    linear.forward = types.MethodType(_forward, linear)


def _time_ms(fn, reps: int = 5) -> float:
    """GPU time of fn, captured in a CUDA graph: launching 32 small kernels from Python takes longer than
    running them, so timing eager launches would measure the host."""
    fn()  # compile, allocate workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    return median_replay_ms(graph, reps)


# how far a candidate's output may be from F.linear's on the same input (||diff|| / ||ref||) before it is refused
AGREE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def check_config(x: torch.Tensor, linear: torch.nn.Linear, cfg: tuple) -> str | None:
    """None if gemv with this config gives F.linear's result on x (within the dtype's rounding), else why not.
    The tuner runs it before timing a candidate, so a config that computes wrongly on this device (a compiler
    or hardware quirk no CPU test can see) is never installed."""
    ref = F.linear(x, linear.weight, linear.bias).float()
    out = gemv(x, linear.weight, linear.bias, cfg).float()
    err = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not err <= AGREE_TOL.get(x.dtype, 2e-2):  # also catches NaN
        return f"wrong result: relative error {err:.3g} against F.linear"
    return None


@torch.inference_mode()
def tune_linears(model: torch.nn.Module, row_counts: list[int]) -> dict:
    """Time cuBLAS and every config on the model's linear layers (grouped by shape, run over all layers of
    that shape in turn) for each row bucket; install the faster. Candidates that do not run on this device or do
    not give F.linear's result (`check_config`) are skipped. Returns {shape: {rows: (choice, ms...)}}, plus
    "failed_configs" naming any skipped candidate and why."""
    groups: dict[tuple, list[torch.nn.Linear]] = {}
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and mod.weight.is_cuda:
            key = (mod.out_features, mod.in_features, mod.bias is not None, mod.weight.dtype)
            groups.setdefault(key, []).append(mod)
    report = {}
    buckets = sorted({row_bucket(m) for m in row_counts if m <= MAX_ROWS})
    for (N, K, has_bias, dtype), mods in groups.items():
        chosen = {}
        rep = {}
        for m in buckets:
            x = torch.randn(m, K, dtype=dtype, device=mods[0].weight.device)

            def run_all(cfg, mods=mods, x=x):
                for mod in mods:
                    if cfg is None:
                        F.linear(x, mod.weight, mod.bias)
                    else:
                        gemv(x, mod.weight, mod.bias, cfg)

            base = _time_ms(lambda: run_all(None))
            best, best_ms = None, base
            for cfg in candidates(m):
                try:
                    why = check_config(x, mods[0], cfg)
                    if why is None:
                        ms = _time_ms(lambda cfg=cfg: run_all(cfg))
                except Exception as e:  # e.g. out of shared memory for this shape: not a candidate
                    why = f"{type(e).__name__}: {e}"[:200]
                if why is not None:
                    report.setdefault("failed_configs", {})[f"{N}x{K} rows {m} {cfg}"] = why
                    continue
                if ms < best_ms * 0.98:  # a clear win only
                    best, best_ms = cfg, ms
            if best is not None:
                chosen[m] = best
            gb = N * K * x.element_size() * len(mods) / 1e9
            rep[m] = {"cublas_ms": round(base, 4), "best_ms": round(best_ms, 4), "config": best,
                      "cublas_TBps": round(gb / base, 3), "best_TBps": round(gb / best_ms, 3)}
        for mod in mods:
            use_gemv(mod, chosen)
        report[f"{N}x{K}{'+bias' if has_bias else ''} x{len(mods)}"] = rep
    return report
