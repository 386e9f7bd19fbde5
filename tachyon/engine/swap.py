"""CPU swap space: a preempted sequence's KV blocks are parked in (pinned) host memory and copied back when
there is room, instead of being recomputed. Recompute stays the fallback when the swap space is full, and
for short sequences, where recomputing costs less than two copies."""

from __future__ import annotations

import torch

from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.request import Request


class SwapSpace:
    def __init__(self, num_blocks: int, block_shape: tuple[int, ...], dtype: torch.dtype, pin: bool,
                 min_swap_tokens: int = 64):
        # [layers, 2, cpu blocks, block_size, kv heads, head dim], same layout as the device pool
        self.buffer = torch.empty((block_shape[0], 2, num_blocks, *block_shape[1:]), dtype=dtype, pin_memory=pin)
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.num_blocks = num_blocks
        self.min_swap_tokens = min_swap_tokens
        self.held: dict[Request, list[int]] = {}  # request -> its CPU blocks, in block-table order
        self._pending_out: list[tuple[list[int], list[int]]] = []
        self._pending_in: list[tuple[list[int], list[int]]] = []

    @classmethod
    def create(cls, runner, swap_space_gib: float, min_swap_tokens: int = 64) -> SwapSpace | None:
        per_block = runner.kv_bytes_per_block()
        n = int(swap_space_gib * (1 << 30) // per_block)
        if n == 0:
            return None
        m = runner.config.model
        n = min(n, 1 << 20)
        shape = (m.num_layers, runner.block_size, m.num_kv_heads, m.head_dim)
        return cls(n, shape, runner.dtype, pin=runner.device.type == "cuda", min_swap_tokens=min_swap_tokens)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def should_swap(self, req: Request, kv: KVCacheManager) -> bool:
        return req.num_computed_tokens >= self.min_swap_tokens and len(req.block_ids) <= self.num_free_blocks

    def swap_out(self, req: Request, kv: KVCacheManager) -> list[int]:
        cpu = [self.free_ids.pop() for _ in req.block_ids]
        self._pending_out.append((list(req.block_ids), cpu))
        self.held[req] = cpu
        kv.free(req)  # the device blocks may be reused this very step: apply() copies them out first
        return cpu

    def can_swap_in(self, req: Request, kv: KVCacheManager) -> bool:
        return kv.blocks_needed(req.num_tokens) <= kv.num_free_blocks

    def swap_in(self, req: Request, kv: KVCacheManager) -> list[int]:
        cpu = self.held.pop(req)
        dev = [kv.pool.allocate().block_id for _ in cpu]
        req.block_ids = list(dev)  # the scheduler appends to the table; the copy list must not grow with it
        self._pending_in.append((cpu, dev))
        self.free_ids.extend(reversed(cpu))
        return dev

    def discard(self, req: Request) -> None:
        cpu = self.held.pop(req, None)
        if cpu:
            self.free_ids.extend(reversed(cpu))

    def apply(self, runner, sched) -> None:
        """Do this step's copies before the forward: outs first (their device blocks may be reused now)."""
        for dev, cpu in self._pending_out:
            runner.copy_blocks_to(dev, self.buffer, cpu)
        for cpu, dev in self._pending_in:
            runner.copy_blocks_from(self.buffer, cpu, dev)
        self._pending_out.clear()
        self._pending_in.clear()
