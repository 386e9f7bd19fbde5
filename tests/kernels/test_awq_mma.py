"""The INT4 tensor-core kernels and the K-major walk (tachyon/kernels/awq_mma.py) against the natural layout's
reference: the packing, every group-size case of their zero/scale epilogue, K splits, bias, rows below and above a
tile, the dispatch from awq_linear and the tuned tables' entries."""

import pytest
import torch

from tachyon.kernels.awq_mma import (
    DIRECT_CONFIGS,
    DIRECT_DEFAULT,
    MMA_CONFIGS,
    MMA_MAX_ROWS,
    NATURAL_CONFIGS,
    WALK_CONFIGS,
    WALK_MAX_ROWS,
    awq_mma_linear,
    awq_mma_natural,
    default_mma_config,
    dequantize_kmajor,
    dequantize_kmajor_ref,
    pack_int4_kmajor,
    unpack_int4_kmajor,
)
from tachyon.kernels.quant_ref import awq_kmajor_ref, awq_linear_ref, pack_int4, unpack_int4

TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}


@pytest.fixture(params=[
    torch.float16,
    pytest.param(torch.bfloat16, marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                          reason="needs CUDA")]),
], ids=lambda d: str(d).removeprefix("torch."))
def half(request) -> torch.dtype:
    return request.param


def test_kmajor_word_holds_eight_rows_sixteen_apart(device):
    k, n = 256, 16
    q = torch.randint(0, 16, (k, n), device=device)
    q[:, 3] = 15  # a column of all-ones nibbles: its words are -1 (the sign bit set)
    packed = pack_int4_kmajor(pack_int4(q))
    assert packed.shape == (k // 8, n) and packed.dtype == torch.int32
    # word [16 t + i, n], nibble j = q[128 t + 16 j + i, n]: checked one word the slow way
    t, i, col = 1, 5, 9
    word = int(packed[16 * t + i, col]) & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == [int(q[128 * t + 16 * j + i, col]) for j in range(8)]
    assert (packed[:, 3] == -1).all()
    assert torch.equal(unpack_int4_kmajor(packed), q.to(torch.int32))
    assert torch.equal(unpack_int4(pack_int4(q)), unpack_int4_kmajor(packed))


def test_kmajor_rejects_k_not_a_multiple_of_128():
    with pytest.raises(ValueError, match="multiple of 128"):
        pack_int4_kmajor(torch.zeros(64, 2, dtype=torch.int32))
    with pytest.raises(TypeError):
        pack_int4_kmajor(torch.zeros(128, 2, dtype=torch.int64))


def _case(k, n, g, m, dtype, device, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen)
    z = torch.randint(0, 16, (k // g, n), generator=gen)
    z[0, :2] = torch.tensor([0, 15])
    q[:, 0] = 15  # a column at the top of the range (with a zero of 0: the largest |q - z|)
    s = (torch.randn(k // g, n, generator=gen) * 0.02).to(device=device, dtype=dtype)
    x = torch.randn(m, k + 8, generator=gen).to(device=device, dtype=dtype)[:, :k]  # rows 8 apart: strided
    b = torch.randn(n, generator=gen).to(device=device, dtype=dtype) if bias else None
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    return x, qw, qz, s, b


def _kmajor(x, qw, qz, s, g, b=None, config=None, out=None):
    return awq_mma_linear(x, pack_int4_kmajor(qw), qz, s, g, b, config=config, out=out)


# kernel, the configs the CPU runs (the default, K splits with fp32 partials, taller row tiles), every candidate
KERNELS = {"kmajor": (_kmajor, [None, (64, 16, 2, 4, 2), (32, 32, 4, 4, 2)], MMA_CONFIGS),
           "kmajor_direct": (_kmajor, [("direct", 64, 16, 0, 4, 2), ("direct", 32, 32, 4, 4, 2)], DIRECT_CONFIGS),
           "kmajor_walk": (_kmajor, [("walk", 64, 1, 0), ("walk", 64, 2, 2)], WALK_CONFIGS),  # 32 and 64 columns
           "natural": (awq_mma_natural, [(16, 16, 1, 4, 2), (16, 32, 2, 4, 2)], NATURAL_CONFIGS)}


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("g", [32, 64, 128, 256])
@pytest.mark.parametrize("m", [1, 5, 20])
def test_mma_kernels_match_the_reference(half, device, rel_err, kind, g, m):
    k, n = 512, 136  # 17 packed columns, N not a multiple of any column tile: the last tile is masked
    fn, configs, _ = KERNELS[kind]
    if kind == "kmajor_walk" and m > 5:
        pytest.skip("the walk serves up to 4 rows (5 checks a row past them; a program a row is slow to interpret)")
    x, qw, qz, s, b = _case(k, n, g, m, half, device, bias=m == 5, seed=3 * g + m)
    ref = awq_linear_ref(x, qw, qz, s, g, b)
    for cfg in configs:
        out = torch.full((m, n), float("nan"), dtype=half, device=device)
        assert fn(x, qw, qz, s, g, b, config=cfg, out=out) is out
        assert rel_err(out, ref) <= TOL[half], cfg


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_mma_kernels_every_config_on_the_gpu(device, rel_err, kind):
    if device != "cuda":
        pytest.skip("every config's compile: a GPU run")
    fn, _, configs = KERNELS[kind]
    for m in (1, 64):
        x, qw, qz, s, _ = _case(1024, 1024, 128, m, torch.bfloat16, device, bias=False, seed=m)
        ref = awq_linear_ref(x, qw, qz, s, 128)
        for cfg in configs:
            assert rel_err(fn(x, qw, qz, s, 128, config=cfg), ref) <= TOL[torch.bfloat16], (m, cfg)


def test_awq_mma_rejects_what_it_cannot_run(device):
    x, qw, qz, s, _ = _case(256, 16, 64, 2, torch.float16, device, bias=False)
    qk = pack_int4_kmajor(qw)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        awq_mma_linear(x.float(), qk, qz, s.float(), 64)
    with pytest.raises(ValueError, match="K = 120 must be a multiple of 128"):
        awq_mma_linear(x[:, :120], qk[:15], qz, s, 64)  # not whole 128-row tiles
    with pytest.raises(ValueError, match="qzeros"):
        awq_mma_linear(x, qk, qz[:1], s, 64)
    assert awq_mma_linear(x[:0], qk, qz, s, 64).shape == (0, 16)


def test_reference_and_dequant_path_match_the_natural_layout(half, device, rel_err):
    x, qw, qz, s, b = _case(256, 48, 64, 300, half, device, bias=True)
    ref = awq_linear_ref(x, qw, qz, s, 64, b)
    qk = pack_int4_kmajor(qw)
    assert rel_err(awq_kmajor_ref(x, qk, qz, s, 64, b), ref) <= TOL[half]
    assert default_mma_config(300) == ("dequant",)
    assert rel_err(awq_mma_linear(x, qk, qz, s, 64, b), ref) <= TOL[half]  # 300 rows: dequantize + matmul
    w = dequantize_kmajor(qk, qz, s, 64, block_n=32)
    assert w.dtype == half and w.shape == (256, 48)
    assert rel_err(w, dequantize_kmajor_ref(qk, qz, s, 64)) <= TOL[half]


def test_awq_linear_runs_an_mma_config_and_falls_back_where_it_cannot(device, rel_err):
    from tachyon.kernels.quant_linear import AWQ_CONFIGS, awq_linear

    mma = next(c for c in AWQ_CONFIGS["skinny"] if c[0] == "mma")
    assert all(AWQ_CONFIGS[b][0][0] != "mma" for b in AWQ_CONFIGS)  # never a default: only a tuned table picks it
    x, qw, qz, s, b = _case(256, 64, 64, 5, torch.float16, device, bias=True)
    assert rel_err(awq_linear(x, qw, qz, s, 64, b, config=mma), awq_linear_ref(x, qw, qz, s, 64, b)) <= 2e-3
    # fp32 activations and a K that is not whole 128-row tiles take the bucket's first config instead
    for xx, k in ((x.float(), 256), (x[:, :192].float(), 192)):
        ref = awq_linear_ref(xx, qw[:k], qz[: k // 64], s[: k // 64].float(), 64)
        assert rel_err(awq_linear(xx, qw[:k], qz[: k // 64], s[: k // 64].float(), 64, config=mma), ref) <= 1e-5


def test_kmajor_linear_takes_the_tuned_config_within_its_rows(device, rel_err, monkeypatch):
    from tachyon.kernels import quant_linear as ql

    key = ql.tuned_key(64, 256, 64)
    table = {"awq_kmajor": {"skinny": {key: (64, 16, 2, 4, 2)}, "gemm": {key: (128, 16, 4, 4, 3)}}}
    monkeypatch.setattr(ql, "_device_table", lambda index: table)
    cuda = torch.device("cuda", 0)
    assert ql.kmajor_config(9, 64, 256, 64, cuda) == (64, 16, 2, 4, 2)
    assert ql.kmajor_config(3, 64, 256, 64, cuda) == (64, 16, 2, 4, 2)  # no "few" entry: the "skinny" one
    assert ql.kmajor_config(1, 64, 256, 64, cuda) == MMA_CONFIGS[0]  # one row has its own bucket
    assert ql.kmajor_config(40, 64, 256, 64, cuda) == (128, 16, 4, 4, 3)
    assert ql.kmajor_config(100, 64, 256, 64, cuda) == ("dequant",)  # past the rows a tile entry serves
    assert ql.kmajor_config(9, 64, 512, 64, cuda) == MMA_CONFIGS[0]  # another shape: the default
    assert ql.kmajor_config(9, 64, 256, 64, torch.device("cpu")) == MMA_CONFIGS[0]
    assert ql.kmajor_config(40, 64, 512, 64, cuda) == DIRECT_DEFAULT  # untuned, 17-64 rows: the direct tiles
    x, qw, qz, s, b = _case(256, 64, 64, 3, torch.float16, device, bias=True)
    ref = awq_linear_ref(x, qw, qz, s, 64, b)
    assert rel_err(ql.awq_kmajor_linear(x, pack_int4_kmajor(qw), qz, s, 64, b), ref) <= 2e-3


def test_untuned_rows_take_16_row_tiles_then_the_direct_tiles_then_dequant():
    assert default_mma_config(1) == default_mma_config(16) == MMA_CONFIGS[0]
    assert default_mma_config(17) == default_mma_config(MMA_MAX_ROWS) == DIRECT_DEFAULT
    assert DIRECT_DEFAULT in DIRECT_CONFIGS  # the tuner times it, and the kernel's direct path runs it
    assert default_mma_config(MMA_MAX_ROWS + 1) == ("dequant",)


def _committed_tables():
    import json
    from pathlib import Path

    import tachyon.kernels as kernels_pkg

    for path in sorted((Path(kernels_pkg.__file__).parent / "quant_tuned").glob("*.json")):
        yield path.name, json.loads(path.read_text())["configs"]


def test_every_committed_int4_entry_is_a_candidate_and_computes_the_product(device, rel_err):
    # the awq entries (natural layout) are candidates of their bucket; the awq_kmajor ones (K-major) are MMA/walk
    # configs the bucket may run (a walk only up to 4 rows); each K-major one matches the reference at a row
    # count of its bucket (fp16, small shapes that clip its tiles)
    from tachyon.kernels.quant_linear import AWQ_CONFIGS

    rows = {"one_row": 1, "few": 3, "skinny": 9, "gemm": 20, "prefill": 20}
    seen = set()
    for name, table in _committed_tables():
        for bucket, by_shape in table.get("awq", {}).items():
            for cfg in by_shape.values():
                assert tuple(cfg) in AWQ_CONFIGS[bucket], (name, bucket, cfg)
        for bucket, by_shape in table.get("awq_kmajor", {}).items():
            for cfg in map(tuple, by_shape.values()):
                walk = cfg[0] == "walk"
                allowed = WALK_CONFIGS if walk else MMA_CONFIGS + DIRECT_CONFIGS + [("dequant",)]
                assert cfg in allowed, (name, bucket, cfg)
                assert not walk or rows[bucket] <= WALK_MAX_ROWS, (name, bucket, cfg)
                seen.add((bucket, cfg))
    for bucket, cfg in sorted(seen, key=str):
        m = rows[bucket]
        x, qw, qz, s, _ = _case(256, 64, 128, m, torch.float16, device, bias=False, seed=m)
        got = awq_mma_linear(x, pack_int4_kmajor(qw), qz, s, 128, config=cfg)
        assert rel_err(got, awq_linear_ref(x, qw, qz, s, 128)) <= TOL[torch.float16], (bucket, cfg)


def test_the_tuner_writes_the_fastest_config_of_each_bucket_it_can_serve(tmp_path):
    """benchmarks/awq_mma.py --write-tuned: the fastest timed K-major config per (row bucket, shape) merged into
    the table; a row count past MMA_MAX_ROWS (dequant + cuBLAS serves it) writes nothing."""
    import json

    from benchmarks.awq_mma import write_tuned
    from tachyon.kernels.awq_mma import MMA_MAX_ROWS

    direct, tile = DIRECT_CONFIGS[0], MMA_CONFIGS[0]
    rows = [(1, tile), (64, direct), (MMA_MAX_ROWS * 4, MMA_CONFIGS[1])]
    report = {"gpu": "G", "group": 128, "command": "cmd", "results": [
        {"M": m, "N": 256, "K": 512, "mma_best": {"config": str(cfg)}} for m, cfg in rows]}
    path = tmp_path / "G.json"
    path.write_text(json.dumps({"device": "G", "configs": {"fp8": {"one_row": {"x": [1]}}}}))
    write_tuned(report, str(path))
    table = json.loads(path.read_text())
    assert table["configs"]["fp8"] == {"one_row": {"x": [1]}}  # the rest of the table stays
    assert table["configs"]["awq_kmajor"] == {"one_row": {"256x512g128": list(tile)},
                                              "gemm": {"256x512g128": list(direct)}}
