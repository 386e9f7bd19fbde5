import pytest
import torch
import torch.nn.functional as F

from tachyon.kernels.gemv import (
    CONFIGS,
    ONE_ROW_CONFIGS,
    SPLIT_CONFIGS,
    candidates,
    check_config,
    gemv,
    row_bucket,
    tune_linears,
    use_gemv,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("m", [1, 3, 8, 16, 40, 64])  # 40, 64: the 17-64-row buckets (x padded to 64)
@pytest.mark.parametrize("n,k", [(40, 96), (33, 300)])  # N and K not multiples of any block
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_linear(dtype, device, rel_err, m, n, k, bias):
    torch.manual_seed(m * 7 + n)
    x = torch.randn(m, k).to(device=device, dtype=dtype)
    w = (torch.randn(n, k) / k ** 0.5).to(device=device, dtype=dtype)
    b = torch.randn(n).to(device=device, dtype=dtype) if bias else None
    ref = F.linear(x.float(), w.float(), b.float() if bias else None)
    cfgs = (CONFIGS[0], CONFIGS[3], ONE_ROW_CONFIGS[1]) if device == "cpu" else candidates(row_bucket(m))
    for cfg in cfgs:  # a late-reduce config on several rows takes the tl.dot path
        out = gemv(x, w, b, cfg)
        assert out.shape == (m, n) and out.dtype == dtype
        assert rel_err(out, ref) <= TOL[dtype], cfg


@pytest.mark.parametrize("m", [1, 2, 16, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_split_k_matches_linear_and_one_row_ignores_the_split(dtype, device, rel_err, m, bias):
    # K = 1100: 5 tiles of 256, split 2 -> parts of 3 and 2 tiles, split 4 -> 2, 2, 1 (the last part short);
    # the partials are summed by a second kernel, which also adds the bias
    torch.manual_seed(m)
    n, k = 40, 1100
    x = torch.randn(m, k).to(device=device, dtype=dtype)
    w = (torch.randn(n, k) / k ** 0.5).to(device=device, dtype=dtype)
    b = torch.randn(n).to(device=device, dtype=dtype) if bias else None
    ref = F.linear(x.float(), w.float(), b.float() if bias else None)
    out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
    for cfg in (SPLIT_CONFIGS[0], SPLIT_CONFIGS[1]) if device == "cpu" else SPLIT_CONFIGS:
        got = gemv(x, w, b, cfg, out=out)
        assert got is out and rel_err(out, ref) <= TOL[dtype], cfg


def test_gemv_strided_rows_and_out(device, rel_err):
    x = torch.randn(4, 64, device=device)[:, :48]  # row stride 64
    w = torch.randn(24, 48, device=device)
    out = torch.full((4, 24), float("nan"), device=device)
    gemv(x, w, out=out)
    assert rel_err(out, F.linear(x, w)) <= 1e-5


def test_gemv_rejects_bad_shapes(device):
    with pytest.raises(ValueError, match="at most 64 rows"):
        gemv(torch.randn(65, 8, device=device), torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="columns"):
        gemv(torch.randn(2, 8, device=device), torch.randn(4, 9, device=device))


@pytest.mark.parametrize("cfg", [CONFIGS[0], ONE_ROW_CONFIGS[1]])
def test_check_config_accepts_a_right_kernel_and_refuses_a_wrong_one(device, monkeypatch, cfg):
    torch.manual_seed(1)
    lin = torch.nn.Linear(96, 40).to(device)
    x = torch.randn(1, 96, device=device)
    assert check_config(x, lin, cfg) is None
    import tachyon.kernels.gemv as mod

    real = mod.gemv
    off_by_one_row = lambda x, w, b, c: real(x, w.roll(1, 0), b, c)  # noqa: E731 - a kernel that mixes up rows
    monkeypatch.setattr(mod, "gemv", off_by_one_row)
    assert "wrong result" in check_config(x, lin, cfg)
    monkeypatch.setattr(mod, "gemv", lambda x, w, b, c: real(x, w, b, c) * float("nan"))
    assert "wrong result" in check_config(x, lin, cfg)


def test_row_bucket():
    assert [row_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 48, 64)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 64, 64,
                                                                                 64]


def test_candidates_keep_the_x_tile_small_above_16_rows():
    # up to 16 rows every config (and the one-row ones at 1); at 32 and 64 only those whose x tile of a stage
    # (BLOCK_K x padded rows) stays within MAX_X_TILE: (8, 512, ...) would stage 64 KB of x at 64 rows
    from tachyon.kernels.gemv import MAX_X_TILE

    assert candidates(1) == CONFIGS + ONE_ROW_CONFIGS and candidates(16) == CONFIGS
    assert CONFIGS[0] in candidates(32) and CONFIGS[0] not in candidates(64)
    assert candidates(16, split=True) == CONFIGS + SPLIT_CONFIGS and SPLIT_CONFIGS[0] in candidates(64, split=True)
    assert not set(SPLIT_CONFIGS) & set(candidates(1, split=True))  # one row never splits
    for split in (False, True):
        assert candidates(64, split) and all(c[1] * 64 <= MAX_X_TILE for c in candidates(64, split))


def test_split_candidates_are_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("TACHYON_GEMV_SPLIT", raising=False)
    assert not set(SPLIT_CONFIGS) & set(candidates(4))
    monkeypatch.setenv("TACHYON_GEMV_SPLIT", "1")
    assert set(SPLIT_CONFIGS) <= set(candidates(4))


def test_use_gemv_routes_small_batches_only(device, rel_err, monkeypatch):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 40).to(device)
    calls = []
    import tachyon.kernels.gemv as mod

    real = mod.gemv
    monkeypatch.setattr(mod, "gemv", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    use_gemv(lin, {1: CONFIGS[0], 4: CONFIGS[1], 32: CONFIGS[3]})
    for m in (1, 3, 2, 20, 40, 70):  # 1, 3 -> buckets 1, 4 and 20 -> 32: gemv; 2 and 40 (no config), 70 (too many)
        x = torch.randn(m, 64, device=device)
        assert rel_err(lin(x), F.linear(x, lin.weight, lin.bias)) <= 1e-5
    assert calls == [1, 3, 20]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tune_linears_never_slower_and_exact():
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 3072, bias=False) for _ in range(4)]).cuda().bfloat16()
    report = tune_linears(model, [1, 2, 4, 8])
    (rows,) = report.values()
    for r in rows.values():
        assert r["best_ms"] <= r["cublas_ms"]
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    lin = model[0]
    assert (lin(x) - F.linear(x, lin.weight)).abs().max() < 0.05
