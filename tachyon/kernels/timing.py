"""GPU time of a captured CUDA graph: what start-up tuning compares (a decode step is launched as a graph, so a
graph replay, not an eager launch from Python, is the thing to time)."""

from __future__ import annotations

import torch


def median_replay_ms(graph: torch.cuda.CUDAGraph, reps: int = 5) -> float:
    """One warm-up replay, then the median of `reps` replays timed with CUDA events, in ms."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def per_call_ms(fn, calls: int = 1, reps: int = 5) -> float:
    """GPU ms of one call of fn: one eager call (compiles, allocates), then `calls` calls captured in one CUDA
    graph, the median of `reps` replays divided by `calls`."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return median_replay_ms(graph, reps) / calls
