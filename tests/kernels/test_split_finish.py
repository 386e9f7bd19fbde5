"""The one-row walks summing their own K splits (TACHYON_SPLIT_FINISH=1, kernels/splits.finish_split): the same
sums in the same order as the second kernel (sum_splits), so the output is bit for bit the same, and every tile
counter is back at zero after the launch (the next launch, or a CUDA graph's next replay, starts clean)."""

import pytest
import torch

from tachyon.kernels import awq_mma, quant_linear, scaled_linear, splits
from tachyon.kernels.quant_ref import pack_int4_kmajor
from tachyon.layers.linear import quantize_int8


def _both(monkeypatch, module, fn):
    """fn() with the second kernel, then with the last split finishing, and the device's counters after; checks
    that the first launched sum_splits and the second did not (K was split, and the kernel summed it)."""
    calls = []
    monkeypatch.setattr(module, "sum_splits", lambda *a: calls.append(1) or splits.sum_splits(*a))
    monkeypatch.setenv("TACHYON_SPLIT_FINISH", "0")
    two = fn()
    assert calls == [1]
    monkeypatch.setenv("TACHYON_SPLIT_FINISH", "1")
    one = fn()
    assert calls == [1]
    return two, one, splits._counters[one.device]


# one row, 41 packed columns (a partial second tile); two rows, 5 (a clipped tile); K split in 4 both times
@pytest.mark.parametrize("m,n,k", [(1, 328, 1024), (2, 40, 1024)])
def test_awq_walk_finishes_its_splits(monkeypatch, dtype, device, m, n, k):
    torch.manual_seed(m * n)
    g = 32
    qw = quant_linear.pack_int4(torch.randint(0, 16, (k, n))).to(device)
    qz = quant_linear.pack_int4(torch.randint(0, 16, (k // g, n))).to(device)
    s = (torch.randn(k // g, n) * 0.02).to(device=device, dtype=dtype)
    x = torch.randn(m, k).to(device=device, dtype=dtype)
    for bias in (None, torch.randn(n).to(device=device, dtype=dtype)):
        cfg = ("gemv", 128, 32, 4, False, 0)

        def run(bias=bias, cfg=cfg):
            out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
            return quant_linear.awq_linear(x, qw, qz, s, g, bias, config=cfg, out=out)

        two, one, counters = _both(monkeypatch, quant_linear, run)
        assert torch.equal(one, two)
        assert not counters.any()
        assert torch.equal(run(), one)  # a second launch on the reset counters


@pytest.mark.parametrize("m", [1, 2])
def test_kmajor_walk_finishes_its_splits(monkeypatch, dtype, device, m):
    if dtype == torch.float32:
        pytest.skip("awq_mma_linear takes fp16/bf16")
    torch.manual_seed(m)
    k, n, g = 512, 72, 64  # 4 tiles of 128 rows, split in 2 and 4; 72 columns: a masked second column tile
    qw = quant_linear.pack_int4(torch.randint(0, 16, (k, n))).to(device)
    qz = quant_linear.pack_int4(torch.randint(0, 16, (k // g, n))).to(device)
    s = (torch.randn(k // g, n) * 0.02).to(device=device, dtype=dtype)
    qk = pack_int4_kmajor(qw)
    x = torch.randn(m, k).to(device=device, dtype=dtype)
    bias = torch.randn(n).to(device=device, dtype=dtype)
    for cfg in (("walk", 64, 2, 2), ("walk", 32, 1, 4)):
        def run(cfg=cfg):
            return awq_mma.awq_mma_linear(x, qk, qz, s, g, bias, config=cfg)

        two, one, counters = _both(monkeypatch, awq_mma, run)
        assert torch.equal(one, two), cfg
        assert not counters.any()


@pytest.mark.parametrize("m", [1, 3])
def test_scaled_walk_finishes_its_splits(monkeypatch, dtype, device, m):
    torch.manual_seed(m)
    k, n = 512, 80  # 16 K tiles of 32: split in 4
    w, ws = quantize_int8(torch.randn(n, k))
    w, ws = w.to(device), ws.to(device)
    x = torch.randn(m, k).to(device=device, dtype=dtype)
    bias = torch.randn(n).to(device=device, dtype=dtype)
    for kind in ("walk", "lwalk", "qwalk"):
        def run(kind=kind):
            return scaled_linear.scaled_linear(x, w, ws, bias, None, force_walk=True, config=(kind, 16, 32, 4, 2))

        two, one, counters = _both(monkeypatch, scaled_linear, run)
        assert torch.equal(one, two), kind
        assert not counters.any()


def test_split_counters_off_or_too_many(monkeypatch):
    monkeypatch.setenv("TACHYON_SPLIT_FINISH", "0")
    assert splits.split_counters(torch.device("cpu"), 4) is None
    monkeypatch.setenv("TACHYON_SPLIT_FINISH", "1")
    assert splits.split_counters(torch.device("cpu"), splits.SPLIT_COUNTERS + 1) is None
    buf = splits.split_counters(torch.device("cpu"), 4)
    assert buf.dtype == torch.int32 and buf.numel() == splits.SPLIT_COUNTERS
    assert splits.split_counters(torch.device("cpu"), 8) is buf  # one buffer a device
