"""Decode (split-K), prefill/extend and the backend that combines them, against `paged_attention_ref`."""

import pytest
import torch

from tachyon.kernels.decode_attention import decode_attention
from tachyon.kernels.paged_attention import prefill_attention
from tachyon.layers.attention import get_attention_backend, paged_attention_ref, write_kv_ref
from tachyon.layers.triton_backend import TritonAttentionBackend

# 16-bit kernels round P to the input dtype before P @ V; the reference runs in fp32 on the same inputs
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
GQA = [(2, 2), (6, 2), (8, 2)]  # (Hq, Hkv): ratios 1, 3, 4

# decodes first; then a chunk over a cached prefix (a prefix-cache hit), a later chunk, fresh prefills
MIXED = [(1, 1), (1, 17), (1, 70), (9, 41), (16, 16), (5, 5), (33, 100), (1, 30)]


def _reference(q, k_cache, v_cache, meta, scale):
    return paged_attention_ref(q.float(), k_cache.float(), v_cache.float(), meta, scale)


def _poisoned_like(q):
    return torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)


@pytest.mark.parametrize("num_q_heads,num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_decode_attention(make_batch, rel_err, dtype, num_q_heads, num_kv_heads, head_dim):
    seqs = [(1, n) for n in (1, 16, 17, 45, 130)]
    q, _, _, k_cache, v_cache, meta = make_batch(seqs, num_q_heads, num_kv_heads, head_dim, dtype)
    scale = head_dim ** -0.5
    out = _poisoned_like(q)
    decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, meta.max_seq_len, out=out)
    assert rel_err(out, _reference(q, k_cache, v_cache, meta, scale)) <= TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 3, 8, 32])  # 32: most splits past every context, exit early
def test_decode_attention_splits(make_batch, rel_err, num_splits):
    seqs = [(1, n) for n in (1, 2, 63, 64, 65, 300)]
    q, _, _, k_cache, v_cache, meta = make_batch(seqs, 8, 2, 64, torch.float32, seed=num_splits)
    out = _poisoned_like(q)
    decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, 0.125, meta.max_seq_len, out=out,
                     num_splits=num_splits)
    assert rel_err(out, _reference(q, k_cache, v_cache, meta, 0.125)) <= TOL[torch.float32]


@pytest.mark.parametrize("num_splits,min_chunk", [(4, 16), (8, 32), (4, 64), (8, 300)])
def test_decode_attention_min_chunk(make_batch, rel_err, num_splits, min_chunk):
    # contexts up to the floor take one split (which writes the output; stage 2 skips it), longer ones fewer
    # splits than num_splits; a padding entry (seq_len 0) still comes out 0
    seqs = [(1, n) for n in (1, 2, 16, 17, 40, 63, 64, 65, 300, 5)]
    q, _, _, k_cache, v_cache, meta = make_batch(seqs, 8, 2, 64, torch.float32, seed=min_chunk)
    seq_lens = meta.seq_lens.clone()
    seq_lens[-1] = 0
    out = _poisoned_like(q)
    decode_attention(q, k_cache, v_cache, meta.block_tables, seq_lens, 0.125, 320, out=out, num_splits=num_splits,
                     min_chunk=min_chunk)
    ref = _reference(q, k_cache, v_cache, meta, 0.125)
    assert rel_err(out[:-1], ref[:-1]) <= TOL[torch.float32]
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.parametrize("num_splits,min_chunk", [(3, 0), (8, 0), (32, 0), (8, 32)])
def test_decode_attention_merges_its_splits_in_stage_one(make_batch, rel_err, num_splits, min_chunk):
    # merge: the last split of each (sequence, kv head) merges them (a ticket counter), no stage 2; a padding
    # entry comes out 0; the counters are back at 0 for the next call (a graph replays the same buffer)
    from tachyon.kernels.splits import device_counters

    seqs = [(1, n) for n in (1, 2, 17, 63, 64, 65, 300, 5)]
    q, _, _, k_cache, v_cache, meta = make_batch(seqs, 8, 2, 64, torch.float32, seed=num_splits + min_chunk)
    seq_lens = meta.seq_lens.clone()
    seq_lens[-1] = 0
    ref = _reference(q, k_cache, v_cache, meta, 0.125)
    for _ in range(2):
        out = _poisoned_like(q)
        decode_attention(q, k_cache, v_cache, meta.block_tables, seq_lens, 0.125, 320, out=out,
                         num_splits=num_splits, min_chunk=min_chunk, merge=True)
        assert rel_err(out[:-1], ref[:-1]) <= TOL[torch.float32]
        assert torch.equal(out[-1], torch.zeros_like(out[-1]))
        assert not device_counters(q.device).any()


@pytest.mark.parametrize("num_splits", [None, 1])  # 1: stage 1 writes the output itself
def test_decode_attention_padding_entries(make_batch, rel_err, num_splits):
    # a CUDA-graph batch padded with seq_len 0 entries: those rows come out 0, the others are unaffected
    q, _, _, k_cache, v_cache, meta = make_batch([(1, 40), (1, 1), (1, 1), (1, 7)], 4, 2, 32, torch.float32)
    seq_lens = meta.seq_lens.clone()
    seq_lens[1:3] = 0
    out = _poisoned_like(q)
    decode_attention(q, k_cache, v_cache, meta.block_tables, seq_lens, 0.3, 4096, out=out, num_splits=num_splits)
    assert torch.equal(out[1:3], torch.zeros_like(out[1:3]))
    ref = _reference(q, k_cache, v_cache, meta, 0.3)
    assert rel_err(out[[0, 3]], ref[[0, 3]]) <= TOL[torch.float32]


@pytest.mark.parametrize("num_q_heads,num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_prefill_attention_all_sequences(make_batch, rel_err, dtype, num_q_heads, num_kv_heads, head_dim):
    # the prefill kernel must also be right for decodes when it is handed the whole batch
    q, k, v, k_cache, v_cache, meta = make_batch(MIXED, num_q_heads, num_kv_heads, head_dim, dtype)
    write_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping)
    scale = head_dim ** -0.5
    out = _poisoned_like(q)
    prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale,
                      meta.max_query_len, out=out)
    assert rel_err(out, _reference(q, k_cache, v_cache, meta, scale)) <= TOL[dtype]


def test_prefill_attention_long_prompt(make_batch, rel_err):
    # several q tiles and several unmasked key tiles per program, block tables of shuffled ids
    q, k, v, k_cache, v_cache, meta = make_batch([(150, 150), (70, 300)], 4, 1, 32, torch.float16, seed=3)
    write_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping)
    out = _poisoned_like(q)
    prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.2,
                      meta.max_query_len, out=out)
    assert rel_err(out, _reference(q, k_cache, v_cache, meta, 0.2)) <= TOL[torch.float16]


@pytest.mark.parametrize("num_q_heads,num_kv_heads", GQA)
@pytest.mark.parametrize("seqs", [MIXED, [(1, 5), (1, 33)], [(12, 12), (4, 20)]], ids=["mixed", "decode", "prefill"])
def test_backend_matches_torch_backend(make_batch, rel_err, dtype, num_q_heads, num_kv_heads, seqs):
    head_dim = 64
    q, k, v, k_cache, v_cache, meta = make_batch(seqs, num_q_heads, num_kv_heads, head_dim, dtype, num_padding=2)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    scale = head_dim ** -0.5
    out = get_attention_backend("triton").forward(q, k, v, k_cache, v_cache, meta, scale)
    ref = get_attention_backend("torch").forward(q.float(), k.float(), v.float(), k_ref, v_ref, meta, scale)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    n = sum(meta.query_lens_cpu)  # the padding rows carry no sequence
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out[:n], ref[:n]) <= TOL[dtype]


def test_backend_name():
    assert TritonAttentionBackend.name == "triton"


def test_decode_attention_sweep_runs_end_to_end(tmp_path, monkeypatch):
    # benchmarks/decode_attention_sweep.py on tiny shapes (the GPU run has one shot at it): every variant it
    # times agrees with one split, and the JSON says which was fastest
    import json
    import sys

    from benchmarks import decode_attention_sweep

    out = tmp_path / "sweep.json"
    monkeypatch.setattr(sys, "argv", ["decode_attention_sweep.py", "--smoke", "--out", str(out)])
    decode_attention_sweep.main()
    (row,) = json.loads(out.read_text())["rows"]
    assert row["max_err"] < 1e-5 and row["best"] in row["us"]
    gs = row["graph_splits"]  # 16 for 2 sequences under a 4,096-token bound
    assert {f"graph s{gs}", "s1", "s2", "s8", f"graph s{gs} min256", f"graph s{gs} cfg(32, 4, 3)",
            f"graph s{gs} merge", f"graph s{gs} min512 merge"} <= set(row["us"])


def _sweep_row(splits: int, base: float, **variants: float) -> dict:
    us = {f"graph s{splits}": base}
    us.update({f"graph s{splits} {k.replace('_', ' ')}": v for k, v in variants.items()})
    return {"graph_splits": splits, "us": us}


def test_decode_sweep_pick_and_table(tmp_path):
    # the pick decode_attention then reads: the variant with the lowest geometric-mean time, unless it is under 2%
    # better or some row is over 5% slower; rows that do not split (one split: no variant) do not vote
    import json

    from benchmarks.decode_attention_sweep import pick_defaults, write_tuned

    names = ("merge", "min256", "min256_merge", "min512", "min512_merge", "min1024")
    flat = dict.fromkeys(names, 100.0)
    rows = [_sweep_row(4, 100.0, **{**flat, "min512_merge": 80.0, "merge": 90.0}),
            _sweep_row(8, 50.0, **{**dict.fromkeys(names, 50.0), "min512_merge": 45.0, "merge": 47.0}),
            {"graph_splits": 1, "us": {"graph s1": 10.0}}]
    for r in rows:
        r["max_err"] = 4e-3
    pick = pick_defaults(rows)
    assert (pick["min_chunk"], pick["merge"], pick["rows"]) == (512, True, 2)
    rows[2]["max_err"] = 0.5  # a variant that is wrong somewhere: none is trusted
    assert (pick_defaults(rows)["min_chunk"], pick_defaults(rows)["merge"]) == (0, False)
    rows[2]["max_err"] = 4e-3
    rows[1]["us"]["graph s8 min512 merge"] = 53.0  # 6% slower on one row: the next best (merge alone) wins
    assert (pick_defaults(rows)["min_chunk"], pick_defaults(rows)["merge"]) == (0, True)
    for r in rows[:2]:  # nothing 2% better: the unmodified kernel
        base = f"graph s{r['graph_splits']}"
        r["us"] = {k: v if k == base else r["us"][base] * 0.99 for k, v in r["us"].items()}
    assert (pick_defaults(rows)["min_chunk"], pick_defaults(rows)["merge"]) == (0, False)

    table = tmp_path / "GPU.json"
    table.write_text(json.dumps({"device": "GPU", "configs": {"awq": {"skinny": {"1x2g128": [1, 2]}}}}))
    write_tuned(str(table), {"device": "GPU", "rows": rows, "wall_s": 1.0, "torch": "t", "triton": "tr",
                             "pick": {**pick, "scores": {}}})
    configs = json.loads(table.read_text())["configs"]
    assert configs["awq"] == {"skinny": {"1x2g128": [1, 2]}}  # other formats stay
    assert configs["decode_attention"] == {"all": {"8x128": [512, True]}}


def test_decode_defaults_read_the_gpu_table(monkeypatch):
    # decode_attention's min_chunk/merge default to this GPU's measured pick for the head shape, else the constants
    from tachyon.kernels import quant_linear
    from tachyon.kernels.decode_attention import DECODE_FUSED_MERGE, DECODE_MIN_CHUNK, decode_defaults

    table = {("decode_attention", "all", "8x128"): (512, True)}
    monkeypatch.setattr(quant_linear, "tuned_entry", lambda dev, fmt, bucket, key: table.get((fmt, bucket, key)))
    decode_defaults.cache_clear()  # earlier calls cached the real table's answer; this one's must not outlive it
    try:
        assert decode_defaults(torch.device("cpu"), 8, 128) == (512, True)
        assert decode_defaults(torch.device("cpu"), 4, 128) == (DECODE_MIN_CHUNK, DECODE_FUSED_MERGE)
    finally:
        decode_defaults.cache_clear()


def test_decode_split_policy():
    # what the H100 sweep measured fastest (benchmarks/results/h100/session_20261207c/decode_sweep.json), under a
    # decode graph's 4,096-token bound with llama3-8b's 8 kv heads: 16 splits for 1-4 sequences, 4 at 16, one (no
    # stage 2) from 32 up; a short bound caps the splits at its 256-token shares
    from tachyon.kernels.decode_attention import num_decode_splits

    assert [num_decode_splits(b, 8, 4096) for b in (1, 4, 8, 16, 24, 32, 48, 256)] == [16, 16, 8, 4, 2, 1, 1, 1]
    assert num_decode_splits(4, 8, 640) == 4 and num_decode_splits(1, 8, 64) == 1
    assert num_decode_splits(8, 1, 4096) == 16  # one kv head a rank (tensor parallelism): more splits
