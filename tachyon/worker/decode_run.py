"""Decode runs: forwards of one batch queued on the device ahead of the host's bookkeeping.

When every running sequence decodes with plain sampling and nobody waiting could be admitted, the engine
turns the step into a run: step j's input ids are step j-1's sampled ids, which never leave the device, and
everything else a step needs (positions, KV slots, context lengths) is known on the host in advance. The
engine keeps up to `num_scheduler_steps` steps queued; while the GPU computes them, the host consumes the
oldest step's ids (stop checks, detokenization, streaming outputs) and queues the next, so the GPU never
waits for the host and every token still reaches its stream as soon as its step lands.

    host:   launch 0 1 2 | wait 0, outputs, launch 3 | wait 1, outputs, launch 4 | ...
    device:      [ 0 ][ 1 ][ 2 ][ 3 ][ 4 ] ...

A sequence the host knows to be done when it queues a step (it finished, was aborted, or has no tokens left
by then) rides along as a dead row: position 0, KV slot -1 (nothing written), context 1 (the null block), so
it touches no one's KV; its sampled ids are ignored.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from tachyon.layers.attention import AttentionMetadata


class DecodeRun:
    def __init__(self, runner, sched):
        self.runner = runner
        self.sched = sched  # the engine's SchedulerOutput for this batch (each consumed step updates it once)
        x = runner.prepare(sched.seqs)
        assert x.num_decodes == len(x.q_lens) == len(x.sample_reqs), "a decode run takes decodes that sample"
        self.reqs = x.sample_reqs
        self.size = S = len(self.reqs)
        max_len = runner.config.scheduler.max_model_len
        self.base = x.positions.astype(np.int64)  # position of each row's input token at step 0
        # steps 0 .. remaining-1 give a row its tokens; later steps would run past max_tokens or the context
        self.remaining = np.fromiter((min(r.max_tokens - r.num_output_tokens, max_len - r.num_tokens)
                                      for r in self.reqs), dtype=np.int64, count=S)
        self.block_tables = x.block_tables
        self.num_blocks = np.fromiter((len(r.block_ids) for r in self.reqs), dtype=np.int64, count=S)
        self._bt_changed = True
        self._first_ids = x.input_ids
        self._ids: torch.Tensor | None = None  # the latest launched step's sampled ids, on the device
        self._pending: deque = deque()
        self.launched = 0
        self.consumed = 0
        self.stopped = False  # no more steps will be queued; the ones in flight are still consumed
        graphs = runner.cuda_graphs
        self.graphs = graphs if graphs is not None and graphs.fits(S) else None
        self.cuda = runner.device.type == "cuda"

    @property
    def in_flight(self) -> int:
        return self.launched - self.consumed

    def live_rows(self) -> np.ndarray:
        """Which rows the next step to launch computes for real."""
        done = np.fromiter((r.is_finished for r in self.reqs), dtype=bool, count=self.size)
        return ~done & (self.remaining > self.launched)

    def worth_running(self, num_live: int) -> bool:
        """A large batch that has thinned out runs faster rescheduled: the GEMMs shrink with the batch."""
        if self.size <= 16:
            return True
        if self.graphs is not None:
            return self.graphs.padded(num_live) == self.graphs.padded(self.size)
        return num_live * 8 >= self.size * 7

    def rows_needing_blocks(self, live: np.ndarray) -> np.ndarray:
        """Live rows whose slot in the next step lies past the blocks the run knows of."""
        pos = self.base + self.launched
        return np.nonzero(live & (pos // self.runner.block_size >= self.num_blocks))[0]

    def note_blocks(self, rows) -> None:
        """The engine gave these rows more blocks: take their new block table rows."""
        for i in rows:
            ids = self.reqs[i].block_ids
            if len(ids) > self.block_tables.shape[1]:
                wider = np.zeros((self.size, len(ids)), dtype=np.int32)
                wider[:, : self.block_tables.shape[1]] = self.block_tables
                self.block_tables = wider
            self.block_tables[i, : len(ids)] = ids
            self.num_blocks[i] = len(ids)
        self._bt_changed = True

    @torch.inference_mode()
    def launch(self, live: np.ndarray) -> None:
        """Queue the next step; its blocks are already allocated."""
        r = self.runner
        bs = r.block_size
        S = self.size
        j = self.launched
        pos = np.where(live, self.base + j, 0)
        col = np.minimum(pos // bs, self.block_tables.shape[1] - 1)
        blk = self.block_tables[np.arange(S), col].astype(np.int64)
        slots = np.where(live, blk * bs + pos % bs, -1)
        lens = np.where(live, pos + 1, 1).astype(np.int32)
        ids = self._first_ids if j == 0 else self._ids
        if self.graphs is not None:
            bt = self.block_tables if self._bt_changed else None
            logits = self.graphs.replay_decode(ids, pos, slots, lens, bt)
        else:
            meta = AttentionMetadata(
                slot_mapping=r._to_device(slots), query_start_loc=r._to_device(np.arange(S + 1, dtype=np.int32)),
                seq_lens=r._to_device(lens), block_tables=r._to_device(self.block_tables), num_decodes=S,
                max_query_len=1, max_seq_len=int(lens.max()), query_lens_cpu=[1] * S, seq_lens_cpu=lens.tolist())
            input_ids = r._to_device(ids) if isinstance(ids, np.ndarray) else ids
            hidden = r.model(input_ids, r._to_device(pos), r.kv_caches, meta, r.backend)
            logits = r.model.compute_logits(hidden)
        self._bt_changed = False
        self._ids = step_ids = r.sampler.sample_tokens(logits, self.reqs)
        if self.cuda:  # the copy and its event queue right behind this step's sampling
            host = torch.empty(S, dtype=torch.long, pin_memory=True)
            host.copy_(step_ids, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._pending.append((host, ev))
        else:
            self._pending.append(step_ids.tolist())
        self.launched += 1

    def next_ids(self) -> list[int]:
        """The oldest queued step's sampled ids (one per row, in `reqs` order); waits for it to land."""
        item = self._pending.popleft()
        self.consumed += 1
        if not self.cuda:
            return item
        host, ev = item
        ev.synchronize()
        return host.tolist()
