"""The paged KV cache's bookkeeping: a block pool with reference counts and a prefix cache of hashed blocks.

    request tokens:  [t0 .. t15][t16 .. t31][t32 t33 t34 _ _ ...]
    block table:       block 7     block 2     block 9 (partly filled)
    slot of token p:   block_table[p // block_size] * block_size + p % block_size

A full block is named by a hash chained over its parent's hash and its own tokens, so equal prefixes give
equal hashes. Freed blocks keep their hash and stay findable until the pool hands them out again, least
recently freed first. Block 0 is a null block that is never handed out: padded slots point at it.

The manager is the one owner of block state: block tables, reference counts, prefix-cache names, the forks of
n > 1, and the CPU swap space's blocks. The scheduler asks it (allocate, fork, swap_out, swap_in, free) and
reads values back; the runner only copies the data the manager's decisions name.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tachyon.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    tokens: tuple[int, ...] | None = None  # kept with the hash to guard against collisions


def hash_block(parent_hash: int | None, tokens: tuple[int, ...], extra: object = None) -> int:
    return hash((parent_hash, tokens, extra))


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"the KV cache has room for {num_blocks} blocks; it needs at least 2: raise its memory budget")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.blocks[0].ref_cnt = 1  # the null block, never freed
        # Free blocks in eviction order: the first is handed out (and loses its hash) first.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.num_evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def allocate(self) -> Block:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = block.tokens = None
            self.num_evictions += 1
        block.ref_cnt = 1
        return block

    def touch(self, block_id: int) -> None:
        """Take a reference to a block another request (or the prefix cache) already holds."""
        block = self.blocks[block_id]
        if block.ref_cnt == 0:
            del self.free[block_id]
        block.ref_cnt += 1

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_cnt -= 1
        assert block.ref_cnt >= 0, f"block {block_id} released more often than taken"
        if block.ref_cnt == 0:
            self.free[block_id] = None

    def lookup(self, block_hash: int, tokens: tuple[int, ...]) -> int | None:
        block_id = self.cached.get(block_hash)
        if block_id is None or self.blocks[block_id].tokens != tokens:
            return None
        return block_id

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block's name (all free blocks stay free); False, changing nothing, while any block
        is in use: a running request's blocks may be named and looked up again."""
        if any(b.ref_cnt for b in self.blocks[1:]):
            return False
        for block in self.blocks:
            block.block_hash = block.tokens = None
        self.cached.clear()
        return True

    def register(self, block_id: int, block_hash: int, tokens: tuple[int, ...]) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self.cached:
            return  # already named, or an identical block computed by another request holds the name
        block.block_hash, block.tokens = block_hash, tokens
        self.cached[block_hash] = block_id


class KVCacheManager:
    """Gives requests blocks for the tokens they will compute; finds cached prefixes; takes blocks back."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, min_swap_tokens: int = 64):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        # CPU swap space: ids of host blocks (the runner holds the buffer), and who holds which
        self.cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu_held: dict[Sequence, list[int]] = {}
        self.min_swap_tokens = min_swap_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # prompt tokens found

    # -- accounting -------------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks - 1  # the null block is not usable

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -----------------------------------------------------------------------------------
    def _update_block_hashes(self, req: Sequence, upto_tokens: int) -> None:
        bs = self.block_size
        while (len(req.block_hashes) + 1) * bs <= upto_tokens:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if i else None
            req.block_hashes.append(hash_block(parent, tuple(req.token_ids[i * bs:(i + 1) * bs])))

    def count_prefix_query(self, num_tokens: int, hit_tokens: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += hit_tokens

    def find_cached_prefix(self, req: Sequence, count: bool = True) -> list[int]:
        """Block ids of the longest cached prefix of req's tokens; never covers the last token. `count=False`
        leaves the query out of the hit-rate counters (the scheduler counts a request once, when admitted)."""
        if not self.enable_prefix_caching:
            return []
        limit = req.num_tokens - 1
        self._update_block_hashes(req, limit)
        bs = self.block_size
        hits = []
        for i in range(limit // bs):
            block_id = self.pool.lookup(req.block_hashes[i], tuple(req.token_ids[i * bs:(i + 1) * bs]))
            if block_id is None:
                break
            hits.append(block_id)
        if count:
            self.count_prefix_query(req.num_tokens, len(hits) * bs)
        return hits

    def cache_computed_blocks(self, req: Sequence) -> None:
        """Name the blocks whose tokens are now all computed, so later requests can find them."""
        if not self.enable_prefix_caching:
            return
        # only tokens known on the host can be hashed (the input of a step in flight may still be pending)
        full = min(req.num_computed_tokens, len(req.token_ids)) // self.block_size
        if full <= req.num_registered_blocks:
            return
        self._update_block_hashes(req, full * self.block_size)
        bs = self.block_size
        for i in range(req.num_registered_blocks, full):
            self.pool.register(req.block_ids[i], req.block_hashes[i], tuple(req.token_ids[i * bs:(i + 1) * bs]))
        req.num_registered_blocks = full

    # -- allocation ---------------------------------------------------------------------------------------
    def can_allocate(self, req: Sequence, num_new_tokens: int, shared_blocks: list[int] = ()) -> bool:
        have = len(req.block_ids) + len(shared_blocks)
        need = self.blocks_needed(req.num_computed_tokens + len(shared_blocks) * self.block_size + num_new_tokens) - have
        # shared blocks that sit in the free list leave it when taken
        taken_from_free = sum(1 for b in shared_blocks if self.pool.blocks[b].ref_cnt == 0)
        return need + taken_from_free <= self.num_free_blocks

    def allocate(self, req: Sequence, num_new_tokens: int, shared_blocks: list[int] = ()) -> bool:
        """Give req the blocks for num_new_tokens more tokens (after taking shared_blocks as its prefix)."""
        if not shared_blocks and req.num_computed_tokens + num_new_tokens <= len(req.block_ids) * self.block_size:
            return True  # the common decode step: the token's slot is in a block it already holds
        if not self.can_allocate(req, num_new_tokens, shared_blocks):
            return False
        for b in shared_blocks:
            self.pool.touch(b)
        req.block_ids.extend(shared_blocks)
        if shared_blocks:
            req.num_computed_tokens += len(shared_blocks) * self.block_size
        need = self.blocks_needed(req.num_computed_tokens + num_new_tokens) - len(req.block_ids)
        for _ in range(need):
            req.block_ids.append(self.pool.allocate().block_id)
        return True

    def shrink(self, req: Sequence, num_tokens: int) -> None:
        """Keep only the blocks that num_tokens tokens need; give back the tail (rejected speculative tokens,
        or proposals a step did not use). A kept block's stale slots are written again before anything reads them.

            before:  [block 7: 12 valid][block 2: 3 valid, 1 rejected][block 9: 4 rejected]
            shrink(num_tokens=15) ─► [block 7][block 2]           block 9 back to the pool
        """
        keep = self.blocks_needed(num_tokens)
        assert keep >= req.num_registered_blocks, "a block named in the prefix cache holds computed tokens"
        while len(req.block_ids) > keep:
            self.pool.release(req.block_ids.pop())

    def free(self, req: Sequence) -> None:
        """Give back every block req holds, on the device and in the swap space."""
        # Tail blocks first, so they are evicted before the prefix blocks other requests are likelier to reuse.
        for b in reversed(req.block_ids):
            self.pool.release(b)
        req.block_ids = []
        req.num_registered_blocks = 0
        cpu = self.cpu_held.pop(req, None)
        if cpu:
            self.cpu_free.extend(reversed(cpu))

    # -- n > 1 ---------------------------------------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares the parent's full prompt blocks (the last prompt token is computed by each)."""
        shared = parent.block_ids[: (parent.num_prompt_tokens - 1) // self.block_size]
        for b in shared:
            self.pool.touch(b)
        child.block_ids = list(shared)
        child.block_hashes = parent.block_hashes[: len(shared)]
        child.num_registered_blocks = len(shared)
        child.num_computed_tokens = len(shared) * self.block_size
        child.num_cached_tokens = parent.num_cached_tokens

    # -- CPU swap space ----------------------------------------------------------------------------------
    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self.cpu_free)

    def should_swap(self, req: Sequence) -> bool:
        """Swap out rather than recompute: long enough that two copies cost less, and the space has room."""
        return req.num_computed_tokens >= self.min_swap_tokens and 0 < len(req.block_ids) <= len(self.cpu_free)

    def swap_out(self, req: Sequence) -> list[tuple[int, int]]:
        """Park req's KV in the swap space: (device block, CPU block) pairs to copy before the next forward
        (its device blocks are free from now on; the copies run before anything reuses them)."""
        cpu = [self.cpu_free.pop() for _ in req.block_ids]
        pairs = list(zip(req.block_ids, cpu, strict=True))
        held = cpu
        self.free(req)
        self.cpu_held[req] = held
        return pairs

    def can_swap_in(self, req: Sequence) -> bool:
        return self.blocks_needed(req.num_computed_tokens) <= self.num_free_blocks

    def swap_in(self, req: Sequence) -> list[tuple[int, int]]:
        """Give req device blocks again for its parked KV: (CPU block, device block) pairs to copy."""
        cpu = self.cpu_held.pop(req)
        dev = [self.pool.allocate().block_id for _ in cpu]
        req.block_ids = list(dev)
        self.cpu_free.extend(reversed(cpu))
        return list(zip(cpu, dev, strict=True))

    # -- invariants ---------------------------------------------------------------------------------------
    def check_integrity(self, live: list[Sequence] = ()) -> None:
        """Reference counts equal the number of live requests holding each block; free list = refcount 0."""
        counts = [0] * self.pool.num_blocks
        counts[0] = 1
        for req in live:
            for b in req.block_ids:
                counts[b] += 1
        for block in self.pool.blocks:
            assert block.ref_cnt == counts[block.block_id], (
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by {counts[block.block_id]}")
            assert (block.ref_cnt == 0) == (block.block_id in self.pool.free), f"block {block.block_id} free-list mismatch"
        for h, b in self.pool.cached.items():
            assert self.pool.blocks[b].block_hash == h
        held = [c for cpu in self.cpu_held.values() for c in cpu]
        assert len(held) + len(self.cpu_free) == self.num_cpu_blocks and not set(held) & set(self.cpu_free), \
            "swap space blocks lost or held twice"
