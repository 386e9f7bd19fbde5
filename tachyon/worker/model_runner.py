"""Turns a scheduled step into tensors, runs one forward over the packed batch, samples.

Decodes (one new token) go first in the batch, then prefill chunks, as the attention kernels expect.
"""

from __future__ import annotations

import time

import torch

from tachyon.config import EngineConfig, kv_cache_bytes_per_token
from tachyon.engine.request import Request
from tachyon.engine.scheduler import ScheduledSeq, SchedulerOutput
from tachyon.layers.attention import AttentionMetadata, get_attention_backend
from tachyon.models.loader import iter_weights, random_weights_
from tachyon.models.registry import model_class
from tachyon.worker.sampler import Sampler, SamplerOutput


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
    def prepare(self, seqs: list[ScheduledSeq]):
        """Host-side batch tensors. Returns (input_ids, positions, meta, logits_indices, sampling reqs)."""
        bs = self.block_size
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].num_new_tokens != 1)  # decodes first, stable
        ordered = [seqs[i] for i in order]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_lens: list[int] = []
        s_lens: list[int] = []
        logits_idx: list[int] = []
        sample_reqs: list[Request] = []
        max_blocks = 1
        for s in ordered:
            req, n = s.req, s.num_new_tokens
            start = req.num_computed_tokens
            input_ids.extend(req.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            bt = req.block_ids
            slots.extend(bt[p // bs] * bs + p % bs for p in range(start, start + n))
            q_lens.append(n)
            s_lens.append(start + n)
            max_blocks = max(max_blocks, len(bt))
            if s.sample:
                logits_idx.append(len(input_ids) - 1)
                sample_reqs.append(req)
        block_tables = torch.zeros(len(ordered), max_blocks, dtype=torch.int32)
        for i, s in enumerate(ordered):
            if s.req.block_ids:
                block_tables[i, : len(s.req.block_ids)] = torch.tensor(s.req.block_ids, dtype=torch.int32)
        qsl = [0]
        for q in q_lens:
            qsl.append(qsl[-1] + q)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(dev, non_blocking=True),
            seq_lens=torch.tensor(s_lens, dtype=torch.int32).to(dev, non_blocking=True),
            block_tables=block_tables.to(dev, non_blocking=True),
            num_decodes=sum(1 for q in q_lens if q == 1),
            max_query_len=max(q_lens),
            max_seq_len=max(s_lens),
            query_lens_cpu=q_lens,
            seq_lens_cpu=s_lens,
        )
        ids = torch.tensor(input_ids, dtype=torch.long).to(dev, non_blocking=True)
        pos = torch.tensor(positions, dtype=torch.long).to(dev, non_blocking=True)
        return ids, pos, meta, torch.tensor(logits_idx, dtype=torch.long).to(dev, non_blocking=True), sample_reqs

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[Request], SamplerOutput | None]:
        ids, pos, meta, logits_idx, sample_reqs = self.prepare(out.seqs)
        hidden = self.model(ids, pos, self.kv_caches, meta, self.backend)
        if not sample_reqs:
            return sample_reqs, None
        logits = self.model.compute_logits(hidden[logits_idx])
        return sample_reqs, self.sampler(logits, sample_reqs)

    # -- swap space support --------------------------------------------------------------------------------
    def copy_blocks_to(self, src_ids: list[int], dst: torch.Tensor, dst_ids: list[int]) -> None:
        """Device blocks -> a host buffer of shape [layers, 2, n, block, heads, dim]."""
        dst[:, :, dst_ids] = self._kv[:, :, src_ids].to(dst.device)

    def copy_blocks_from(self, src: torch.Tensor, src_ids: list[int], dst_ids: list[int]) -> None:
        self._kv[:, :, dst_ids] = src[:, :, src_ids].to(self.device, non_blocking=True)
