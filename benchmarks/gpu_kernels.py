"""Check and time the Triton kernels on one GPU (llama3-8b shapes: Hq=32, Hkv=8, D=128, block 16, bf16).

    PYTHONPATH=. python benchmarks/gpu_kernels.py --out $OUT/kernels.json

1. correctness: each kernel against its torch reference in bf16 (relative error ||out - ref|| / ||ref||),
   including a decode step captured in a CUDA graph and replayed with new context lengths;
2. timings (triton.testing.do_bench, median, L2 flushed between runs): decode attention at batch 1/16/64/256 x
   context 512/4096/32k, prefill attention 1x4096, 8x512 and 16x512 (beside torch's SDPA and varlen flash
   attention where this torch has it), fused ops at T = 1/256/8192 against torch;
   achieved GB/s counts the bytes each kernel must move (for attention: every K/V byte of the context);
3. small config sweeps for the attention kernels, so the defaults can be tuned from one run.
Only the torch references in tachyon/layers and AttentionMetadata are used besides the kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import triton
from triton.testing import do_bench

from tachyon.kernels import decode_attention as decode_mod
from tachyon.kernels import paged_attention as prefill_mod
from tachyon.kernels.decode_attention import decode_attention
from tachyon.kernels.fused_ops import fused_add_rms_norm, rotary, silu_and_mul
from tachyon.kernels.kv_write import write_kv
from tachyon.kernels.paged_attention import prefill_attention
from tachyon.layers.activation import silu_and_mul_ref
from tachyon.layers.attention import (
    AttentionMetadata,
    TorchAttentionBackend,
    paged_attention_ref,
    write_kv_ref,
)
from tachyon.layers.norm import RMSNorm
from tachyon.layers.rotary import RotaryEmbedding
from tachyon.layers.triton_backend import TritonAttentionBackend

HQ, HKV, D, BLOCK, HIDDEN, INTER = 32, 8, 128, 16, 4096, 14336
DT = torch.bfloat16
DEV = "cuda"
POOL_BLOCKS = 65536  # 2 x 4 GiB of bf16 K/V; larger contexts alias random blocks of this pool (far beyond L2)


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref).norm() / ref.norm()).item()


def bench_ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


_pool: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _caches(num_blocks, hkv, d, dtype, g, shared: bool):
    key = (num_blocks, hkv, d, dtype)
    if shared and key in _pool:
        return _pool[key]
    caches = tuple(torch.randn(num_blocks, BLOCK, hkv, d, device=DEV, dtype=dtype, generator=g) for _ in range(2))
    if shared:
        _pool[key] = caches
    return caches


def paged_batch(seqs, num_blocks=None, hq=None, hkv=None, d=None, seed=0):
    """(q_len, seq_len) per sequence, decodes first -> q, k, v (views of one qkv), caches, meta."""
    hq, hkv, d, dtype = hq or HQ, hkv or HKV, d or D, DT
    g = torch.Generator(device=DEV).manual_seed(seed)
    need = [math.ceil(sl / BLOCK) for _, sl in seqs]
    max_blocks = max(need)
    pooled = num_blocks is not None
    if not pooled:  # distinct shuffled blocks per sequence
        num_blocks = sum(need)
        perm = torch.randperm(num_blocks, device=DEV, generator=g)
        bt = torch.zeros(len(seqs), max_blocks, dtype=torch.int32, device=DEV)
        used = 0
        for i, n in enumerate(need):
            bt[i, :n] = perm[used:used + n].int()
            used += n
    else:  # random blocks of a fixed pool (aliasing allowed; only for timing)
        bt = torch.randint(0, num_blocks, (len(seqs), max_blocks), dtype=torch.int32, device=DEV, generator=g)
    qlens = torch.tensor([ql for ql, _ in seqs], device=DEV)
    slens = torch.tensor([sl for _, sl in seqs], device=DEV)
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32, device=DEV)
    qsl[1:] = qlens.cumsum(0)
    T = int(qlens.sum())
    seq_of_tok = torch.repeat_interleave(torch.arange(len(seqs), device=DEV), qlens)
    pos = torch.arange(T, device=DEV) - qsl[:-1].long()[seq_of_tok] + (slens - qlens)[seq_of_tok]
    slots = bt.long()[seq_of_tok, pos // BLOCK] * BLOCK + pos % BLOCK
    k_cache, v_cache = _caches(num_blocks, hkv, d, dtype, g, shared=pooled)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, device=DEV, dtype=dtype, generator=g)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    nd = 0
    while nd < len(seqs) and seqs[nd][0] == 1:
        nd += 1
    meta = AttentionMetadata(
        slot_mapping=slots, query_start_loc=qsl, seq_lens=slens.int(), block_tables=bt, num_decodes=nd,
        max_query_len=max(ql for ql, _ in seqs), max_seq_len=max(sl for _, sl in seqs),
        query_lens_cpu=[ql for ql, _ in seqs], seq_lens_cpu=[sl for _, sl in seqs])
    return q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d), k_cache, v_cache, meta


# ------------------------------------------------------------------------------------------- correctness


def check_correctness() -> dict:
    res = {}
    torch.manual_seed(0)
    mixed = [(1, 1), (1, 77), (1, 1000), (1, 4100), (37, 300), (128, 128), (200, 1500), (1, 9), (513, 513)]

    q, k, v, kc, vc, meta = paged_batch(mixed)
    kr, vr = kc.clone(), vc.clone()
    write_kv_ref(k, v, kr, vr, meta.slot_mapping)
    write_kv(k, v, kc, vc, meta.slot_mapping)
    res["write_kv_exact"] = bool(torch.equal(kc, kr) and torch.equal(vc, vr))

    for hq, hkv, d in [(32, 8, 128), (12, 4, 64), (8, 8, 128), (16, 4, 32)]:
        q, k, v, kc, vc, meta = paged_batch(mixed, hq=hq, hkv=hkv, d=d, seed=1)
        kr, vr = kc.clone(), vc.clone()
        out = TritonAttentionBackend().forward(q, k, v, kc, vc, meta, d ** -0.5)
        ref = TorchAttentionBackend().forward(q.float(), k.float(), v.float(), kr.float(), vr.float(), meta,
                                              d ** -0.5)
        res[f"backend_mixed_hq{hq}_hkv{hkv}_d{d}"] = rel_err(out, ref)
        out = prefill_attention(q, kc, vc, meta.block_tables, meta.query_start_loc, meta.seq_lens, d ** -0.5,
                                meta.max_query_len)
        res[f"prefill_all_seqs_hq{hq}_hkv{hkv}_d{d}"] = rel_err(out, ref)

    norm = RMSNorm(HIDDEN, 1e-5).to(DEV, DT)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN))
    x, r = torch.randn(300, HIDDEN, device=DEV, dtype=DT), torch.randn(300, HIDDEN, device=DEV, dtype=DT)
    out, new_r = fused_add_rms_norm(x, r, norm.weight, norm.eps)
    ref, ref_r = norm(x, r)
    res["rms_norm_add"] = rel_err(out, ref)
    res["rms_norm_residual"] = rel_err(new_r, ref_r)
    res["rms_norm_plain"] = rel_err(fused_add_rms_norm(x, None, norm.weight, norm.eps)[0], norm(x))
    xs = torch.randn(300, 2 * INTER, device=DEV, dtype=DT)
    res["silu_and_mul"] = rel_err(silu_and_mul(xs), silu_and_mul_ref(xs))
    rope = RotaryEmbedding(D, 131072, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    rope = rope.to(DEV)
    q, k, _, _, _, _ = paged_batch([(300, 300)], seed=3)
    positions = torch.randint(0, rope.cos_sin_cache.shape[0], (q.shape[0],), device=DEV)
    q_ref, k_ref = rope(positions, q, k)
    q_out, k_out = rotary(positions, q, k, rope.cos_sin_cache)
    res["rotary_q"], res["rotary_k"] = rel_err(q_out, q_ref), rel_err(k_out, k_ref)
    return res


def check_decode_cuda_graph() -> dict:
    """Decode captured in a CUDA graph with a 32k bound on context, replayed with other lengths."""
    res, scale = {}, D ** -0.5
    lens = [1, 17, 500, 4096, 9000, 32768, 3, 2048]
    q, _, _, kc, vc, meta = paged_batch([(1, n) for n in lens], seed=2)
    out = torch.empty(q.shape, dtype=DT, device=DEV)
    seq_lens = meta.seq_lens.clone()
    decode_attention(q, kc, vc, meta.block_tables, seq_lens, scale, 32768, out=out)  # compile, allocate scratch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, kc, vc, meta.block_tables, seq_lens, scale, 32768, out=out)
    for trial, new in enumerate([lens, [n // 3 + 1 for n in lens]]):
        seq_lens.copy_(torch.tensor(new, device=DEV))
        out.fill_(float("nan"))
        graph.replay()
        meta.seq_lens, meta.seq_lens_cpu = seq_lens.clone(), new
        meta.ref_cache.clear()  # the reference keeps a step's context slots: these lengths are another step's
        ref = paged_attention_ref(q.float(), kc.float(), vc.float(), meta, scale)
        res[f"decode_cuda_graph_replay{trial}"] = rel_err(out, ref)
    return res


# ------------------------------------------------------------------------------------------- timings


def kv_bytes(seq_lens) -> int:
    return 2 * sum(seq_lens) * HKV * D * DT.itemsize  # K and V


def time_decode(batch: int, ctx: int, num_splits: int | None = None) -> dict:
    q, _, _, kc, vc, meta = paged_batch([(1, ctx)] * batch, num_blocks=POOL_BLOCKS, seed=4)
    out = torch.empty(q.shape, dtype=DT, device=DEV)
    fn = lambda: decode_attention(q, kc, vc, meta.block_tables, meta.seq_lens, D ** -0.5, ctx, out=out,
                                  num_splits=num_splits)
    ms = bench_ms(fn)
    splits = num_splits or decode_mod.num_decode_splits(batch, HKV, ctx)
    nbytes = kv_bytes([ctx] * batch) + 2 * q.numel() * DT.itemsize
    return {"batch": batch, "ctx": ctx, "splits": splits, "ms": ms, "GBps": nbytes / ms / 1e6}


def time_prefill(num_seqs: int, q_len: int) -> dict:
    q, k, v, kc, vc, meta = paged_batch([(q_len, q_len)] * num_seqs, seed=5)
    write_kv(k, v, kc, vc, meta.slot_mapping)
    out = torch.empty(q.shape, dtype=DT, device=DEV)
    fn = lambda: prefill_attention(q, kc, vc, meta.block_tables, meta.query_start_loc, meta.seq_lens, D ** -0.5,
                                   meta.max_query_len, out=out)
    ms = bench_ms(fn)
    flops = 4 * num_seqs * (q_len * (q_len + 1) // 2) * HQ * D  # causal: QK^T and PV over the lower triangle
    # dense SDPA (flash) on contiguous [S, H, L, D] as a yardstick
    qd = torch.randn(num_seqs, HQ, q_len, D, device=DEV, dtype=DT)
    kd = torch.randn(num_seqs, HQ, q_len, D, device=DEV, dtype=DT)  # kv heads expanded: flash takes no GQA
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, kd, is_causal=True)
    sdpa_ms = bench_ms(sdpa)
    return {"seqs": num_seqs, "q_len": q_len, "ms": ms, "TFLOPs": flops / ms / 1e9, "sdpa_ms": sdpa_ms,
            "GBps": (kv_bytes([q_len] * num_seqs) + 2 * q.numel() * DT.itemsize) / ms / 1e6,
            **time_varlen(q, k, v, meta.query_start_loc, q_len, out), **time_packed_sdpa(q, k, v, num_seqs, q_len, out)}


def time_packed_sdpa(q, k, v, num_seqs: int, q_len: int, ours: torch.Tensor) -> dict:
    """What an SDPA path for a step of fresh, equal-length prompts would pay: the packed [T, H, D] projections viewed
    as [S, H, L, D] (no copy), GQA by SDPA itself (`enable_gqa`), causal, and the output written back into the
    packed [T, Hq, D] buffer; with its relative difference from ours. The dense `sdpa_ms` above has contiguous
    inputs with the kv heads expanded, which a real step would have to make first."""
    try:
        def view(t):
            return t.view(num_seqs, q_len, t.shape[1], D).transpose(1, 2)

        out = torch.empty_like(q)
        out4 = out.view(num_seqs, q_len, HQ, D)

        def fn():
            o = torch.nn.functional.scaled_dot_product_attention(view(q), view(k), view(v), is_causal=True,
                                                                 scale=D ** -0.5, enable_gqa=True)
            out4.copy_(o.transpose(1, 2))

        fn()
        return {"packed_sdpa_ms": bench_ms(fn),
                "packed_sdpa_rel_diff": ((out.float() - ours.float()).norm() / ours.float().norm()).item()}
    except Exception as e:  # no enable_gqa in this torch, or no kernel for these strides
        return {"packed_sdpa_error": f"{type(e).__name__}: {e}"[:300]}


def time_varlen(q, k, v, cu_seqlens, max_len: int, ours: torch.Tensor) -> dict:
    """torch's own varlen flash attention (torch.nn.attention.varlen, where this torch has it) on the same packed
    fresh prompts, causal, K/V straight from the projections (the case of a prompt with nothing cached): a
    yardstick for prefill_attention, with its relative difference from ours. Its keyword for causal masking and
    GQA changed between torch releases: read from its signature."""
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        kw = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:  # expand the kv heads
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        k, v = k.contiguous(), v.contiguous()
        cu = cu_seqlens.to(torch.int32)
        fn = lambda: varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=D ** -0.5, **kw)  # noqa: E731
        got = fn()
        got = got[0] if isinstance(got, tuple) else got
        return {"varlen_ms": bench_ms(fn), "varlen_kwargs": sorted(kw),
                "varlen_rel_diff": ((got.float() - ours.float()).norm() / ours.float().norm()).item()}
    except Exception as e:  # no varlen attention in this torch, or not for this dtype / card
        return {"varlen_error": f"{type(e).__name__}: {e}"[:300]}


def time_fused(T: int) -> list[dict]:
    rows = []
    norm = RMSNorm(HIDDEN, 1e-5).to(DEV, DT)
    x, r = torch.randn(T, HIDDEN, device=DEV, dtype=DT), torch.randn(T, HIDDEN, device=DEV, dtype=DT)
    nbytes = 5 * T * HIDDEN * DT.itemsize  # read x, residual; write out, new residual; (+ weight, cached)
    for name, fn in [("add_rms_norm", lambda: fused_add_rms_norm(x, r, norm.weight, norm.eps)),
                     ("add_rms_norm_torch", lambda: norm(x, r))]:
        ms = bench_ms(fn)
        rows.append({"op": name, "T": T, "ms": ms, "GBps": nbytes / ms / 1e6})
    xs = torch.randn(T, 2 * INTER, device=DEV, dtype=DT)
    nbytes = 3 * T * INTER * DT.itemsize
    for name, fn in [("silu_and_mul", lambda: silu_and_mul(xs)), ("silu_and_mul_torch", lambda: silu_and_mul_ref(xs))]:
        ms = bench_ms(fn)
        rows.append({"op": name, "T": T, "ms": ms, "GBps": nbytes / ms / 1e6})
    rope = RotaryEmbedding(D, 8192, 500000.0, None).to(DEV)
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, device=DEV, dtype=DT)
    q = qkv[:, :HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D:(HQ + HKV) * D].view(T, HKV, D)
    pos = torch.randint(0, rope.cos_sin_cache.shape[0], (T,), device=DEV)
    nbytes = 2 * T * (HQ + HKV) * D * DT.itemsize + T * D * 4
    for name, fn in [("rotary", lambda: rotary(pos, q, k, rope.cos_sin_cache)),
                     ("rotary_torch", lambda: rope.forward(pos, q, k))]:
        ms = bench_ms(fn)
        rows.append({"op": name, "T": T, "ms": ms, "GBps": nbytes / ms / 1e6})
    return rows


def sweep_configs(deadline: float) -> dict:
    """Time a few tile configs and split counts; the defaults live in _split_config / _tile_config."""
    out = {"decode": [], "decode_splits": [], "prefill": []}
    default_split, default_tile = decode_mod._split_config, prefill_mod._tile_config
    try:
        for cfg in [(64, 4, 2), (32, 4, 3), (64, 4, 3), (128, 8, 2), (32, 2, 2), (16, 4, 4)]:
            decode_mod._split_config = lambda dtype, cfg=cfg: cfg
            for batch, ctx in [(1, 32768), (64, 4096), (256, 4096)]:
                if time.time() > deadline:
                    return out
                out["decode"].append({"block_n,warps,stages": cfg, **time_decode(batch, ctx)})
        decode_mod._split_config = default_split
        for batch, ctx in [(1, 32768), (16, 32768), (16, 4096)]:
            for splits in [8, 16, 32, 64, 128]:
                if time.time() > deadline:
                    return out
                out["decode_splits"].append(time_decode(batch, ctx, num_splits=splits))
        for cfg in [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3)]:
            prefill_mod._tile_config = lambda dtype, d, cfg=cfg: cfg
            for n, ql in [(1, 4096), (8, 512), (16, 512)]:  # 16 x 512: the c16 serve load's first burst
                if time.time() > deadline:
                    return out
                out["prefill"].append({"block_m,block_n,warps,stages": cfg, **time_prefill(n, ql)})
    finally:
        decode_mod._split_config, prefill_mod._tile_config = default_split, default_tile
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kernels.json")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop the sweeps after this much wall time")
    args = ap.parse_args()
    t0 = time.time()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}

    report["rel_err_bf16"] = {**check_correctness(), **check_decode_cuda_graph()}
    print("correctness (rel err, bf16):")
    for name, err in report["rel_err_bf16"].items():
        print(f"  {name:40s} {err}")

    report["decode"] = [time_decode(b, c) for c in (512, 4096, 32768) for b in (1, 16, 64, 256)]
    report["prefill"] = [time_prefill(1, 4096), time_prefill(8, 512), time_prefill(16, 512)]
    report["fused"] = [row for T in (1, 256, 8192) for row in time_fused(T)]
    report["sweeps"] = sweep_configs(deadline=t0 + args.budget_s)
    report["wall_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    print("\nsweeps (best first):")
    for key, rows in report["sweeps"].items():
        for row in sorted(rows, key=lambda r: r["ms"])[:6]:
            print(f"  {key:14s} {json.dumps(row)}")
    print(f"\n{'decode attention':22s} {'batch':>6s} {'ctx':>6s} {'splits':>6s} {'us':>9s} {'GB/s':>8s}")
    for r in report["decode"]:
        print(f"{'':22s} {r['batch']:6d} {r['ctx']:6d} {r['splits']:6d} {r['ms'] * 1e3:9.1f} {r['GBps']:8.0f}")
    print(f"\n{'prefill attention':22s} {'seqs':>6s} {'q_len':>6s} {'us':>9s} {'TFLOP/s':>8s} {'sdpa us':>9s} "
          f"{'varlen us':>9s} {'packed sdpa us':>14s}")
    for r in report["prefill"]:
        varlen = f"{r['varlen_ms'] * 1e3:9.1f}" if "varlen_ms" in r else r.get("varlen_error", "")[:60]
        packed = (f"{r['packed_sdpa_ms'] * 1e3:14.1f}" if "packed_sdpa_ms" in r
                  else r.get("packed_sdpa_error", "")[:60])
        print(f"{'':22s} {r['seqs']:6d} {r['q_len']:6d} {r['ms'] * 1e3:9.1f} {r['TFLOPs']:8.1f} "
              f"{r['sdpa_ms'] * 1e3:9.1f} {varlen} {packed}")
    print(f"\n{'fused op':22s} {'T':>6s} {'us':>9s} {'GB/s':>8s}")
    for r in report["fused"]:
        print(f"{r['op']:22s} {r['T']:6d} {r['ms'] * 1e3:9.1f} {r['GBps']:8.0f}")
    errs = [e for e in report["rel_err_bf16"].values() if isinstance(e, float)]
    worst = max(math.inf if math.isnan(e) else e for e in errs)
    print(f"\nworst bf16 rel err {worst:.2e}; exact write_kv: {report['rel_err_bf16']['write_kv_exact']}; "
          f"wall {report['wall_s']:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
