"""Size the GPU KV pool: measure the peak memory of the largest step, give the rest to KV blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tachyon.interface import ScheduledSeq, SchedulerOutput
from tachyon.sampling_params import SamplingParams


@dataclass(eq=False)
class _ProfileSeq:
    """What the runner reads of a sequence, for a step that only measures memory."""

    token_ids: list[int]
    block_ids: list[int]
    sampling_params: SamplingParams
    generator: None = None
    grammar: None = None
    wants_prompt_logprobs: bool = False
    eos_token_ids: frozenset = frozenset()
    num_prompt_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)


def profile_step(cfg, bs: int) -> tuple[SchedulerOutput, int]:
    """The step the profile runs: max_num_batched_tokens prompt tokens over up to max_num_seqs sequences, sampled
    with every filter on; and the KV blocks a scratch cache needs to hold it."""
    tokens = cfg.scheduler.max_num_batched_tokens
    n_seqs = max(1, min(cfg.scheduler.max_num_seqs, tokens))
    # a scratch cache just big enough for the profile step
    scratch_blocks = n_seqs * (-(-max(1, tokens // n_seqs) // bs)) + n_seqs + 2
    seqs, next_block = [], 1
    per = tokens // n_seqs
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50)
    for i in range(n_seqs):
        n = per + (1 if i < tokens % n_seqs else 0)
        if n == 0:
            continue
        nblocks = -(-n // bs)
        r = _ProfileSeq([1] * n, list(range(next_block, next_block + nblocks)), sp, num_prompt_tokens=n)
        next_block += nblocks
        seqs.append(ScheduledSeq(r, 0, n, True))
    return SchedulerOutput(seqs=seqs), scratch_blocks


def kv_budget_bytes(total: int, utilization: float, non_torch: int, resident: int, peak: int, scratch: int,
                    graph_pool: bool, spec_bytes: int = 0) -> int:
    """Bytes the KV pool may take: total * utilization less what is not torch's, what stays resident (weights and
    buffers, allocated before the profile step), the profile step's activations (its peak less the resident bytes
    and its scratch cache), as much again for the piecewise graphs' pool when there is one (a pool holds a step's
    activations, not the weights), the verification graphs' logits (spec_bytes) and 256 MiB of slack."""
    activations = max(0, peak - scratch - resident)
    graphs = (activations if graph_pool else 0) + spec_bytes
    return int(total * utilization - non_torch - resident - activations - graphs - (256 << 20))


@torch.inference_mode()
def profile_num_blocks(runner) -> int:
    cfg = runner.config
    import gc

    gc.collect()  # engines dropped earlier in this process may still sit in reference cycles
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated()  # the weights and the runner's buffers
    sched, scratch_blocks = profile_step(runner.config, runner.block_size)
    runner.allocate_kv_cache(scratch_blocks)
    runner.collect(runner.submit(sched))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    scratch = runner._kv.numel() * runner._kv.element_size()
    runner._kv = None
    runner.kv_caches = []
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    non_torch = (total - free) - torch.cuda.memory_reserved()
    spec_bytes = 0
    if cfg.speculative is not None:  # the verification graphs' logits buffer and their pool's logits (<= 320 rows)
        from tachyon.worker.cuda_graphs import verify_sizes

        q = 1 + cfg.speculative.num_speculative_tokens
        spec_bytes = 2 * verify_sizes(cfg.scheduler.max_num_seqs, q)[-1] * q * runner.model.logits_size * 4
    budget = kv_budget_bytes(total, cfg.cache.gpu_memory_utilization, non_torch, resident, peak, scratch,
                             cfg.mixed_cuda_graphs, spec_bytes)
    n = int(budget // runner.kv_bytes_per_block())
    if n < 2:
        raise ValueError(f"no GPU memory left for the KV cache after weights and activations (peak "
                         f"{peak / 2**30:.1f} GiB of {total / 2**30:.1f}): raise gpu_memory_utilization or lower "
                         f"max_num_batched_tokens")
    runner.timings["profile_peak_gib"] = peak / 2**30
    runner.timings["profile_resident_gib"] = resident / 2**30
    runner.timings["kv_cache_gib"] = n * runner.kv_bytes_per_block() / 2**30
    return n
