"""Piecewise CUDA graphs for steps with prefill tokens: everything but attention is captured, per token-count
bucket; attention runs between the pieces with the step's own metadata.

    replay:  [embed, layer 0 up to its KV write] attn 0 [o_proj .. layer 1's KV write] attn 1 ... [final norm]
             └────────── graph 0 ──────────────┘ eager  └──────────── graph 1 ───────┘ eager     graph L

A mixed step's batch (decodes first, then prefill chunks) has any number of sequences of any lengths, which
only attention cares about: every other op works row by row on the T packed tokens. So a bucket's graphs
take T padded up to the bucket (padding rows: token 0, position 0, slot -1, so they write no KV), and the
attention kernels between them read the real T rows and the real block tables, query starts and context
lengths. A step costs L + 1 graph launches and the attention launches instead of every kernel of the model.

The buckets are a grid that pads a step by at most 1/8, except from 256 to 2,048 tokens, where start-up times the
model's linears every 8 rows and keeps the sizes that are cheaper than any larger one (choose_buckets): cuBLAS's
kernel choice jumps with the row count, so a larger bucket can cost less than a smaller one.

A step large enough that its own device time hides the host's launches of an eager forward (eager_from,
measured at capture) and that its bucket would pad runs eagerly at its own size instead: there the padding
rows cost compute and the graph saves nothing.

Capture runs the model's own forward with a backend that ends the current graph where attention would run,
notes the piece's query tensor (an address the next replay writes again) and begins the next graph.
"""

from __future__ import annotations

import bisect
import math
import time

import numpy as np
import torch

from tachyon import envs
from tachyon.layers.attention import AttentionMetadata


def piecewise_buckets(max_tokens: int, per_octave: int = 8) -> list[int]:
    """Token-count buckets: multiples of 16 up to 128, then `per_octave` evenly spaced sizes in every doubling
    (..., 288, 320, ..., 512, 576, ...), so a step pads at most 1/per_octave of its tokens. Above ~200 tokens a
    step is compute-bound and every padding row costs as much as a real one (552 tokens padded to 768 cost a
    Poisson-load step ~5 ms); a bucket costs ~60 ms of capture and no memory of its own (one shared pool)."""
    sizes, step = [], 16
    s = 16
    while s < max_tokens:
        sizes.append(s)
        if s >= 128 and s & (s - 1) == 0:  # a power of two: the next octave's spacing
            step = s // per_octave
        s += step
    return sizes + [max_tokens]


FINE_BUCKETS = (256, 2048, 8)  # where start-up times the linears every 8 rows: (first, last, step) tokens


def choose_buckets(grid: list[int], cost, fine: tuple[int, int, int] = FINE_BUCKETS,
                   keep: float = 0.95) -> tuple[list[int], dict[int, float]]:
    """Buckets from measured cost: `grid` (piecewise_buckets) outside the fine range; inside it, scanning down from
    the range's top grid size (always kept), a grid size stays unless the next larger size kept costs no more, and
    a size between grid sizes (every `fine[2]` tokens) joins where it costs under `keep` times the next larger size
    kept. cost(tokens): ms of the model's linears at that many rows. cuBLAS's kernel choice jumps with M: on the
    H100 llama3-8b's linears took 14.6 ms at 552 rows, 11.4 at 568 and 12.4 at 576, so a Poisson step of 40
    decodes and a 512-token prompt is cheaper padded to 568 than to the grid's 576. A step then replays a bucket
    that costs no more than the grid's bucket for it, and at most cost(its size rounded up to fine[2]) / keep.
    Returns (sizes, {tokens: cost} of the fine range)."""
    lo, hi_cap, step = fine
    hi = max((s for s in grid if lo <= s <= hi_cap and s % step == 0), default=None)
    if hi is None or hi <= lo or lo % step:
        return grid, {}
    sizes = list(range(lo, hi + 1, step))
    costs = {}
    for t in reversed(sizes):  # largest first: a budget cut keeps the anchor
        try:
            costs[t] = float(cost(t))
        except TimeoutError:
            break
    if hi not in costs:
        return grid, {}
    kept, on_grid = [hi], set(grid)
    for t in reversed(sizes[:-1]):
        if t in costs and costs[t] < (1.0 if t in on_grid else keep) * costs[kept[-1]]:
            kept.append(t)
    if len(costs) < len(sizes):  # not all measured: the grid's sizes below the lowest measured one stay
        low = min(costs)
        kept += [s for s in grid if lo <= s < low]
    return sorted({s for s in grid if s < lo or s > hi} | set(kept)), costs


def linear_cost(model, dtype: torch.dtype, budget_s: float = 8.0):
    """A cost(tokens) for choose_buckets: the ms (CUDA events on a GPU) of one decoder layer's linears at that
    many rows (each called as the forward calls it, cuBLAS or a quantized kernel), times the layers; or None where
    the model has no `layers` of linears. Past budget_s of timing it raises TimeoutError (choose_buckets keeps
    what it measured)."""
    from tachyon.layers.linear import QuantLinear

    layers = getattr(model, "layers", None)
    if not layers:
        return None
    mods = [m for m in layers[0].modules() if isinstance(m, (torch.nn.Linear, QuantLinear))]
    if not mods:
        return None
    dev = next(p for p in layers[0].parameters()).device
    hi = FINE_BUCKETS[1]
    xs = {m.in_features: torch.randn(hi, m.in_features, device=dev, dtype=dtype) for m in mods}
    t_end = time.perf_counter() + budget_s

    def cost(tokens: int) -> float:
        if time.perf_counter() > t_end:
            raise TimeoutError
        run = [(m, xs[m.in_features][:tokens]) for m in mods]

        def run_twice():
            for _ in range(2):
                for m, x in run:
                    m(x)

        for m, x in run:  # the first call picks (and caches) cuBLAS's kernel for this M
            m(x)
        times = sorted(_elapsed_ms(run_twice, dev) / 2 for _ in range(5))
        return times[2] * len(layers)

    return cost


def _elapsed_ms(fn, dev: torch.device) -> float:
    """ms of fn(): on a GPU its device time between two CUDA events, on the CPU the wall clock."""
    if dev.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def eager_from(per_token_ms: float, launch_ms: float, hide: float = 2.0) -> int:
    """The smallest step (tokens) whose own device time hides the host's launches of an eager forward `hide` times
    over: per_token_ms, a compute-bound step's device time per token; launch_ms, the host's time to queue an eager
    forward's kernels. From there on, an exact-size eager step costs its own tokens, where a graph costs its
    bucket's (a burst of 12 prompts of 512 plus a decode, 6,145 tokens, replays the 6,656 bucket: 8% more work)."""
    if per_token_ms <= 0:
        return 1 << 62
    return max(1, math.ceil(hide * launch_ms / per_token_ms))


def eager_wins(num_tokens: int, bucket: int, eager_from_tokens: int, min_padding: float = 1 / 64) -> bool:
    """Whether a step of num_tokens runs eagerly at its own size rather than replaying `bucket`'s graphs: its
    launches hide behind its own device time and the bucket pads it by more than min_padding (a graph also saves
    the gaps between kernels, which is worth a little padding)."""
    return num_tokens >= eager_from_tokens and bucket - num_tokens > min_padding * bucket


class _Piece:
    """What runs after graph i: attention of layer i on the graph's query rows into a fixed output."""

    __slots__ = ("q", "k_cache", "v_cache", "scale", "kv_scales", "out")  # q and out: buffers every piece shares

    def __init__(self, q, k_cache, v_cache, scale, kv_scales, out):
        self.q, self.k_cache, self.v_cache, self.scale, self.kv_scales, self.out = (q, k_cache, v_cache, scale,
                                                                                   kv_scales, out)


class _CaptureBackend:
    """Stands in for the attention backend while a bucket is captured: the KV write stays in the graph, the
    attention becomes a break between two graphs."""

    name = "piecewise-capture"

    def __init__(self, graphs: PiecewiseGraphs, capturing: bool):
        self.g = graphs
        self.capturing = capturing
        self.pieces: list[_Piece] = []
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.current: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        if self.capturing:
            self.current = torch.cuda.CUDAGraph()
            self.current.capture_begin(pool=self.g.pool)

    def end(self) -> None:
        if self.capturing:
            self.current.capture_end()
            self.g.pool = self.current.pool()
            self.graphs.append(self.current)
            self.current = None

    def _break(self, q, k_cache, v_cache, scale, kv_scales) -> torch.Tensor:
        # the query goes to a buffer every layer shares, so no layer's qkv projection outlives its piece (held
        # for the replay, 32 of them would pin ~100 MB each at 8192 tokens)
        q_static = self.g.shared_buffer("q", q)
        q_static.copy_(q)
        self.end()
        out = self.g.shared_buffer("out", q)
        self.pieces.append(_Piece(q_static, k_cache, v_cache, scale, kv_scales, out))
        self.begin()
        return out

    def forward_rotary(self, positions, cos_sin_cache, q, k, v, k_cache, v_cache, meta, scale, k_scale=1.0,
                       v_scale=1.0):
        from tachyon.kernels.fused_ops import rotary_write_kv

        rotary_write_kv(positions, q, k, v, cos_sin_cache, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return self._break(q, k_cache, v_cache, scale, (k_scale, v_scale))

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, k_scale=1.0, v_scale=1.0):
        from tachyon.kernels.kv_write import write_kv

        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return self._break(q, k_cache, v_cache, scale, (k_scale, v_scale))


class _Bucket:
    __slots__ = ("size", "graphs", "pieces", "hidden")

    def __init__(self, size, graphs, pieces, hidden):
        self.size, self.graphs, self.pieces, self.hidden = size, graphs, pieces, hidden


class PiecewiseGraphs:
    def __init__(self, runner, sizes: list[int]):
        self.runner = runner
        self.sizes = sizes
        dev = runner.device
        T = sizes[-1]
        self.input_ids = torch.zeros(T, dtype=torch.long, device=dev)
        self.positions = torch.zeros(T, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((T,), -1, dtype=torch.long, device=dev)
        self.buckets: dict[int, _Bucket] = {}
        self.pool = None
        # from how many tokens a step whose bucket pads it runs eagerly at its own size (measured by capture)
        self.eager_from = 1 << 62
        self.calibration: dict[str, float] = {}
        self.costs: dict[int, float] = {}  # ms of the linears at each fine-range size (choose_buckets)
        # one query and one attention output for every layer and bucket: graph i+1 reads layer i's output
        # (and attention i its query) before anything writes them again
        self._shared: dict[str, torch.Tensor] = {}

    def shared_buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._shared.get(name)
        if buf is None:  # the largest bucket comes first; zeros, so padding rows stay finite
            buf = self._shared[name] = torch.zeros((self.sizes[-1], *like.shape[1:]), dtype=like.dtype,
                                                   device=like.device)
        return buf[: like.shape[0]]

    @classmethod
    @torch.inference_mode()
    def capture(cls, runner) -> PiecewiseGraphs:
        sizes, costs = piecewise_buckets(runner.config.scheduler.max_num_batched_tokens), {}
        # ranks must agree on the buckets; TACHYON_FINE_BUCKETS=0 keeps the plain grid (an A/B switch)
        measure = runner.tp is None and envs.flag("TACHYON_FINE_BUCKETS")
        cost = linear_cost(runner.model, runner.dtype) if measure else None
        if cost is not None:
            sizes, costs = choose_buckets(sizes, cost)
        self = cls(runner, sizes)
        self.costs = costs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for T in reversed(self.sizes):  # largest first: the smaller buckets reuse its memory pool
                self._forward(T, capturing=False)  # warm-up: kernels compile, workspaces are allocated
                backend = _CaptureBackend(self, capturing=True)
                torch.cuda.synchronize()
                backend.begin()
                try:
                    hidden = self._forward(T, capturing=True, backend=backend)
                    backend.end()
                except BaseException:
                    if backend.current is not None:  # leave no stream capturing behind (the engine goes on)
                        try:
                            backend.current.capture_end()
                        except Exception:
                            pass
                    raise
                assert len(backend.graphs) == len(backend.pieces) + 1
                self.buckets[T] = _Bucket(T, backend.graphs, backend.pieces, hidden)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self._calibrate_eager()
        return self

    def _calibrate_eager(self) -> None:
        """Run an eager forward of the largest bucket less one token (attention left out, as in a capture): its
        device time per token and the host's time to launch it give eager_from(); the odd size also compiles the
        Triton variants such steps take, so no step compiles mid-run. From eager_from tokens on, a step the
        buckets pad runs eagerly at its own size."""
        T = self.sizes[-1] - 1
        if T < 17:
            return
        launch = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):  # the first compiles; the host's time of the last two counts
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            self._forward(T, capturing=False)
            launch.append(time.perf_counter() - t0)
            end.record()
            torch.cuda.synchronize()
        per_token_ms = start.elapsed_time(end) / T
        launch_ms = 1e3 * min(launch[1:])
        self.eager_from = eager_from(per_token_ms, launch_ms)
        tp = self.runner.tp
        if tp is not None:  # every rank takes the same path (the graphs' all-reduces are the bucket's size): the
            # most cautious rank's threshold
            self.eager_from = -tp.min_over_ranks(-min(self.eager_from, 1 << 40))
        self.calibration = {"per_token_ms": per_token_ms, "launch_ms": launch_ms, "eager_from": self.eager_from}

    def _forward(self, T: int, capturing: bool, backend: _CaptureBackend | None = None) -> torch.Tensor:
        r = self.runner
        backend = backend or _CaptureBackend(self, capturing=False)
        meta = AttentionMetadata(slot_mapping=self.slot_mapping[:T], query_start_loc=None, seq_lens=None,
                                 block_tables=None, num_decodes=0, max_query_len=T, max_seq_len=T)
        return r.model(self.input_ids[:T], self.positions[:T], r.kv_caches, meta, backend)

    @property
    def max_tokens(self) -> int:
        return self.sizes[-1]

    def fits(self, num_tokens: int) -> bool:
        """Whether a step of num_tokens replays graphs: it fits a bucket, and not one that pads it more than an
        exact-size eager step costs (eager_wins; inside the fine range, the linears' measured costs decide)."""
        if num_tokens > self.sizes[-1]:
            return False
        bucket = self.sizes[bisect.bisect_left(self.sizes, num_tokens)]
        own = self.costs.get(-(-num_tokens // FINE_BUCKETS[2]) * FINE_BUCKETS[2])
        if own is not None and bucket in self.costs:  # measured: eager where its own size is clearly cheaper
            return num_tokens < self.eager_from or self.costs[bucket] * (1 - 1 / 64) <= own
        return not eager_wins(num_tokens, bucket, self.eager_from)

    def replay(self, input_ids: torch.Tensor, positions: np.ndarray, slots: np.ndarray,
               meta: AttentionMetadata) -> torch.Tensor:
        """One step's forward: input_ids [T] on the device, positions and slots host arrays, meta the step's
        attention metadata. Returns the final hidden states [T, hidden] (a view of the bucket's output)."""
        T = len(positions)
        bucket = self.buckets[self.sizes[bisect.bisect_left(self.sizes, T)]]
        B = bucket.size
        stage = torch.empty(2, B, dtype=torch.long, pin_memory=True)
        st = stage.numpy()
        st[0, :T], st[0, T:] = positions, 0
        st[1, :T], st[1, T:] = slots, -1
        staged = stage.to(self.input_ids.device, non_blocking=True)
        self.input_ids[:T].copy_(input_ids)
        self.input_ids[T:B].zero_()
        self.positions[:B].copy_(staged[0])
        self.slot_mapping[:B].copy_(staged[1])
        attend = self.runner.backend.attend
        for graph, piece in zip(bucket.graphs, bucket.pieces + [None], strict=True):
            graph.replay()
            if piece is not None:
                k_scale, v_scale = piece.kv_scales
                attend(piece.q[:T], piece.k_cache, piece.v_cache, meta, piece.scale, out=piece.out[:T],
                       k_scale=k_scale, v_scale=v_scale)
        return bucket.hidden[:T]
