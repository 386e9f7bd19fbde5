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
