import pytest
import torch
import torch.nn.functional as F
import triton

from tachyon.kernels.quant_linear import (
    AWQ_CONFIGS,
    INT8_CONFIGS,
    awq_dequantize,
    awq_linear,
    awq_linear_ref,
    gemv_split_k,
    int8_linear,
    int8_linear_ref,
    pack_int4,
    row_bucket,
    split_k,
    unpack_int4,
)
from tachyon.kernels.quant_ref import dequantize_int4

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}
ROWS = [1, 3, 16, 17, 40]  # one row, skinny, the skinny edge, GEMM
# every case runs the default and a config that splits K (on 3 rows, also one-row tiles, late reduce and a split);
# on the GPU, bf16 without bias also runs every candidate (each config is one compile per dtype and bias)
SPLIT_CONFIG = {"one_row": (1, 128, 64, 2, 4, 4, True), "few": (1, 128, 64, 2, 4, 4, True),
                "skinny": (16, 64, 64, 2, 4, 4), "gemm": (32, 64, 64, 2, 4, 3), "prefill": (32, 64, 64, 2, 4, 3)}


def _configs(table: dict, m: int, device: str, dtype, bias: bool) -> list:
    bucket = row_bucket(m)
    cfgs = [None, SPLIT_CONFIG[bucket]] + ([SPLIT_CONFIG["one_row"]] if m == 3 else [])
    if device == "cuda" and dtype == torch.bfloat16 and not bias:
        cfgs += table[bucket] + (table["one_row"] if m <= 3 else [])
    return cfgs


def _strided(m: int, k: int, dtype, device) -> torch.Tensor:
    return torch.randn(m, k + 24).to(device=device, dtype=dtype)[:, :k]  # rows 24 elements apart


def _random_awq(k: int, n: int, g: int, dtype, device):
    q = torch.randint(0, 16, (k, n))
    z = torch.randint(0, 16, (k // g, n))
    z[0, :2] = torch.tensor([0, 15])  # both ends of the zero-point range
    s = torch.randn(k // g, n) * 0.02  # both signs
    return q, z, s.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------------- packing


def test_pack_int4_known_word():
    # nibble j holds column j: 0x87654321
    row = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    packed = pack_int4(row)
    assert packed.dtype == torch.int32 and packed.shape == (1, 1)
    assert packed.item() == 0x87654321 - 2**32  # the top nibble is >= 8: the int32 is negative
    assert pack_int4(torch.tensor([[15, 0, 0, 0, 0, 0, 0, 0]])).item() == 15
    assert pack_int4(torch.tensor([[0] * 7 + [15]])).item() == 0xF0000000 - 2**32
    assert unpack_int4(packed).tolist() == row.tolist()


def test_pack_unpack_round_trip(device):
    torch.manual_seed(0)
    v = torch.randint(0, 16, (5, 64), device=device)
    v[0] = 15  # every nibble set, sign bit included
    v[1, 7::8] = 8  # only the top nibble's high bit
    packed = pack_int4(v)
    assert packed.shape == (5, 8) and packed.dtype == torch.int32 and packed.device == v.device
    assert torch.equal(unpack_int4(packed), v.to(torch.int32))
    assert (packed[0] == -1).all()


def test_pack_int4_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_int4(torch.zeros(2, 12, dtype=torch.int32))
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.full((1, 8), 16))
    with pytest.raises(TypeError):
        pack_int4(torch.zeros(1, 8))


# ----------------------------------------------------------------------------------------------- references


@pytest.mark.parametrize("bias", [False, True])
def test_int8_ref_is_dequantized_linear(dtype, device, rel_err, bias):
    torch.manual_seed(0)
    x = torch.randn(5, 48).to(device=device, dtype=dtype)
    qw = torch.randint(-128, 128, (24, 48), dtype=torch.int8, device=device)
    s = (torch.randn(24) * 0.01).to(device=device, dtype=dtype)
    b = torch.randn(24).to(device=device, dtype=dtype) if bias else None
    w = torch.stack([qw[n].float() * s[n].float() for n in range(24)])
    ref = F.linear(x.float(), w, b.float() if bias else None)
    out = int8_linear_ref(x, qw, s, b)
    assert out.shape == (5, 24) and out.dtype == dtype
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("bias", [False, True])
def test_awq_ref_is_dequantized_matmul(dtype, device, rel_err, bias):
    torch.manual_seed(0)
    k, n, g = 128, 24, 32
    q, z, s = _random_awq(k, n, g, dtype, device)
    x = torch.randn(5, k).to(device=device, dtype=dtype)
    b = torch.randn(n).to(device=device, dtype=dtype) if bias else None
    w = torch.empty(k, n)
    for row in range(k):  # the definition, one row at a time
        w[row] = (q[row] - z[row // g]).float() * s[row // g].float().cpu()
    ref = x.float() @ w.to(device)
    if bias:
        ref += b.float()
    out = awq_linear_ref(x, pack_int4(q).to(device), pack_int4(z).to(device), s, g, b)
    assert out.shape == (5, n) and out.dtype == dtype
    assert rel_err(out, ref) <= TOL[dtype]


# ----------------------------------------------------------------------------------------------- Triton


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k,n,bias", [(300, 40, True), (256, 136, False)])  # N, K not multiples of the blocks
def test_int8_linear_matches_ref(dtype, device, rel_err, m, k, n, bias):
    torch.manual_seed(m * 7 + n)
    x = _strided(m, k, dtype, device)
    qw = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device)
    s = (torch.randn(n) * 0.01).to(device=device, dtype=dtype)
    b = torch.randn(n).to(device=device, dtype=dtype) if bias else None
    ref = int8_linear_ref(x, qw, s, b)
    for cfg in _configs(INT8_CONFIGS, m, device, dtype, bias):
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # unwritten outputs stay NaN
        assert int8_linear(x, qw, s, b, config=cfg, out=out) is out
        assert rel_err(out, ref) <= TOL[dtype], cfg
    out = int8_linear(x, qw, s, b)
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k,n,g,bias", [(256, 136, 64, False), (384, 40, 128, True)])
def test_awq_linear_matches_ref(dtype, device, rel_err, m, k, n, g, bias):
    torch.manual_seed(m * 7 + n)
    q, z, s = _random_awq(k, n, g, dtype, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    x = _strided(m, k, dtype, device)
    b = torch.randn(n).to(device=device, dtype=dtype) if bias else None
    ref = awq_linear_ref(x, qw, qz, s, g, b)
    for cfg in _configs(AWQ_CONFIGS, m, device, dtype, bias):
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        assert awq_linear(x, qw, qz, s, g, b, config=cfg, out=out) is out
        assert rel_err(out, ref) <= TOL[dtype], cfg
    out = awq_linear(x, qw, qz, s, g, b)
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()


@pytest.mark.parametrize("m", [1, 20])
def test_awq_small_groups_clip_block_k(device, rel_err, m):
    # G = 32 is below every config's BLOCK_K: tiles shrink to one group
    torch.manual_seed(3)
    k, n, g = 128, 48, 32
    q, z, s = _random_awq(k, n, g, torch.float32, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    x = torch.randn(m, k, device=device)
    assert rel_err(awq_linear(x, qw, qz, s, g), awq_linear_ref(x, qw, qz, s, g)) <= 1e-5


@pytest.mark.parametrize("n", [40, 328])  # 5 packed columns (one clipped tile); 41 (a partial second tile)
def test_awq_gemv_every_config_with_k_split(device, rel_err, n):
    # 16 groups of 32: the one-row walk splits K, prefetches across groups, ends on a partial column tile
    torch.manual_seed(n)
    k, g = 512, 32
    q, z, s = _random_awq(k, n, g, torch.float32, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    x = torch.randn(2, k, device=device)
    b = torch.randn(n, device=device)
    ref = awq_linear_ref(x, qw, qz, s, g, b)
    gemv = [c for c in AWQ_CONFIGS["one_row"] if c[0] == "gemv"]
    assert gemv and any(c[4] for c in gemv)
    if device == "cpu":  # the interpreter runs each computation once: num_warps and VEC (a contiguity hint) do
        # not change what it computes, nor does a BLOCK_P the shape clips to the same size; the GPU runs every config
        def computes(c):
            _, block_p, block_k, _, prefetch, unpack = c
            return min(block_p, triton.next_power_of_2(n // 8)), min(block_k, g), prefetch, unpack
        gemv = list({computes(c): c for c in gemv}.values())
    for cfg in gemv:
        out = torch.full((2, n), float("nan"), device=device)
        assert awq_linear(x, qw, qz, s, g, b, config=cfg, out=out) is out
        assert rel_err(out, ref) <= 1e-5, cfg
    assert gemv_split_k(col_tiles=1, groups=16, partial_bytes=2 * n * 4, weight_bytes=10**6, num_sms=132) == 8  # 2 groups a split
    assert gemv_split_k(col_tiles=600, groups=16, partial_bytes=4, weight_bytes=10**6, num_sms=132) == 1


@pytest.mark.parametrize("m,rows,unpack", [(3, 4, 2), (5, 4, 0), (16, 8, 2), (2, 16, 1)])
def test_awq_rows_walk_matches_ref(dtype, device, rel_err, m, rows, unpack):
    # ROWS rows a program: a partial last group of rows (3 of 4, 5 = 4 + 1), two full ones (16 = 8 + 8), a group
    # clipped to the rows there are (2 of 16); K split in several ranges (16 groups of 32), a partial column tile
    # (41 packed columns), a bias, strided rows of x; outputs left unwritten stay NaN and fail the comparison
    torch.manual_seed(m * 3 + rows)
    k, n, g = 512, 328, 32
    q, z, s = _random_awq(k, n, g, dtype, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    x = _strided(m, k, dtype, device)
    b = torch.randn(n).to(device=device, dtype=dtype)
    ref = awq_linear_ref(x, qw, qz, s, g, b)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    assert awq_linear(x, qw, qz, s, g, b, config=("rgemv", 32, 32, 1, rows, unpack), out=out) is out
    assert rel_err(out, ref) <= TOL[dtype]
    assert any(c[0] == "rgemv" for c in AWQ_CONFIGS["few"]) and any(c[0] == "rgemv" for c in AWQ_CONFIGS["skinny"])


@pytest.mark.parametrize("m,bias", [(3, True), (520, False)])
def test_awq_dequant_then_dense_matmul(dtype, device, rel_err, m, bias):
    # the "dequant" configs: the whole weight dequantized in one pass (exactly the reference's), then cuBLAS;
    # the default above 512 rows, a candidate from 2 rows up
    torch.manual_seed(m)
    k, n, g = 256, 200, 64  # 25 packed columns: the last column tile is partial
    q, z, s = _random_awq(k, n, g, dtype, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    exact = dequantize_int4(qw, qz, s.float(), g)
    dequant = sorted({c for cfgs in AWQ_CONFIGS.values() for c in cfgs if c[0] == "dequant"})
    assert dequant and AWQ_CONFIGS["prefill"][0] in dequant and row_bucket(520) == "prefill"
    for cfg in dequant:
        w = awq_dequantize(qw, qz, s, g, cfg)
        assert w.dtype == dtype and w.shape == (k, n)
        assert torch.equal(w, exact.to(dtype)), cfg  # (q - z) * s rounded once, as the reference does
    x = _strided(m, k, dtype, device)
    b = torch.randn(n).to(device=device, dtype=dtype) if bias else None
    ref = awq_linear_ref(x, qw, qz, s, g, b)
    for cfg in [None] + dequant:
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        assert awq_linear(x, qw, qz, s, g, b, config=cfg, out=out) is out
        assert rel_err(out, ref) <= 2 * TOL[dtype], cfg  # the weight is rounded to x's dtype before the dot


def test_awq_dequantize_refuses_what_awq_linear_refuses(device):
    q, z, s = _random_awq(128, 64, 64, torch.float16, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    with pytest.raises(ValueError, match=r"awq_dequantize: qzeros must be \(2, 8\), got \(1, 8\)"):
        awq_dequantize(qw, qz[:1], s, 64)
    with pytest.raises(TypeError, match="awq_dequantize: qweight must be int32"):
        awq_dequantize(qw.to(torch.int64), qz, s, 64)
    with pytest.raises(ValueError, match="awq_dequantize: K = 128 is not a multiple of group_size 256"):
        awq_dequantize(qw, qz, s, 256)
    with pytest.raises(ValueError, match="awq_dequantize: qweight, qzeros and scales must be contiguous"):
        awq_dequantize(qw, qz, s.T.contiguous().T, 64)


def test_awq_gemv_no_fadd_unpack_in_half(device, rel_err):
    # UNPACK 2 takes the 2**23 offsets off after each tile's dot: within fp16's rounding of the exact walk
    torch.manual_seed(5)
    k, n, g = 1024, 72, 128
    q, z, s = _random_awq(k, n, g, torch.float16, device)
    qw, qz = pack_int4(q).to(device), pack_int4(z).to(device)
    x = (torch.randn(1, k) * 4).to(device=device, dtype=torch.float16)
    ref = awq_linear_ref(x, qw, qz, s, g)
    fast = [c for c in AWQ_CONFIGS["one_row"] if c[0] == "gemv" and len(c) > 5 and c[5] == 2]
    assert fast and AWQ_CONFIGS["one_row"][0] in fast
    for cfg in fast[:3] + [c for c in fast if c[4]]:
        assert rel_err(awq_linear(x, qw, qz, s, g, config=cfg), ref) <= TOL[torch.float16], cfg


def test_tuned_table_picks_per_shape(tmp_path, monkeypatch):
    from tachyon.kernels import quant_linear as ql
    table = {"configs": {"awq": {"one_row": {ql.tuned_key(64, 256, 128): ["gemv", 64, 32, 2, False, 0]}}}}
    (tmp_path / "Some_GPU.json").write_text(__import__("json").dumps(table))
    monkeypatch.setattr(ql, "TUNED_DIR", str(tmp_path))
    ql._tuned_table.cache_clear()
    try:
        t = ql._tuned_table("Some GPU")
        assert t["awq"]["one_row"]["64x256g128"] == ("gemv", 64, 32, 2, False, 0)
        assert ql._tuned_table("Other GPU") == {}
    finally:
        ql._tuned_table.cache_clear()
    cpu = torch.device("cpu")  # off the GPU the table is never read: the bucket's first config
    assert ql.default_config("awq", 1, 64, 256, cpu, 128) == AWQ_CONFIGS["one_row"][0]
    assert ql.default_config("int8", 20, 64, 256, cpu) == INT8_CONFIGS["gemm"][0]


def test_zero_rows(device):
    x = torch.empty(0, 64, device=device)
    qw8 = torch.zeros(16, 64, dtype=torch.int8, device=device)
    assert int8_linear(x, qw8, torch.ones(16, device=device)).shape == (0, 16)
    qw4 = torch.zeros(64, 2, dtype=torch.int32, device=device)
    qz = torch.zeros(1, 2, dtype=torch.int32, device=device)
    assert awq_linear(x, qw4, qz, torch.ones(1, 16, device=device), 64).shape == (0, 16)


def test_rejects_bad_inputs(device):
    x = torch.randn(2, 96, device=device)
    qw4 = torch.zeros(96, 2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="not a multiple of group_size 64"):  # K = 96, G = 64
        awq_linear(x, qw4, torch.zeros(1, 2, dtype=torch.int32, device=device), torch.ones(1, 16, device=device), 64)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        awq_linear_ref(x, qw4, torch.zeros(1, 2, dtype=torch.int32, device=device),
                       torch.ones(1, 16, device=device), 64)
    qz, s = torch.zeros(3, 2, dtype=torch.int32, device=device), torch.ones(3, 16, device=device)
    with pytest.raises(ValueError, match="power of two"):
        awq_linear(x, qw4, qz, s, 48)
    with pytest.raises(TypeError, match="scales"):
        awq_linear(x, qw4, qz, s.half(), 32)
    with pytest.raises(TypeError, match="qweight"):
        awq_linear(x, qw4.to(torch.int64), qz, s, 32)
    with pytest.raises(TypeError, match="qzeros"):
        awq_linear(x, qw4, qz.to(torch.uint8), s, 32)
    with pytest.raises(TypeError, match="x must be"):
        awq_linear(x.to(torch.int32), qw4, qz, s.to(torch.int32), 32)
    qw8 = torch.zeros(16, 96, dtype=torch.int8, device=device)
    with pytest.raises(TypeError, match="qweight"):
        int8_linear(x, qw8.to(torch.int32), torch.ones(16, device=device))
    with pytest.raises(TypeError, match="scales"):
        int8_linear(x, qw8, torch.ones(16, device=device, dtype=torch.float16))
    with pytest.raises(TypeError, match="bias"):
        int8_linear(x, qw8, torch.ones(16, device=device), torch.ones(16, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="columns"):
        int8_linear(torch.randn(2, 95, device=device), qw8, torch.ones(16, device=device))


def test_row_bucket_and_split_k():
    assert [row_bucket(m) for m in (1, 2, 4, 5, 16, 17, 512, 513)] == [
        "one_row", "few", "few", "skinny", "skinny", "gemm", "gemm", "prefill"]
    assert set(AWQ_CONFIGS) == set(INT8_CONFIGS) == set(SPLIT_CONFIG)
    # llama3-8b down_proj at one row, INT4: 32 strips of 128 outputs, 112 K tiles -> split 16 (512 programs)
    assert split_k(32, 112, 4096 * 4, 14336 * 4096 // 2, 132) == 16
    assert split_k(448, 64, 57344 * 4, 8192 * 57344 // 2, 132) == 1  # enough strips already
    assert split_k(32, 6, 4096 * 4, 4096 * 4096 // 2, 132) == 1  # too few K tiles to share
    assert split_k(32, 112, 16 * 4096 * 4, 2**20, 132) == 1  # the partials would outweigh the weight
