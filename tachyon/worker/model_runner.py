"""Turns a scheduled step into tensors, queues one forward over the packed batch and its sampling, and hands
the sampled tokens over when the host collects them (the runner side of tachyon.interface).

Decodes (one new token) go first in the batch, then prefill chunks, as the attention kernels expect. A
decode whose input token is still being sampled by a step in flight reads it from that step's ids on the
device, so steps are queued back to back without the host in between.

A sequence that speculates (1 + k new tokens: its last token and k proposals) sits with the prefill chunks: its
k + 1 positions give k + 1 rows of logits, which tachyon.worker.spec_decode verifies. With CUDA graphs, a step
where every sequence verifies k proposals replays a whole-step graph of its own (CudaGraphs with q_len 1 + k);
a step that mixes them with other tokens replays the piecewise graphs (any token count) or runs eagerly.

Under tensor parallelism (`tp`) every rank has a runner over its shard of the model and of the KV pool (its KV
heads, the same block ids). Rank 0's is the engine's: each step it sends the batch arrays to the other ranks
once (one small message over the CPU group, `StepMessage`) and broadcasts the input ids on the device; every
rank then runs the same forward, meeting in its all-reduces, and only rank 0 samples. The other ranks sit in
`serve_steps` until rank 0 sends None. Start-up (KV calibration, the GPU profile, graph captures) runs the
same code on every rank, so its collectives pair up without messages.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from tachyon.config import EngineConfig, kv_cache_bytes_per_token
from tachyon.interface import ModelRunnerOutput, RunnerFault, ScheduledSeq, SchedulerOutput
from tachyon.layers.attention import AttentionMetadata, get_attention_backend
from tachyon.layers.parallel import TensorParallel
from tachyon.models.loader import iter_weight_slices, iter_weights, random_weights_
from tachyon.models.registry import model_class
from tachyon.worker.prompt_logprobs import PromptLogprobs, PromptRows, compute_prompt_logprobs, prompt_rows
from tachyon.worker.sampler import DeviceSample, Sampler
from tachyon.worker.spec_decode import verify

logger = logging.getLogger("tachyon")

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
    sample_reqs: list
    num_outputs: list[int]  # per sampled row: output tokens before the one it samples
    placeholders: list[tuple[int, object]]  # (token index in the batch, sequence) whose id is on the device
    # the last len(drafts) sampled rows verify these proposals (k + 1 logits rows each, after the others' one)
    drafts: list[list[int]]
    prompt_rows: PromptRows | None = None  # prompt positions whose logprobs the step reports (prompt_logprobs)


@dataclass
class StepMessage:
    """What rank 0 sends the other ranks once per step: the swaps and the batch arrays (no sequences; the input
    ids follow on the device, where pending ones are filled in)."""

    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    inputs: StepInputs


@dataclass
class _InFlight:
    """A submitted step: what collect waits for."""

    reqs: list
    sample: DeviceSample | None  # on the host side: pinned copies (CUDA) or the tensors themselves (CPU)
    event: torch.cuda.Event | None
    num_accepted: torch.Tensor | None = None  # per sampled row (speculative decoding), beside `sample`
    prompt: PromptLogprobs | None = None  # prompt logprobs (host copies on CUDA, as `sample`)
    deferred: tuple | None = None  # (logits, inputs) of a step whose sampling waits for sample_deferred


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str | None, load_format: str = "auto",
                 tp: TensorParallel | None = None):
        self.config = config
        self.tp = tp
        self.is_driver = tp is None or tp.is_driver  # the rank that samples and answers the engine
        self.serving = False  # rank 0 of several: start-up is over, the other ranks wait for step messages
        self._mid_step = False  # rank 0: a step's collectives began and did not all end
        self.workers = None  # rank 0: what watches the other ranks' processes (tachyon.distributed)
        self.device = config.device
        self.dtype = config.dtype
        self.block_size = config.cache.block_size
        t0 = time.perf_counter()
        quant = config.model.quantization
        if quant is not None and quant.method == "awq" and quant.checkpoint_format == "dense" and load_format != "dummy":
            raise ValueError(f"--quantization awq needs an AWQ checkpoint (AutoAWQ, compressed-tensors W4A16, or what "
                             f"`tachyon quantize --method awq` writes); {model_path} is dense: quantize it first, or run "
                             f"it with --quantization int8, which quantizes a dense checkpoint while it loads")
        cls = model_class(config.model)
        max_pos = max(config.scheduler.max_model_len, config.model.max_position_embeddings)
        with torch.device("meta"):  # no time spent initialising weights that are overwritten anyway
            model = cls(config.model, max_positions=max_pos, **({"tp": tp} if tp is not None else {}))
        model = model.to_empty(device=self.device).to(self.dtype)
        model.finish_init(self.device)
        if load_format == "dummy":
            random_weights_(model, seed=config.seed)
        else:
            model.load_weights(iter_weights(model_path) if tp is None else iter_weight_slices(model_path))
        self.model = model.eval()
        self.load_time_s = time.perf_counter() - t0
        self.kv_dtype = config.cache.dtype
        self.kv_scales: list[tuple[float, float]] = []  # per layer (k_scale, v_scale) of an fp8 cache
        if self.kv_dtype.itemsize == 1:
            from tachyon.worker.kv_scales import calibrate_kv_scales

            self.kv_scales = calibrate_kv_scales(self.model, config.model.vocab_size, self.device, seed=config.seed)
        self.backend = get_attention_backend(config.attention_backend)
        self.sampler = Sampler(config.model.vocab_size, self.device, seed=config.seed)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0
        self.cuda_graphs = None  # tachyon.worker.cuda_graphs.CudaGraphs once captured
        self.verify_graphs = None  # the same for speculative decoding's steps of 1 + k tokens per sequence
        self.piecewise_graphs = None  # tachyon.worker.piecewise_graphs.PiecewiseGraphs once captured
        self.timings: dict[str, float] = {"load_weights_s": self.load_time_s}
        self._in_flight: deque[_InFlight] = deque()
        # the device ids each sequence's latest sampled token sits in (read by a step queued behind it)
        self._sampled_on_device: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.swap_buffer: torch.Tensor | None = None
        self.pdl = False
        if config.attention_backend == "triton":
            from tachyon.kernels import pdl

            # whether the decode graphs may try PDL (cuda_graphs.CudaGraphs.capture); eager steps and everything
            # before the capture launch plainly, so the profile run compiles the kernel variants they use
            self.pdl = config.enable_pdl and pdl.supported(self.device)
            pdl.enable(False)
        if self.device.type == "cuda" and config.attention_backend == "triton":
            from tachyon.layers.triton_backend import install_fused_ops

            install_fused_ops(self.model)
        if self.device.type == "cuda":
            from tachyon.layers.linear import awq_kmajor_wanted, repack_awq_kmajor

            # the tensor-core INT4 kernels (kernels/awq_mma.py) for the AWQ layers: Hopper's default
            if awq_kmajor_wanted(torch.cuda.get_device_capability(self.device)):
                n = repack_awq_kmajor(self.model)
                if n:
                    logger.info("%d AWQ layers repacked K-major (TACHYON_AWQ_MMA=0 keeps the natural layout)", n)

    # -- KV cache ---------------------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        return kv_cache_bytes_per_token(self.model.cfg, self.kv_dtype) * self.block_size

    def agree_num_blocks(self, num_blocks: int) -> int:
        """The KV pool's block count every rank can hold (block ids are shared; each rank has its own heads)."""
        return num_blocks if self.tp is None else self.tp.min_over_ranks(num_blocks)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        m = self.model.cfg
        shape = (m.num_layers, 2, num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        # zeros, not empty: masked-out padding still enters SDPA's weighted sum (0 * NaN = NaN)
        self._kv = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.kv_caches = [(self._kv[i, 0], self._kv[i, 1]) for i in range(m.num_layers)]
        self.num_blocks = num_blocks

    def allocate_swap_space(self, num_cpu_blocks: int) -> None:
        """Host memory for preempted sequences' KV ([layers, 2, cpu blocks, block, heads, dim]), pinned on a GPU."""
        if num_cpu_blocks <= 0:
            self.swap_buffer = None
            return
        m = self.model.cfg
        self.swap_buffer = torch.empty((m.num_layers, 2, num_cpu_blocks, self.block_size, m.num_kv_heads, m.head_dim),
                                       dtype=self._kv_raw().dtype, pin_memory=self.device.type == "cuda")

    def _kv_raw(self) -> torch.Tensor:
        """The pool as swap copies move it: bytes for an fp8 cache (fp8 has no index kernels on the CPU)."""
        return self._kv.view(torch.uint8) if self.kv_dtype.itemsize == 1 else self._kv

    def request_generator(self, seed: int) -> torch.Generator:
        return self.sampler.request_generator(seed)

    # -- one step ---------------------------------------------------------------------------------------
    def prepare(self, seqs: list[ScheduledSeq]) -> StepInputs:
        """Host-side batch arrays, decodes first (stable order otherwise)."""
        bs = self.block_size
        ordered = sorted(seqs, key=lambda s: s.num_new_tokens != 1)
        S = len(ordered)
        q_lens = np.fromiter((s.num_new_tokens for s in ordered), dtype=np.int64, count=S)
        starts = np.fromiter((s.start for s in ordered), dtype=np.int64, count=S)
        T = int(q_lens.sum())
        num_decodes = int(np.argmax(q_lens != 1)) if (q_lens != 1).any() else S
        max_blocks = max(len(s.seq.block_ids) for s in ordered)
        block_tables = np.zeros((S, max_blocks), dtype=np.int32)
        placeholders = []
        for i, s in enumerate(ordered):
            block_tables[i, : len(s.seq.block_ids)] = s.seq.block_ids
        if num_decodes == S:  # the common case: one token each, no per-token Python loop
            input_ids = np.zeros(S, dtype=np.int64)
            for i, s in enumerate(ordered):
                toks = s.seq.token_ids
                if s.start < len(toks):
                    input_ids[i] = toks[s.start]
                else:
                    placeholders.append((i, s.seq))
            positions = starts
        else:
            input_ids = np.zeros(T, dtype=np.int64)
            positions = np.empty(T, dtype=np.int64)
            o = 0
            for s, st, n in zip(ordered, starts.tolist(), q_lens.tolist(), strict=True):
                toks = s.seq.token_ids
                known = max(0, min(n, len(toks) - st))
                input_ids[o:o + known] = toks[st:st + known]
                if s.spec_token_ids:  # its last known token, then the proposals
                    input_ids[o + known:o + n] = s.spec_token_ids
                elif known < n:  # only a decode's single token can be pending (a step in flight samples it)
                    assert n - known == 1, "a step's input may lack at most its last token"
                    placeholders.append((o + known, s.seq))
                positions[o:o + n] = np.arange(st, st + n)
                o += n
        seq_idx = np.repeat(np.arange(S), q_lens)
        slots = block_tables[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
        qsl = np.zeros(S + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qsl[1:])
        sample = [i for i, s in enumerate(ordered) if s.sample and not s.spec_token_ids]
        spec = [i for i, s in enumerate(ordered) if s.spec_token_ids]
        logits_indices = qsl[1:][sample] - 1
        if spec:  # every verified position of a speculating sequence, after the plain rows
            logits_indices = np.concatenate([logits_indices] + [
                np.arange(qsl[i + 1] - 1 - len(ordered[i].spec_token_ids), qsl[i + 1]) for i in spec])
        sample += spec
        return StepInputs(
            input_ids=input_ids, positions=positions, slot_mapping=slots, query_start_loc=qsl,
            seq_lens=(starts + q_lens).astype(np.int32), block_tables=block_tables, num_decodes=num_decodes,
            q_lens=q_lens.tolist(), logits_indices=logits_indices.astype(np.int64),
            sample_reqs=[ordered[i].seq for i in sample],
            num_outputs=[ordered[i].start + ordered[i].num_new_tokens - len(ordered[i].spec_token_ids)
                         - ordered[i].seq.num_prompt_tokens for i in sample],
            placeholders=placeholders, drafts=[ordered[i].spec_token_ids for i in spec],
            prompt_rows=prompt_rows(ordered, qsl))

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _input_ids(self, x: StepInputs) -> torch.Tensor:
        """The step's input ids on the device, pending ones taken from the steps in flight that sample them."""
        ids = self._to_device(x.input_ids)
        if not x.placeholders:
            return ids
        by_source: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}
        for dst, seq in x.placeholders:
            src, row = self._sampled_on_device[seq]
            by_source.setdefault(id(src), (src, [], []))
            by_source[id(src)][1].append(dst)
            by_source[id(src)][2].append(row)
        if self.device.type != "cuda":
            ids = ids.clone()  # from_numpy shares the host array
        for src, dst, rows in by_source.values():
            ids[self._to_device(np.array(dst, dtype=np.int64))] = src[self._to_device(np.array(rows, dtype=np.int64))]
        return ids

    def _metadata(self, x: StepInputs) -> AttentionMetadata:
        s_lens = x.seq_lens.tolist()
        return AttentionMetadata(
            slot_mapping=self._to_device(x.slot_mapping), query_start_loc=self._to_device(x.query_start_loc),
            seq_lens=self._to_device(x.seq_lens), block_tables=self._to_device(x.block_tables),
            num_decodes=x.num_decodes, max_query_len=max(x.q_lens), max_seq_len=max(s_lens),
            query_lens_cpu=x.q_lens, seq_lens_cpu=s_lens)

    def _swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        if swap_out:
            dev, cpu = zip(*swap_out, strict=True)
            self.swap_buffer[:, :, list(cpu)] = self._kv_raw()[:, :, list(dev)].to(self.swap_buffer.device)
        if swap_in:
            cpu, dev = zip(*swap_in, strict=True)
            self._kv_raw()[:, :, list(dev)] = self.swap_buffer[:, :, list(cpu)].to(self.device, non_blocking=True)

    @property
    def fault(self) -> str | None:
        """Why this runner cannot go on (a tensor-parallel worker is gone), else None."""
        return self.workers.fault if self.workers is not None else None

    @torch.inference_mode()
    def submit(self, sched: SchedulerOutput) -> _InFlight:
        """Queue one step: swap copies, the forward, the sampling. Returns without waiting for the device."""
        x = self.prepare(sched.seqs)
        if not self.serving:
            self._swap(sched.swap_out, sched.swap_in)
            logits, prompt = self._forward(x, self._input_ids(x))
        else:  # rank 0 of several: a failure inside the collectives leaves the ranks out of step for good
            if self.fault is not None:
                raise RunnerFault(self.fault)
            try:
                self._mid_step = True
                rows = x.prompt_rows and dataclasses.replace(x.prompt_rows, seqs=[])
                self.tp.broadcast_object(StepMessage(sched.swap_out, sched.swap_in, dataclasses.replace(
                    x, sample_reqs=[], num_outputs=[], placeholders=[], drafts=[], prompt_rows=rows)))
                self._swap(sched.swap_out, sched.swap_in)
                logits, prompt = self._forward(x, self._input_ids(x))
                self._mid_step = False
            except Exception as e:
                why = self.workers.wait_for_fault(1.0) if self.workers is not None else None
                raise RunnerFault(f"a tensor-parallel step failed ({why or f'{type(e).__name__}: {e}'}); the "
                                  f"ranks are out of step, the engine stops") from e
        handle = _InFlight(x.sample_reqs, None, None)
        if self.is_driver:
            if prompt is not None:
                handle.prompt = prompt.with_tensors(self._to_host(prompt.tensors()))
            if x.sample_reqs and sched.defer_sampling:
                handle.deferred = (logits, x)
            elif x.sample_reqs:
                self._queue_sample(handle, logits, x)
            if handle.prompt is not None and handle.event is None and self.device.type == "cuda":
                handle.event = torch.cuda.Event()
                handle.event.record()
        self._in_flight.append(handle)
        return handle

    def _forward(self, x: StepInputs, input_ids: torch.Tensor) -> tuple[torch.Tensor | None, PromptLogprobs | None]:
        """The step's forward on this rank: the logits of its sampled rows (rank 0's whole, others' shards), and
        the prompt logprobs its rows ask for (rank 0; None on the others)."""
        if self.tp is not None:
            self.tp.broadcast(input_ids)  # rank 0's, with the pending ids filled in from its steps in flight
        graphs = self.cuda_graphs
        prompt = None  # prompt logprobs: the full graph returns no hidden states, so such a step runs without it
        verify = self.verify_graphs
        if (graphs is not None and x.num_decodes == len(x.q_lens) and graphs.fits(len(x.q_lens))
                and x.prompt_rows is None):
            logits = graphs.replay(input_ids, x.positions, x.slot_mapping, x.seq_lens, x.block_tables)
            if len(x.logits_indices) != len(x.q_lens):
                logits = logits[self._to_device(x.logits_indices)]
        elif (verify is not None and x.prompt_rows is None and verify.fits(len(x.q_lens))
              and len(x.logits_indices) == len(x.positions) and all(q == verify.q_len for q in x.q_lens)):
            # every sequence verifies k proposals (all its rows sampled, in order): the whole step is a graph.
            # Decided from the arrays alone, so tensor-parallel ranks (which get no drafts) take the same path.
            logits = verify.replay(input_ids, x.positions, x.slot_mapping, x.seq_lens, x.block_tables)
        else:
            pw = self.piecewise_graphs
            if pw is not None and pw.fits(len(x.positions)):
                hidden = pw.replay(input_ids, x.positions, x.slot_mapping, self._metadata(x))
            else:
                hidden = self.model(input_ids, self._to_device(x.positions), self.kv_caches, self._metadata(x),
                                    self.backend)
            logits = (self.model.compute_logits(hidden[self._to_device(x.logits_indices)])
                      if len(x.logits_indices) else None)  # every rank: the LM head's gather is a collective
            if x.prompt_rows is not None:
                prompt = compute_prompt_logprobs(self.model, hidden, x.prompt_rows, self.config.model.vocab_size,
                                                 self.is_driver)
        return logits, prompt

    def sample_deferred(self, handle: _InFlight) -> None:
        """Queue the sampling of a step submitted with `defer_sampling`, once every step before it has landed
        (the host knows their tokens: grammars and outputs are up to date). Its forward may still be running."""
        if handle.deferred is not None:
            logits, x = handle.deferred
            handle.deferred = None
            with torch.inference_mode():
                self._queue_sample(handle, logits, x)

    def _queue_sample(self, handle: _InFlight, logits: torch.Tensor, x: StepInputs) -> None:
        sample, num_accepted = self._sample(logits, x)
        for row, seq in enumerate(x.sample_reqs):
            self._sampled_on_device[seq] = (sample.token_ids, row)
        if self.device.type == "cuda":  # the copies and their event queue right behind this step's sampling
            host = self._to_host(sample.tensors() + ([num_accepted] if num_accepted is not None else []))
            if num_accepted is not None:
                num_accepted = host.pop()
            handle.sample = sample.with_tensors(host)
            handle.event = torch.cuda.Event()
            handle.event.record()
        else:
            handle.sample = sample
        handle.num_accepted = num_accepted

    @torch.inference_mode()
    def serve_steps(self) -> None:
        """Ranks other than 0: run rank 0's steps on this shard until it sends None."""
        self.serving = True
        while (msg := self.tp.broadcast_object()) is not None:
            self._swap(msg.swap_out, msg.swap_in)
            self._forward(msg.inputs, self._to_device(msg.inputs.input_ids))

    def shutdown(self) -> None:
        """Rank 0: let the other ranks go (they leave serve_steps), wait for the processes it started, leave the
        group. Once; also at exit. After a step that broke off midway the ranks are out of step: no message then
        (a spawned rank ends when this process does, a launched one when its collective fails)."""
        if self.tp is None or not self.serving:
            return
        self.serving = False
        atexit.unregister(self.shutdown)  # tachyon.build registered it (and with it, this runner)
        if self.fault is None and not self._mid_step:
            try:
                self.tp.broadcast_object(None)
            except Exception as e:  # a rank already gone
                logger.warning("telling the tensor-parallel ranks to stop failed: %s", e)
        if self.workers is not None:
            self.workers.close()
        self.tp.destroy()

    def _to_host(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Pinned host copies queued behind the step (CUDA); on the CPU the tensors themselves."""
        if self.device.type != "cuda":
            return tensors
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for h, t in zip(host, tensors, strict=True):
            h.copy_(t, non_blocking=True)
        return host

    def _sample(self, logits: torch.Tensor, x: StepInputs) -> tuple[DeviceSample, torch.Tensor | None]:
        """The step's sampling: plain rows by the sampler, then the speculating sequences' verification
        (their tokens after the plain rows' ids, no logprobs). Also how many proposals each row accepted."""
        if not x.drafts:
            return self.sampler.sample(logits, x.sample_reqs, x.num_outputs), None
        n_plain = len(x.sample_reqs) - len(x.drafts)
        plain = self.sampler.sample(logits[:n_plain], x.sample_reqs[:n_plain], x.num_outputs[:n_plain])
        tokens, accepted = verify(self.sampler, logits[n_plain:], x.sample_reqs[n_plain:], x.drafts,
                                  x.num_outputs[n_plain:])
        sample = DeviceSample(torch.cat([plain.token_ids, tokens]), plain.want_logprobs + [None] * len(x.drafts),
                              plain.chosen, plain.top_vals, plain.top_ids)
        return sample, torch.cat([torch.zeros(n_plain, dtype=accepted.dtype, device=accepted.device), accepted])

    def collect(self, handle: _InFlight) -> ModelRunnerOutput | None:
        """The sampled tokens of a submitted step (the oldest one not yet collected); waits for it to land."""
        oldest = self._in_flight.popleft()
        assert oldest is handle, "steps are collected in the order they were submitted"
        assert handle.deferred is None, "a step's deferred sampling is queued before it is collected"
        if handle.sample is None and handle.prompt is None:
            return None
        if handle.event is not None:
            handle.event.synchronize()
        prompt = handle.prompt.to_host() if handle.prompt is not None else None
        if handle.sample is None:  # a prompt chunk that samples nothing but reports prompt logprobs
            return ModelRunnerOutput([], [], [], [], prompt_logprobs=prompt)
        out = handle.sample.to_output()
        accepted = handle.num_accepted.tolist() if handle.num_accepted is not None else None
        return ModelRunnerOutput(handle.reqs, out.token_ids, out.logprobs, out.sampled_logprobs, num_accepted=accepted,
                                 sampled_ranks=out.sampled_ranks, prompt_logprobs=prompt)

    def drop_in_flight(self) -> None:
        """Forget every step not yet collected (after a failure the engine cannot pin on one request)."""
        self._in_flight.clear()

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
        self._compile_attention_variants()
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
        spec = self.config.speculative
        if spec is not None:
            t0 = time.perf_counter()
            self.verify_graphs = CudaGraphs.capture(self, q_len=1 + spec.num_speculative_tokens)
            torch.cuda.synchronize()
            self.timings["verify_graph_capture_s"] = time.perf_counter() - t0
        if self.config.mixed_cuda_graphs:
            from tachyon.worker.piecewise_graphs import PiecewiseGraphs

            t0 = time.perf_counter()
            try:
                self.piecewise_graphs = PiecewiseGraphs.capture(self)
            except Exception:  # a start-up that works beats a faster one that does not
                logger.exception("capturing piecewise CUDA graphs failed; steps with prefill tokens run eagerly")
                self.piecewise_graphs = None
                torch.cuda.synchronize()
            self.timings["piecewise_graph_capture_s"] = time.perf_counter() - t0
            pw = self.piecewise_graphs
            if pw is not None:
                self.timings["piecewise_buckets"] = float(len(pw.sizes))
                if pw.costs:
                    fine = [s for s in pw.sizes if s in pw.costs]
                    logger.info("piecewise buckets from %d to %d tokens by measured cost: %s", min(pw.costs),
                                max(pw.costs), " ".join(f"{s}:{pw.costs[s]:.2f}ms" for s in fine))
            if self.piecewise_graphs is not None and self.piecewise_graphs.calibration:
                c = self.piecewise_graphs.calibration
                self.timings["piecewise_eager_from_tokens"] = float(c["eager_from"])
                self.timings["eager_launch_ms"] = c["launch_ms"]
                logger.info("mixed steps from %d tokens run eagerly at their own size where a bucket pads them "
                            "(%.4f ms a token on the device, %.1f ms to launch an eager forward)", c["eager_from"],
                            c["per_token_ms"], c["launch_ms"])

    def _compile_attention_variants(self) -> None:
        """The attention kernels that eager and mixed steps launch outside any graph, compiled now, not by the
        first request that needs them (a compile stalls its step 0.1-1 s): decode at every split count (eager
        steps pick it from the batch) and prefill. The block table's width is not specialized on, so any width
        compiles the variant every step runs."""
        from tachyon.kernels.decode_attention import decode_attention
        from tachyon.kernels.paged_attention import prefill_attention

        m = self.model.cfg
        k_cache, v_cache = self.kv_caches[0]
        q = torch.randn(16, m.num_heads, m.head_dim, dtype=self.dtype, device=self.device)
        bt = torch.zeros(1, 4, dtype=torch.int32, device=self.device)
        lens = torch.ones(1, dtype=torch.int32, device=self.device)
        for splits in (1, 2, 4, 8, 16, 32, 64):  # plain launches (PDL is only ever on inside graph captures)
            decode_attention(q[:1], k_cache, v_cache, bt, lens, 1.0, 64, num_splits=splits)
        qsl = torch.tensor([0, 16], dtype=torch.int32, device=self.device)
        prefill_attention(q, k_cache, v_cache, bt, qsl, lens * 16, 1.0, 16)
