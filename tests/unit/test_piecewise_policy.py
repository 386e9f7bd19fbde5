"""Which mixed steps replay piecewise CUDA graphs and which run eagerly at their own size
(tachyon.worker.piecewise_graphs): pure functions, no GPU needed."""

from __future__ import annotations

from tachyon.worker.piecewise_graphs import eager_from, eager_wins, piecewise_buckets


def test_buckets_pad_at_most_an_eighth():
    sizes = piecewise_buckets(8192)
    assert sizes[:8] == [16, 32, 48, 64, 80, 96, 112, 128] and sizes[-1] == 8192
    assert 576 in sizes and 6144 in sizes and 6656 in sizes
    for t in range(1, 8193):
        b = next(s for s in sizes if s >= t)
        assert b - t < max(16, b / 8), t


def test_a_padded_step_runs_eagerly_once_its_own_time_hides_the_launches():
    # 0.021 ms a token (8B on an H200), 8 ms to launch an eager forward: hidden twice over from 762 tokens
    assert eager_from(0.021, 8.0) == 762
    assert eager_from(0.0, 8.0) > 1 << 40  # nothing measured: never eager
    start = eager_from(0.021, 8.0)
    assert eager_wins(6145, 6656, start)  # the c16 burst's 12 prompts and a decode: 8% padding
    assert not eager_wins(552, 576, start)  # a Poisson arrival's step: too small to hide its launches
    assert not eager_wins(8190, 8192, start)  # padding under 1/64 of the bucket: the graph's gapless replay
    assert not eager_wins(8192, 8192, start)
    assert eager_wins(8000, 8192, start)


# llama3-8b's linears per step (ms) against the row count, cuBLAS bf16 on an H100
# (benchmarks/results/h100/session_20261207f/call2_diag_early_encode/gemm_m.json)
H100_LINEARS_MS = {384: 8.573, 392: 8.443, 400: 10.643, 408: 8.45, 416: 10.209, 424: 9.244, 432: 8.877, 440: 10.458,
                   448: 14.085, 456: 9.392, 464: 9.921, 472: 9.679, 480: 9.875, 488: 9.826, 496: 9.87, 504: 10.334,
                   512: 10.323, 520: 11.989, 528: 11.441, 536: 14.461, 544: 11.825, 552: 14.593, 560: 14.722,
                   568: 11.389, 576: 12.351, 584: 14.523, 592: 12.559, 600: 14.464, 608: 13.01, 616: 14.79,
                   624: 13.017, 632: 12.631, 640: 12.937}


def test_measured_buckets_skip_the_sizes_a_larger_one_beats():
    from tachyon.worker.piecewise_graphs import choose_buckets

    grid = piecewise_buckets(8192)
    calls = []

    def cost(t):
        calls.append(t)
        return H100_LINEARS_MS[t]

    sizes, costs = choose_buckets(grid, cost, fine=(384, 640, 8))
    assert calls[0] == 640 and sorted(calls) == list(range(384, 641, 8))  # every size, the anchor first
    assert costs == H100_LINEARS_MS
    assert [s for s in sizes if s < 384 or s > 640] == [s for s in grid if s < 384 or s > 640]
    fine = [s for s in sizes if 384 <= s <= 640]
    assert fine[-1] == 640 and 448 not in fine and 552 not in fine  # 448 costs more than 480
    assert 576 in fine  # a grid size cheaper than the next one kept stays
    # a Poisson step (40 decodes + a 512-token prompt) pads to 568: 11.4 ms where the grid's 576 costs 12.4
    assert next(s for s in sizes if s >= 552) == 568
    for a, b in zip(fine, fine[1:], strict=False):  # each kept size cheaper; off the grid, clearly cheaper
        assert costs[a] < (1 if a in grid else 0.95) * costs[b], (a, b)
    for t in range(385, 641):
        b = next(s for s in sizes if s >= t)
        assert costs[b] <= costs[-(-t // 8) * 8] / 0.95, t
        assert costs[b] <= costs[next(s for s in grid if s >= t)], t  # never dearer than the grid's bucket


def test_a_cost_budget_cut_keeps_the_grid_below_what_was_measured():
    from tachyon.worker.piecewise_graphs import choose_buckets

    grid = piecewise_buckets(8192)

    def cost(t):
        if t < 560:
            raise TimeoutError
        return H100_LINEARS_MS[t]

    sizes, costs = choose_buckets(grid, cost, fine=(384, 640, 8))
    assert min(costs) == 560
    assert [s for s in sizes if s < 560] == [s for s in grid if s < 560]  # 384 ... 544 as the grid has them
    assert next(s for s in sizes if s >= 560) == 568

    def nothing(t):
        raise TimeoutError

    assert choose_buckets(grid, nothing, fine=(384, 640, 8)) == (grid, {})


def test_inside_the_measured_range_a_step_runs_eagerly_only_where_its_own_size_is_cheaper():
    from types import SimpleNamespace

    from tachyon.worker.piecewise_graphs import PiecewiseGraphs

    pw = PiecewiseGraphs(SimpleNamespace(device="cpu"), [512, 568, 640, 8192])
    pw.costs = {512: 10.3, 552: 14.6, 568: 11.4, 576: 12.4, 584: 14.5, 592: 12.6, 640: 12.9}
    pw.eager_from = 500
    assert pw.fits(552)  # 552 rows alone cost 14.6 ms: the graph padded to 568 is cheaper
    assert not pw.fits(585)  # 592 alone costs 12.6, the 640 bucket 12.9: eager at its own size
    assert pw.fits(577)  # 584 costs 14.5 alone: padding to 640 is cheaper
    pw.eager_from = 600
    assert pw.fits(585)  # too small to hide an eager step's launches
    assert not pw.fits(8193)


def test_linear_cost_times_one_layers_linears_times_the_layers():
    from types import SimpleNamespace

    import pytest
    import torch

    from tachyon.worker.piecewise_graphs import linear_cost

    torch.manual_seed(0)
    layer = torch.nn.ModuleDict({"qkv": torch.nn.Linear(64, 192), "o": torch.nn.Linear(64, 64),
                                 "norm": torch.nn.LayerNorm(64)})
    model = SimpleNamespace(layers=torch.nn.ModuleList([layer, layer, layer]))
    calls = []
    layer["o"].register_forward_hook(lambda mod, args, out: calls.append(tuple(args[0].shape)))
    cost = linear_cost(model, torch.float32)
    assert cost(264) > 0
    assert calls == [(264, 64)] * 11  # a warm-up call, then 5 timed rounds of 2, on 264 rows
    with pytest.raises(TimeoutError):
        linear_cost(model, torch.float32, budget_s=-1)(256)
    assert linear_cost(SimpleNamespace(), torch.float32) is None
    assert linear_cost(SimpleNamespace(layers=torch.nn.ModuleList([torch.nn.LayerNorm(8)])), torch.float32) is None
