import pytest
import torch
from torch import nn

from tachyon.kernels.fused_ops import fused_add_rms_norm, rotary, silu_and_mul, silu_and_mul_quant
from tachyon.kernels.scaled_linear import QUANTIZE_ONE_TILE, quantize_rows
from tachyon.layers.activation import silu_and_mul_ref
from tachyon.layers.norm import RMSNorm
from tachyon.layers.rotary import RotaryEmbedding
from tachyon.layers.triton_backend import install_fused_ops

# the 8-bit types a fused producer quantizes to: fp8 only on a GPU (the interpreter has no float8)
QTYPES = [torch.int8, pytest.param(torch.float8_e4m3fn, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the interpreter has no float8"))]

# the kernels round where the references round, so only last-bit differences (exp/rsqrt ulps) remain
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _norm(hidden: int, dtype, device) -> RMSNorm:
    norm = RMSNorm(hidden, eps=1e-5).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(hidden))
    return norm


@pytest.mark.parametrize("shape", [(1, 64), (7, 200), (3, 4, 32)])  # (3, 4, 32): per-head q/k norm
@pytest.mark.parametrize("with_residual", [False, True])
def test_fused_add_rms_norm(dtype, device, rel_err, shape, with_residual):
    torch.manual_seed(0)
    norm = _norm(shape[-1], dtype, device)
    x = (3 * torch.randn(shape)).to(device=device, dtype=dtype)
    res = torch.randn(shape).to(device=device, dtype=dtype) if with_residual else None
    ref = norm(x, res)
    out = fused_add_rms_norm(x, res, norm.weight, norm.eps)
    if with_residual:
        assert out[1].dtype == ref[1].dtype and out[1].shape == ref[1].shape
        assert rel_err(out[1], ref[1]) <= TOL[dtype]
        ref, out = ref[0], out[0]
    else:
        assert out[1] is None
        out = out[0]
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert rel_err(out, ref) <= TOL[dtype]


def test_fused_add_rms_norm_strided_input(device, rel_err):
    norm = _norm(48, torch.float32, device)
    x = torch.randn(5, 96, device=device)[:, :48]  # row stride 96
    res = torch.randn(5, 48, device=device)
    out, new_res = fused_add_rms_norm(x, res, norm.weight, norm.eps)
    ref, ref_res = norm(x, res)
    assert rel_err(out, ref) <= 1e-6 and rel_err(new_res, ref_res) <= 1e-6


@pytest.mark.parametrize("shape", [(1, 64), (9, 2 * 300), (2, 3, 2 * 1500)])
def test_silu_and_mul(dtype, device, rel_err, shape):
    torch.manual_seed(0)
    x = (4 * torch.randn(shape)).to(device=device, dtype=dtype)
    out = silu_and_mul(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_and_activation_quantize_their_rows_as_quantize_rows(dtype, device, qtype, with_residual):
    # what the fp8/w8a8 linear after them would compute from their output, bit for bit, dynamic and static scales;
    # the output itself unchanged
    torch.manual_seed(0)
    norm = _norm(200, dtype, device)
    x = (3 * torch.randn(7, 200)).to(device=device, dtype=dtype)
    res = torch.randn(7, 200).to(device=device, dtype=dtype) if with_residual else None
    g = (4 * torch.randn(5, 2 * 300)).to(device=device, dtype=dtype)
    for scale in (None, torch.tensor([0.03], device=device)):
        out, new_res, (q, s) = fused_add_rms_norm(x, res, norm.weight, norm.eps, (qtype, scale))
        plain, plain_res = fused_add_rms_norm(x, res, norm.weight, norm.eps)
        assert torch.equal(out, plain) and (new_res is None if res is None else torch.equal(new_res, plain_res))
        q_ref, s_ref = quantize_rows(out, qtype, scale)
        assert q.dtype == qtype and torch.equal(q.view(torch.int8), q_ref.view(torch.int8)) and torch.equal(s, s_ref)
        act, (q, s) = silu_and_mul_quant(g, qtype, scale)
        assert torch.equal(act, silu_and_mul(g))
        q_ref, s_ref = quantize_rows(act, qtype, scale)
        assert torch.equal(q.view(torch.int8), q_ref.view(torch.int8)) and torch.equal(s, s_ref)


def test_activation_rows_longer_than_one_tile_take_two_launches(device):
    g = torch.randn(2, 2 * (QUANTIZE_ONE_TILE + 8), device=device)
    act, (q, s) = silu_and_mul_quant(g, torch.int8)
    assert torch.equal(act, silu_and_mul(g))
    q_ref, s_ref = quantize_rows(act, torch.int8)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", [(4, 1, 32), (3, 3, 64), (8, 2, 128)])
def test_rotary_on_fused_qkv_views(dtype, device, rel_err, num_q_heads, num_kv_heads, head_dim):
    torch.manual_seed(0)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    rope = RotaryEmbedding(head_dim, 512, 500000.0, scaling).to(device)
    T = 11
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(T, q_size + 2 * kv_size).to(device=device, dtype=dtype)
    q = qkv[:, :q_size].view(T, num_q_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(T, num_kv_heads, head_dim)
    v_before = qkv[:, q_size + kv_size:].clone()
    positions = torch.randint(0, 512, (T,), device=device)
    q_ref, k_ref = rope(positions, q, k)
    q_out, k_out = rotary(positions, q, k, rope.cos_sin_cache)
    assert rel_err(q_out, q_ref) <= TOL[dtype]
    assert rel_err(k_out, k_ref) <= TOL[dtype]
    assert torch.equal(qkv[:, q_size + kv_size:], v_before)  # v untouched


def test_install_fused_ops(device):
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(32)
            self.rotary = RotaryEmbedding(16, 64, 10000.0, None)
            self.mlp = nn.Module()
            self.mlp.act = silu_and_mul_ref

    model = install_fused_ops(Tiny())
    assert model.norm.fused is fused_add_rms_norm
    assert model.rotary.fused is rotary
    assert model.mlp.act is silu_and_mul


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", [(4, 1, 32), (6, 3, 64), (8, 2, 128)])
def test_rotary_write_kv_equals_rotary_then_write(make_batch, dtype, device, num_q_heads, num_kv_heads, head_dim):
    """One kernel for both gives bit for bit what rotary followed by the KV write gives, padding included."""
    from tachyon.kernels.fused_ops import rotary_write_kv
    from tachyon.layers.attention import write_kv_ref

    torch.manual_seed(1)
    q, k, v, k_cache, v_cache, meta = make_batch([(1, 20), (7, 40), (19, 19)], num_q_heads, num_kv_heads, head_dim,
                                                 dtype, num_padding=2)
    rope = RotaryEmbedding(head_dim, 256, 10000.0, None).to(device)
    positions = torch.randint(0, 256, (q.shape[0],), device=device)
    q1, k1, kc1, vc1 = q.clone(), k.clone(), k_cache.clone(), v_cache.clone()
    q_ref, k_ref = rotary(positions, q1, k1, rope.cos_sin_cache)
    write_kv_ref(k_ref, v, kc1, vc1, meta.slot_mapping)
    rotary_write_kv(positions, q, k, v, rope.cos_sin_cache, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(k_cache, kc1) and torch.equal(v_cache, vc1)  # padding (slot -1) wrote nothing
