"""W8A8 kernels (kernels/scaled_linear.py) against their torch reference (kernels/quant_ref.py).

Triton's interpreter cannot load or cast float8, so the fp8 kernels run on a GPU only; int8 runs everywhere."""

import pytest
import torch

from tachyon.kernels.scaled_linear import (
    MAX_ROW_WALK_ROWS,
    QUANTIZE_ONE_TILE,
    cublas_takes,
    gemm_path,
    quantize_rows,
    quantize_rows_ref,
    scaled_linear,
    scaled_linear_ref,
)
from tachyon.layers.linear import quantize_fp8, quantize_int8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

QTYPES = [torch.int8, pytest.param(torch.float8_e4m3fn, marks=[
    pytest.mark.gpu, pytest.mark.skipif(DEVICE != "cuda", reason="the interpreter has no float8")])]


def _weight(n: int, k: int, qtype, device):
    w = torch.randn(n, k)
    w[:, 3] *= 20  # an outlier input feature
    q, s = (quantize_int8 if qtype == torch.int8 else quantize_fp8)(w)
    return q.to(device), s.to(device)


def _x(m: int, k: int, dtype, device) -> torch.Tensor:
    x = torch.randn(m, k + 8)[:, :k]  # rows 8 elements apart
    x[0, 5] = 30.0  # one row with a large value: its scale differs from the others
    return x.to(device=device, dtype=dtype)


def test_reference_rounds_per_row():
    x = torch.tensor([[1.0, -0.5, 0.26], [0.0, 0.0, 0.0], [254.0, 1.0, -127.5]])
    q, s = quantize_rows_ref(x, torch.int8)
    torch.testing.assert_close(s, torch.tensor([1 / 127, 1e-12 / 127, 2.0]))
    assert q.tolist() == [[127, -64, 33], [0, 0, 0], [127, 0, -64]]  # 63.5 and 0.5: half to even
    q, s = quantize_rows_ref(x, torch.int8, torch.tensor([0.01]))
    assert q[0].tolist() == [100, -50, 26] and q[2].tolist() == [127, 100, -127]  # saturated
    q8, s8 = quantize_rows_ref(torch.tensor([[448.0, 1.0, 0.3]]), torch.float8_e4m3fn)
    assert s8.item() == 1.0 and q8.float().tolist() == [[448.0, 1.0, 0.3125]]  # E4M3: 0.3 -> 0.3125
    w = torch.tensor([[2, -1, 0]], dtype=torch.int8)
    y = scaled_linear_ref(x, w, torch.tensor([0.5]), bias=torch.tensor([1.0]))
    expect = torch.tensor([(2 * 127 + 64) * (1 / 127) * 0.5 + 1, 1.0, (2 * 127 - 0) * 2.0 * 0.5 + 1])
    torch.testing.assert_close(y[:, 0], expect)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("static", [False, True])
def test_scaled_linear_matches_ref(dtype, device, rel_err, qtype, m, static):
    if qtype == torch.float8_e4m3fn and dtype == torch.float32 and m > MAX_ROW_WALK_ROWS:
        pytest.skip("fp8 cuBLAS takes bf16 activations; fp32 goes through the row walk, run at m <= 16")
    torch.manual_seed(m)
    k, n = 96, 80
    w, ws = _weight(n, k, qtype, device)
    x = _x(m, k, dtype, device)
    bias = torch.randn(n).to(device=device, dtype=dtype)
    scale = torch.tensor([0.05], device=device) if static else None
    y = scaled_linear(x, w, ws, bias, scale)
    ref = scaled_linear_ref(x, w, ws, bias, scale)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)
    walk = scaled_linear(x, w, ws, bias, scale, force_walk=True, config=(16, 32, 4, 2))  # K split in 3
    assert rel_err(walk, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)
    if m <= 3:  # (the late reduce is inside each program: more rows only repeat it)
        late = scaled_linear(x, w, ws, bias, scale, force_walk=True, config=("lwalk", 16, 32, 4, 2))
        assert rel_err(late, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)
    if m <= MAX_ROW_WALK_ROWS:
        # tensor cores: all rows in one program, int32 (int8) or fp32 (fp8) accumulation, K split in 3
        dot = scaled_linear(x, w, ws, bias, scale, force_walk=True, config=("dot", 16, 32, 4, 2))
        assert rel_err(dot, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)
        # the rows quantized first (`quantize_rows`), then the dot: the same numbers
        qdot = scaled_linear(x, w, ws, bias, scale, force_walk=True, config=("qdot", 16, 32, 4, 2))
        assert rel_err(qdot, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)
    if m == 3:  # the walk over quantized rows, K split in 3
        qwalk = scaled_linear(x, w, ws, bias, scale, force_walk=True, config=("qwalk", 16, 32, 4, 2))
        assert rel_err(qwalk, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)
    # rows quantized first, then the fused GEMM: partial tiles in M (m % 16), N (80 % 64) and K (96 % 64)
    gemm = scaled_linear(x, w, ws, bias, scale, config=("gemm", 16, 64, 64, 4, 2))
    assert gemm.dtype == dtype and rel_err(gemm, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 3, 16, 40])
@pytest.mark.parametrize("static", [False, True])
def test_weight_only_configs_compute_the_unquantized_product(dtype, device, rel_err, qtype, m, static):
    # "wo": x is not rounded (a static input scale does not clamp it either), so the output is the weight-only
    # product, nearer it than the W8A8 reference is: row 0's outlier (30.0) makes its int8 / E4M3 steps coarse.
    # Every small and GEMM "wo" config, partial tiles in N (80) and K (96), K split in 3 where BLOCK_K is 32.
    from tachyon.kernels.scaled_linear import GEMM_CONFIGS, SMALL_CONFIGS, scaled_weight_only_ref

    torch.manual_seed(11 + m)
    k, n = 96, 80
    w, ws = _weight(n, k, qtype, device)
    x = _x(m, k, dtype, device)
    bias = torch.randn(n).to(device=device, dtype=dtype)
    scale = torch.tensor([0.05], device=device) if static else None
    ref = scaled_weight_only_ref(x, w, ws, bias)
    w8a8_gap = rel_err(scaled_linear_ref(x, w, ws, bias, scale), ref)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-3
    assert w8a8_gap > 2 * tol  # (the check below tells the two products apart)
    configs = [c for c in SMALL_CONFIGS + GEMM_CONFIGS if c[0] == "wo"] + [("wo", 16, 32, 32, 3, 4, 2),
                                                                             ("wo", 1, 16, 32, 3, 4, 2)]
    for cfg in configs:
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        assert scaled_linear(x, w, ws, bias, scale, config=cfg, out=out) is out
        assert rel_err(out, ref) < tol, cfg


@pytest.mark.parametrize("qtype", QTYPES)
def test_rows_quantized_by_a_producer_replace_the_quantize_launch(dtype, device, qtype):
    # pre = the rows of 2x quantized: the kernels that quantize first take them (and give 2x's product); those that
    # read x itself ignore them (x's product)
    torch.manual_seed(3)
    k, n, m = 96, 80, 3
    w, ws = _weight(n, k, qtype, device)
    x = _x(m, k, dtype, device)
    pre = quantize_rows(2 * x, qtype)
    for config in [("qdot", 16, 32, 4, 2), ("qwalk", 16, 32, 4, 2), ("gemm", 16, 64, 64, 4, 2),
                   ("walk", 16, 32, 4, 2), ("lwalk", 16, 32, 4, 2), ("dot", 16, 32, 4, 2),
                   ("wo", 16, 32, 32, 0, 4, 2)]:
        got = scaled_linear(x, w, ws, config=config, force_walk=config[0] != "gemm", pre=pre)
        takes = config[0] in ("qdot", "qwalk", "gemm")
        expect = scaled_linear(2 * x if takes else x, w, ws, config=config, force_walk=config[0] != "gemm")
        assert torch.equal(got, expect), config
    with pytest.raises(ValueError, match=r"pre holds torch.int8 \(3, 95\) rows"):
        scaled_linear(x, w, ws, pre=(pre[0][:, :95].to(torch.int8), pre[1]))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("kind", ["walk", "lwalk"])
def test_row_scale_from_several_wide_loads(dtype, device, rel_err, qtype, kind):
    # one warp loads x's row 512 elements at a time for its scale: K = 1100 takes three loads, the last partial,
    # and each row's largest value sits in a different one (a load left out changes that row's scale)
    torch.manual_seed(7)
    k, n = 1100, 24
    w, ws = _weight(n, k, qtype, device)
    x = torch.randn(3, k)
    x[0, 3], x[1, 700], x[2, 1099] = 25.0, -40.0, 60.0
    x = x.to(device=device, dtype=dtype)
    ref = scaled_linear_ref(x, w, ws)
    out = scaled_linear(x, w, ws, force_walk=True, config=(kind, 16, 64, 1, 2))
    assert rel_err(out, ref) < (2e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("k", [200, QUANTIZE_ONE_TILE + 40])  # the row in one tile; in 17 tiles, the last partial
def test_quantize_rows_matches_ref(dtype, device, qtype, k):
    x = _x(5, k, dtype, device)
    x[3, k - 1] = 30.0  # the largest value in the last (partial) tile
    for scale in (None, torch.tensor([0.02], device=device)):
        q, s = quantize_rows(x, qtype, scale)
        qr, sr = quantize_rows_ref(x, qtype, scale)
        torch.testing.assert_close(s, sr)
        # x / s rounds the same way up to one step where the division lands on a rounding boundary
        diff = (q.float() - qr.float()).abs()
        assert (diff > 0).float().mean() < 0.01 and diff.max() <= (1 if qtype == torch.int8 else 32)


def test_gemm_path_choice():
    w8 = torch.zeros(32, 64, dtype=torch.int8)
    assert not gemm_path(torch.zeros(MAX_ROW_WALK_ROWS + 1, 64), w8)  # not on the GPU
    if DEVICE == "cuda":
        x = torch.zeros(MAX_ROW_WALK_ROWS + 1, 64, device="cuda", dtype=torch.bfloat16)
        assert gemm_path(x, w8.cuda()) and gemm_path(x, w8.cuda().to(torch.float8_e4m3fn))
        assert not gemm_path(x[:MAX_ROW_WALK_ROWS], w8.cuda())
        assert not gemm_path(x.half(), w8.cuda().to(torch.float8_e4m3fn))  # row-wise fp8 cuBLAS: bf16 out only
        assert not gemm_path(x[:, :40], torch.zeros(32, 40, dtype=torch.int8, device="cuda"))  # K % 16
        # fp8 cuBLAS takes a few rows too (where the tuned table measured it faster), int8's _int_mm does not
        f8 = w8.cuda().to(torch.float8_e4m3fn)
        assert cublas_takes(x[:4], f8) and not cublas_takes(x[:4], w8.cuda())
        assert not gemm_path(x[:4], f8)  # without a table entry a few rows walk
        w, ws = _weight(48, 64, torch.float8_e4m3fn, "cuda")
        xs = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
        ref = scaled_linear_ref(xs, w, ws)
        assert ((scaled_linear(xs, w, ws, config=("cublas",)).float() - ref.float()).norm() / ref.float().norm()) < 2e-2


def test_cublas_config_only_where_cublas_takes_the_shape():
    w, ws = _weight(32, 40, torch.int8, DEVICE)  # K = 40: not a multiple of 16
    x = torch.randn(MAX_ROW_WALK_ROWS + 1, 40, device=DEVICE)
    with pytest.raises(ValueError, match=r"cuBLAS does not take 17 rows of torch.float32 x torch.int8 \[32, 40\]"):
        scaled_linear(x, w, ws, config=("cublas",))
    assert not gemm_path(x, w)  # the default walks these rows


def test_rejects_bad_inputs(device):
    w, ws = _weight(16, 32, torch.int8, device)
    x = torch.randn(2, 32, device=device)
    with pytest.raises(TypeError, match="weight must be float8_e4m3fn or int8"):
        scaled_linear(x, w.float(), ws)
    with pytest.raises(TypeError, match=r"weight_scale must be float32 \[16\]"):
        scaled_linear(x, w, ws.half())
    with pytest.raises(ValueError, match="x has 31 columns but the weight has K = 32"):
        scaled_linear(x[:, :31], w, ws)
    with pytest.raises(TypeError, match="input_scale must be one float32 value"):
        scaled_linear(x, w, ws, input_scale=torch.ones(2, device=device))
    assert scaled_linear(x[:0], w, ws).shape == (0, 16)


def _tuned_scaled_entries():
    import json
    from pathlib import Path

    import tachyon.kernels as kernels_pkg

    for path in sorted((Path(kernels_pkg.__file__).parent / "quant_tuned").glob("*.json")):
        table = json.loads(path.read_text())["configs"]
        for fmt in ("fp8", "w8a8"):
            for bucket, by_shape in table.get(fmt, {}).items():
                for cfg in by_shape.values():
                    yield path.name, bucket, tuple(cfg)


def test_every_tuned_scaled_config_is_a_candidate_and_computes_the_product(device, rel_err):
    # each committed table's fp8/w8a8 entries: one the tuner could have written, and (int8, small shapes that clip
    # the tiles, K split where the walk splits it) its kernel matches the reference at a row count of its bucket
    from tachyon.kernels.scaled_linear import GEMM_CONFIGS, SMALL_CONFIGS, scaled_weight_only_ref

    rows = {"one_row": 1, "few": 3, "skinny": 9, "gemm": 20, "prefill": 20}
    entries = list(_tuned_scaled_entries())
    assert entries and {b for _, b, _ in entries} <= set(rows)
    torch.manual_seed(0)
    w, ws = _weight(48, 1024, torch.int8, device)
    seen = set()
    for name, bucket, cfg in entries:
        assert cfg in SMALL_CONFIGS + GEMM_CONFIGS, (name, bucket, cfg)
        key = (cfg[0], rows[bucket], cfg[1:3])
        if key in seen or (cfg[0] == "cublas" and device != "cuda"):
            continue
        seen.add(key)
        x = _x(rows[bucket], 1024, torch.float32 if device == "cpu" else torch.bfloat16, device)
        out = scaled_linear(x, w, ws, config=cfg, force_walk=cfg[0] not in ("cublas", "gemm", "wo"))
        ref = (scaled_weight_only_ref if cfg[0] == "wo" else scaled_linear_ref)(x, w, ws)
        assert rel_err(out, ref) < 2e-2, (name, bucket, cfg)
