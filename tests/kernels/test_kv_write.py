import pytest
import torch

from tachyon.kernels.kv_write import write_kv
from tachyon.layers.attention import write_kv_ref


@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 64), (3, 32), (1, 128)])
def test_write_kv_matches_reference(make_batch, dtype, num_kv_heads, head_dim):
    # decodes, a chunk over a cached prefix, a fresh prefill, and 3 padding tokens (slot -1)
    q, k, v, k_cache, v_cache, meta = make_batch([(1, 20), (1, 5), (7, 40), (19, 19)], 2 * num_kv_heads,
                                                 num_kv_heads, head_dim, dtype, num_padding=3)
    assert not k.is_contiguous() and not v.is_contiguous()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_ref(k, v, k_ref, v_ref, meta.slot_mapping)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(k_cache, k_ref)  # written slots match and no other slot was touched
    assert torch.equal(v_cache, v_ref)


def test_write_kv_casts_to_cache_dtype(make_batch, device):
    _, k, v, k_cache, v_cache, meta = make_batch([(5, 9)], 2, 2, 32, torch.float32)
    k_cache, v_cache = k_cache.half(), v_cache.half()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_ref(k, v, k_ref, v_ref, meta.slot_mapping)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_write_kv_empty(device):
    cache = torch.randn(2, 16, 1, 32, device=device)
    x = torch.empty(0, 1, 32, device=device)
    write_kv(x, x, cache, cache.clone(), torch.empty(0, dtype=torch.int64, device=device))
