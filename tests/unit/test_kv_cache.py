"""Block accounting, prefix-cache hits and eviction order on tiny pools, with exact block ids."""

from __future__ import annotations

import pytest

from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.sequence import Sequence
from tachyon.outputs import RequestMetrics
from tachyon.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(seq_id=rid, request_id=rid, index=0, prompt_token_ids=tokens, sampling_params=SamplingParams(),
                   max_tokens=16, eos_token_ids=frozenset(), metrics=RequestMetrics(arrival_time=0.0))


def _compute_all(kv: KVCacheManager, req: Sequence) -> None:
    shared = kv.find_cached_prefix(req)
    n = req.num_tokens - len(shared) * kv.block_size
    assert kv.allocate(req, n, shared)
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)


def test_allocation_and_free_return_every_block():
    kv = KVCacheManager(num_blocks=9, block_size=4, enable_prefix_caching=False)
    assert kv.num_blocks == 8 and kv.num_free_blocks == 8  # block 0 is the null block
    a, b = _req("a", list(range(10))), _req("b", list(range(100, 105)))
    assert kv.allocate(a, 10) and a.block_ids == [1, 2, 3]
    assert kv.allocate(b, 5) and b.block_ids == [4, 5]
    kv.check_integrity([a, b])
    assert not kv.can_allocate(_req("c", list(range(20))), 20)  # 5 blocks > 3 free
    kv.free(a)
    kv.free(b)
    kv.check_integrity([])
    assert kv.num_free_blocks == 8


def test_prefix_hit_never_covers_last_token_and_shares_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(12)))
    _compute_all(kv, a)
    assert a.block_ids == [1, 2, 3]
    # same 12 tokens: only 2 full blocks may hit (the last token must be computed to get logits)
    b = _req("b", list(range(12)))
    assert kv.find_cached_prefix(b) == [1, 2]
    c = _req("c", list(range(8)) + [99, 98, 97, 96, 95])
    hits = kv.find_cached_prefix(c)
    assert hits == [1, 2]
    assert kv.allocate(c, c.num_tokens - 8, hits)
    assert c.num_computed_tokens == 8 and c.block_ids[:2] == [1, 2]
    assert kv.pool.blocks[1].ref_cnt == 2
    kv.check_integrity([a, c])
    kv.free(a)
    kv.free(c)
    kv.check_integrity([])
    assert kv.num_free_blocks == kv.num_blocks


def test_eviction_order_is_lru_with_tail_blocks_first():
    kv = KVCacheManager(num_blocks=7, block_size=2)  # 6 usable blocks
    a = _req("a", [1, 2, 3, 4, 5, 6, 7])  # blocks 1,2,3 full, 4 partial
    _compute_all(kv, a)
    assert a.block_ids == [1, 2, 3, 4]
    kv.free(a)  # freed tail first: free order is 5, 6, then 4, 3, 2, 1
    assert list(kv.pool.free) == [5, 6, 4, 3, 2, 1]
    b = _req("b", [50, 51, 52, 53, 54])  # needs 3 blocks: takes 5, 6 (never hashed) then evicts 4 (no hash)
    assert kv.allocate(b, 5) and b.block_ids == [5, 6, 4]
    assert kv.pool.num_evictions == 0
    c = _req("c", [60, 61, 62])  # 2 blocks: evicts 3 (hash of a's 3rd block), then 2
    assert kv.allocate(c, 3) and c.block_ids == [3, 2]
    assert kv.pool.num_evictions == 2
    d = _req("d", [1, 2, 3, 4, 5, 6, 7])
    assert kv.find_cached_prefix(d) == [1]  # only the first block survived


def test_hash_collision_is_guarded():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    a = _req("a", [1, 2, 3])
    _compute_all(kv, a)
    # forge: make another block's tokens collide with block 1's hash entry
    h = a.block_hashes[0]
    kv.pool.blocks[1].tokens = (9, 9)
    b = _req("b", [1, 2, 3])
    b.block_hashes = [h]
    assert kv.find_cached_prefix(b) == []


def test_too_small_pool_is_an_error():
    with pytest.raises(ValueError, match="at least 2"):
        KVCacheManager(num_blocks=1, block_size=16)
