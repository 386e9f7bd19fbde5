"""Turns a scheduled step into tensors, runs one forward over the packed batch, samples.

Decodes (one new token) go first in the batch, then prefill chunks, as the attention kernels expect.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from tachyon.config import EngineConfig, kv_cache_bytes_per_token
from tachyon.engine.request import Request
from tachyon.engine.scheduler import ScheduledSeq, SchedulerOutput
from tachyon.layers.attention import AttentionMetadata, get_attention_backend
from tachyon.models.loader import iter_weights, random_weights_
from tachyon.models.registry import model_class
from tachyon.worker.sampler import Sampler, SamplerOutput


@dataclass
class StepInputs:
    """One step's batch on the host: per-token arrays [T], per-sequence arrays [S] (decodes first)."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    num_decodes: int
    q_lens: list[int]
    logits_indices: np.ndarray
    sample_reqs: list[Request]


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str | None, load_format: str = "auto"):
        self.config = config
        self.device = config.device
        self.dtype = config.dtype
        self.block_size = config.cache.block_size
        t0 = time.perf_counter()
        cls = model_class(config.model)
        max_pos = max(config.scheduler.max_model_len, config.model.max_position_embeddings)
        with torch.device("meta"):  # no time spent initialising weights that are overwritten anyway
            model = cls(config.model, max_positions=max_pos)
        model = model.to_empty(device=self.device).to(self.dtype)
        model.finish_init(self.device)
        if load_format == "dummy":
            random_weights_(model, seed=config.seed)
        else:
            model.load_weights(iter_weights(model_path))
        self.model = model.eval()
        self.load_time_s = time.perf_counter() - t0
        self.backend = get_attention_backend(config.attention_backend)
        self.sampler = Sampler(config.model.vocab_size, self.device, seed=config.seed)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0
        self.cuda_graphs = None  # tachyon.worker.cuda_graphs.CudaGraphs once captured
        self.timings: dict[str, float] = {"load_weights_s": self.load_time_s}
        self.pdl = False
        if config.attention_backend == "triton":
            from tachyon.kernels import pdl

            # whether the decode graphs may try PDL (cuda_graphs.CudaGraphs.capture); eager steps and everything
            # before the capture launch plainly, so the profile run compiles the kernel variants they use
            self.pdl = config.enable_pdl and pdl.supported(self.device)
            pdl.enable(False)
        if self.device.type == "cuda" and config.attention_backend == "triton":
            from tachyon.kernels.attention_backend import install_fused_ops

            install_fused_ops(self.model)

    # -- KV cache ---------------------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        return kv_cache_bytes_per_token(self.config.model, self.dtype) * self.block_size

    def allocate_kv_cache(self, num_blocks: int) -> None:
        m = self.config.model
        shape = (m.num_layers, 2, num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        # zeros, not empty: masked-out padding still enters SDPA's weighted sum (0 * NaN = NaN)
        self._kv = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.kv_caches = [(self._kv[i, 0], self._kv[i, 1]) for i in range(m.num_layers)]
        self.num_blocks = num_blocks

    # -- one step ---------------------------------------------------------------------------------------
    def prepare(self, seqs: list[ScheduledSeq]) -> StepInputs:
        """Host-side batch arrays, decodes first (stable order otherwise)."""
        bs = self.block_size
        ordered = sorted(seqs, key=lambda s: s.num_new_tokens != 1)
        S = len(ordered)
        q_lens = np.fromiter((s.num_new_tokens for s in ordered), dtype=np.int64, count=S)
        starts = np.fromiter((s.req.num_computed_tokens for s in ordered), dtype=np.int64, count=S)
        T = int(q_lens.sum())
        num_decodes = int(np.argmax(q_lens != 1)) if (q_lens != 1).any() else S
        max_blocks = max(len(s.req.block_ids) for s in ordered)
        block_tables = np.zeros((S, max_blocks), dtype=np.int32)
        for i, s in enumerate(ordered):
            block_tables[i, : len(s.req.block_ids)] = s.req.block_ids
        if num_decodes == S:  # the common case: one token each, no per-token Python loop
            input_ids = np.fromiter((s.req.token_ids[s.req.num_computed_tokens] for s in ordered), dtype=np.int64,
                                    count=S)
            positions = starts
        else:
            input_ids = np.empty(T, dtype=np.int64)
            positions = np.empty(T, dtype=np.int64)
            o = 0
            for s, st, n in zip(ordered, starts.tolist(), q_lens.tolist()):
                input_ids[o:o + n] = s.req.token_ids[st:st + n]
                positions[o:o + n] = np.arange(st, st + n)
                o += n
        seq_idx = np.repeat(np.arange(S), q_lens)
        slots = block_tables[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
        qsl = np.zeros(S + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qsl[1:])
        sample = [i for i, s in enumerate(ordered) if s.sample]
        return StepInputs(
            input_ids=input_ids, positions=positions, slot_mapping=slots, query_start_loc=qsl,
            seq_lens=(starts + q_lens).astype(np.int32), block_tables=block_tables, num_decodes=num_decodes,
            q_lens=q_lens.tolist(), logits_indices=(qsl[1:][sample] - 1).astype(np.int64),
            sample_reqs=[ordered[i].req for i in sample])

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _metadata(self, x: StepInputs) -> AttentionMetadata:
        s_lens = x.seq_lens.tolist()
        return AttentionMetadata(
            slot_mapping=self._to_device(x.slot_mapping), query_start_loc=self._to_device(x.query_start_loc),
            seq_lens=self._to_device(x.seq_lens), block_tables=self._to_device(x.block_tables),
            num_decodes=x.num_decodes, max_query_len=max(x.q_lens), max_seq_len=max(s_lens),
            query_lens_cpu=x.q_lens, seq_lens_cpu=s_lens)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[Request], SamplerOutput | None]:
        x = self.prepare(out.seqs)
        graphs = self.cuda_graphs
        if graphs is not None and x.num_decodes == len(x.q_lens) and graphs.fits(len(x.q_lens)):
            logits = graphs.replay(x)
            logits = logits[torch.from_numpy(x.logits_indices).to(self.device)] if len(x.sample_reqs) != len(x.q_lens) else logits
        else:
            hidden = self.model(self._to_device(x.input_ids), self._to_device(x.positions), self.kv_caches,
                                self._metadata(x), self.backend)
            if not x.sample_reqs:
                return x.sample_reqs, None
            logits = self.model.compute_logits(hidden[self._to_device(x.logits_indices)])
        if not x.sample_reqs:
            return x.sample_reqs, None
        return x.sample_reqs, self.sampler(logits, x.sample_reqs)

    def start_decode_run(self, sched: SchedulerOutput):
        """A decode-only batch as a run of forwards queued ahead of the host (tachyon.worker.decode_run)."""
        from tachyon.worker.decode_run import DecodeRun

        return DecodeRun(self, sched)

    # -- GPU: memory profile, warm-up, CUDA graphs ----------------------------------------------------------
    @torch.inference_mode()
    def profile_num_blocks(self) -> int:
        """Run the largest step once (a full token budget of prefill, then sampling max_num_seqs rows) on a
        scratch cache, and give the KV pool what is left under gpu_memory_utilization."""
        from tachyon.worker.gpu_profile import profile_num_blocks

        t0 = time.perf_counter()
        n = profile_num_blocks(self)
        self.timings["profile_s"] = time.perf_counter() - t0
        return n

    def warm_up(self) -> None:
        if self.device.type != "cuda" or self.config.enforce_eager or self.config.attention_backend != "triton":
            return
        from tachyon.worker.cuda_graphs import CudaGraphs

        t0 = time.perf_counter()
        self._compile_decode_variants()
        self.timings["kernel_warmup_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        from tachyon.kernels.gemv import tune_linears
        from tachyon.worker.cuda_graphs import capture_sizes

        # small-batch linears: the skinny-GEMM kernel where it beats cuBLAS on these very weights (timed with
        # plain launches; the graphs then try PDL on top)
        self.gemv_report = tune_linears(self.model, capture_sizes(self.config.scheduler.max_num_seqs))
        self.timings["gemv_tune_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.cuda_graphs = CudaGraphs.capture(self)
        torch.cuda.synchronize()
        self.timings["cuda_graph_capture_s"] = time.perf_counter() - t0

    def _compile_decode_variants(self) -> None:
        """Eager steps pick the decode split count from the batch; compile every variant now, not mid-run."""
        from tachyon.kernels.decode_attention import decode_attention

        m = self.config.model
        k_cache, v_cache = self.kv_caches[0]
        q = torch.randn(1, m.num_heads, m.head_dim, dtype=self.dtype, device=self.device)
        bt = torch.zeros(1, 4, dtype=torch.int32, device=self.device)
        lens = torch.ones(1, dtype=torch.int32, device=self.device)
        for splits in (1, 2, 4, 8, 16, 32, 64):  # plain launches (PDL is only ever on inside graph captures)
            decode_attention(q, k_cache, v_cache, bt, lens, 1.0, 64, num_splits=splits)

    # -- swap space support --------------------------------------------------------------------------------
    def copy_blocks_to(self, src_ids: list[int], dst: torch.Tensor, dst_ids: list[int]) -> None:
        """Device blocks -> a host buffer of shape [layers, 2, n, block, heads, dim]."""
        dst[:, :, dst_ids] = self._kv[:, :, src_ids].to(dst.device)

    def copy_blocks_from(self, src: torch.Tensor, src_ids: list[int], dst_ids: list[int]) -> None:
        self._kv[:, :, dst_ids] = src[:, :, src_ids].to(self.device, non_blocking=True)
