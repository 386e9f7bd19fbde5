"""CUDA graphs for steps where every sequence runs the same number of tokens `q_len`: one graph per captured
batch size; a batch is padded up to the next size.

q_len 1 is decode. q_len 1 + k is speculative decoding's verification: every sequence runs its last token and k
proposals, so the step's shape is as fixed as a decode's (attention is the prefill kernel, whose grid only
depends on the batch size and q_len) and the whole forward, LM head included, replays as one graph.

Padding rows have slot -1 (their K/V are not written) and seq_len 0 (decode attention writes zeros for
them) or, for q_len > 1, seq_len q_len (their queries read only the first positions of whatever block their
table row holds), so they cost a little arithmetic and touch nothing. The graphs read fixed input buffers; a
replay copies the step's arrays into them first. Decode attention's split count is fixed at capture by
max_model_len.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from tachyon.kernels.timing import median_replay_ms
from tachyon.layers.attention import AttentionMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, 1025, 32))
    sizes = [s for s in sizes if s <= max_num_seqs]
    if not sizes or sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def verify_sizes(max_num_seqs: int, q_len: int, max_tokens: int = 320) -> list[int]:
    """Batch sizes of the verification graphs: the decode sizes whose tokens fit max_tokens (their logits
    buffer holds every token's row: 320 x a 128k vocabulary in fp32 is 164 MB)."""
    return [s for s in capture_sizes(max_num_seqs) if s * q_len <= max(max_tokens, q_len)]


class CudaGraphs:
    def __init__(self, runner, sizes: list[int], q_len: int = 1):
        self.runner = runner
        self.sizes = sizes
        self.q_len = q_len
        self.pad_seq_len = 0 if q_len == 1 else q_len  # a padding row's context (see the module docstring)
        dev = runner.device
        max_bs = sizes[-1]
        max_t = max_bs * q_len
        max_len = runner.config.scheduler.max_model_len
        self.max_blocks = -(-max_len // runner.block_size)
        self.max_seq_len = max_len
        self.input_ids = torch.zeros(max_t, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_t, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_t,), -1, dtype=torch.long, device=dev)
        self.seq_lens = torch.full((max_bs,), self.pad_seq_len, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_bs, self.max_blocks, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=dev) * q_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # every graph writes its logits here, so the graphs' outputs don't pile up in the memory pool
        self.logits = torch.empty(max_t, runner.model.logits_size, dtype=torch.float32, device=dev)

    def _meta(self, bs: int) -> AttentionMetadata:
        t = bs * self.q_len
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:t], query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs],
            num_decodes=bs if self.q_len == 1 else 0, max_query_len=self.q_len, max_seq_len=self.max_seq_len)

    def _forward(self, bs: int) -> torch.Tensor:
        r = self.runner
        t = bs * self.q_len
        hidden = r.model(self.input_ids[:t], self.positions[:t], r.kv_caches, self._meta(bs), r.backend)
        self.logits[:t].copy_(r.model.compute_logits(hidden))

    @classmethod
    @torch.inference_mode()
    def capture(cls, runner, q_len: int = 1) -> CudaGraphs:
        """One graph per size. Where the runner has PDL (tachyon.kernels.pdl), each size is captured both with
        and without it and the faster replay is kept: PDL hides kernel-launch gaps, but it does not pay at
        every batch size (H200: 2% faster at batch 1, 10% slower at 4 and 16 in one measurement). Eager steps
        launch without it."""
        from tachyon.kernels import pdl

        max_num_seqs = runner.config.scheduler.max_num_seqs
        sizes = capture_sizes(max_num_seqs) if q_len == 1 else verify_sizes(max_num_seqs, q_len)
        self = cls(runner, sizes, q_len)
        self.replay_ms: dict[int, dict[str, float]] = {}  # per size, when both launch kinds were timed
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first, so the smaller graphs reuse its memory pool
                captured = {}
                for on in (False, True) if runner.pdl else (False,):
                    pdl.enable(on)
                    self._forward(bs)  # warm-up outside the graph: Triton compiles, workspaces get allocated
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        self._forward(bs)
                    pool = g.pool()
                    captured[on] = g
                use_pdl = False
                if runner.pdl:
                    ms = {kind: round(self._time_replay(captured[on], bs), 4)
                          for kind, on in (("plain", False), ("pdl", True))}
                    self.replay_ms[bs] = ms
                    use_pdl = ms["pdl"] < ms["plain"]
                self.graphs[bs] = captured[use_pdl]
        pdl.enable(False)  # eager steps launch plainly: PDL is only kept where a replay measured it faster
        self.seq_lens.fill_(self.pad_seq_len)  # what _time_replay left in the inputs
        self.block_tables.zero_()
        torch.cuda.current_stream().wait_stream(stream)
        return self

    @property
    def pdl_sizes(self) -> list[int]:
        """The sizes whose graph launches with PDL: where its replay measured faster than the plain one."""
        return [bs for bs, ms in self.replay_ms.items() if ms["pdl"] < ms["plain"]]

    def _time_replay(self, g: torch.cuda.CUDAGraph, bs: int) -> float:
        """Median replay time in ms, every row a 256-token context, or the longest the block table holds
        (a small --max-model-len); reads only: slot -1 writes nothing."""
        nb = min(-(-256 // self.runner.block_size), self.block_tables.shape[1])
        self.seq_lens[:bs] = min(256, nb * self.runner.block_size)
        self.block_tables[:bs, :nb] = torch.arange(bs * nb, device=self.block_tables.device,
                                                   dtype=torch.int32).view(bs, nb) % max(self.runner.num_blocks, 1)
        return median_replay_ms(g)

    def fits(self, batch: int) -> bool:
        return batch <= self.sizes[-1]

    def padded(self, batch: int) -> int:
        """The captured size a batch of this many sequences runs at."""
        return self.sizes[bisect.bisect_left(self.sizes, batch)]

    def replay(self, input_ids: torch.Tensor, positions: np.ndarray, slots: np.ndarray, seq_lens: np.ndarray,
               block_tables: np.ndarray) -> torch.Tensor:
        """One step of B sequences, q_len tokens each: input_ids [B * q_len] on the device (some may be the ids
        a step in flight samples), the rest host arrays (positions and slots per token, seq_lens and block
        tables per sequence). Each call stages through its own pinned buffer, so steps can be queued while
        earlier copies are pending. Returns logits [B * q_len, vocab]."""
        q = self.q_len
        B = len(seq_lens)
        bs = self.padded(B)
        T, t = B * q, bs * q
        stage = torch.empty(3, t, dtype=torch.long, pin_memory=True)
        st = stage.numpy()
        st[0, :T] = positions
        st[0, T:] = 0
        st[1, :T] = slots
        st[1, T:] = -1
        st[2, :B] = seq_lens
        st[2, B:bs] = self.pad_seq_len
        dev = self.input_ids.device
        staged = stage.to(dev, non_blocking=True)
        self.input_ids[:T].copy_(input_ids)
        self.positions[:t].copy_(staged[0])
        self.slot_mapping[:t].copy_(staged[1])
        self.seq_lens[:bs].copy_(staged[2, :bs])
        nb = block_tables.shape[1]
        bt = torch.from_numpy(block_tables).pin_memory()
        self.block_tables[:B, :nb].copy_(bt.to(dev, non_blocking=True))
        self.graphs[bs].replay()
        return self.logits[:T]
