"""Quantized linears: checkpoint formats land in the fused layers exactly, errors say what to change, the engine
runs them token-exact against transformers on the same dequantized weights, plan's bytes are the engine's."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from tachyon import LLM, SamplingParams
from tachyon.config import ModelConfig, QuantConfig, quant_config_from_hf, resolve_quantization
from tachyon.kernels.quant_ref import dequantize_int4
from tachyon.layers.linear import AWQLinear, Int8Linear, awq_kmajor_wanted, quantize_int8, repack_awq_kmajor
from tachyon.models.llama import LlamaForCausalLM
from tachyon.plan import weight_breakdown
from tests.conftest import hf_greedy, make_tiny_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AUTOAWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


# -- writers that follow each format's documentation, independent of the loader's code -------------------------
def rtn_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A dense nn.Linear weight [N, K] -> (q [K, N] 0..15, zeros [K/G, N], scales [K/G, N]): asymmetric RTN."""
    wt = w.T.float().reshape(w.shape[1] // group, group, w.shape[0])  # [K/G, G, N]
    lo, hi = wt.amin(dim=1), wt.amax(dim=1)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    zeros = torch.round(-lo / scales).clamp(0, 15)
    q = torch.round(wt / scales[:, None] + zeros[:, None]).clamp(0, 15)
    return q.reshape(w.shape[1], w.shape[0]).int(), zeros.int(), scales


def autoawq_pack(values: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's GEMM packing of [R, C] 4-bit values: word c holds columns 8c + ORDER[i] in bits 4i.."""
    R, C = values.shape
    out = torch.zeros(R, C // 8, dtype=torch.int64)
    for c in range(C // 8):
        for i in range(8):
            out[:, c] |= values[:, 8 * c + AUTOAWQ_ORDER[i]].long() << (4 * i)
    return ((out + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)  # the int32 bit pattern


def ct_pack(values: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' pack_to_int32 along dim 1 of [R, C] unsigned 4-bit values (value i in bits 4i..)."""
    R, C = values.shape
    out = torch.zeros(R, C // 8, dtype=torch.int64)
    for i in range(8):
        out |= values[:, i::8].long() << (4 * i)
    return ((out + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


def llmcompressor_config(group: int, actorder: str | None) -> dict:
    """config.json's quantization_config as llm-compressor 0.14 writes it for W4A16 asymmetric in groups
    (GPTQModifier records actorder "static", QuantizationModifier None)."""
    weights = {"actorder": actorder, "block_structure": None, "dynamic": False, "group_size": group, "num_bits": 4,
               "observer": "memoryless_minmax", "observer_kwargs": {}, "scale_dtype": None, "strategy": "group",
               "symmetric": False, "type": "int", "zp_dtype": "torch.int8"}
    return {"config_groups": {"group_0": {"format": "pack-quantized", "input_activations": None,
                                          "output_activations": None, "targets": ["Linear"], "weights": weights}},
            "format": "pack-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
            "sparsity_config": {}, "transform_config": {}, "version": "0.19.0"}


def _awq(group=32, fmt="awq", symmetric=False):
    return QuantConfig("awq", group, fmt, symmetric)


# -- layers ---------------------------------------------------------------------------------------------------
def test_autoawq_parts_land_in_a_fused_layer():
    torch.manual_seed(0)
    K, parts = 64, [64, 32, 32]  # q, k, v of a qkv_proj
    layer = AWQLinear(K, sum(parts), False, _awq())
    expect = []
    start = 0
    for n in parts:
        q, z, s = rtn_int4(torch.randn(n, K), 32)
        layer.load("qweight", autoawq_pack(q), start, n, "q")
        layer.load("qzeros", autoawq_pack(z), start, n, "z")
        layer.load("scales", s, start, n, "s")
        expect.append((q - z.repeat_interleave(32, 0)).float() * s.repeat_interleave(32, 0))
        start += n
    assert layer.missing() == [] and layer.num_parts == 3
    got = dequantize_int4(layer.qweight, layer.qzeros, layer.scales, 32)
    torch.testing.assert_close(got, torch.cat(expect, dim=1), rtol=0, atol=0)


def test_kmajor_repack_keeps_the_layer_exact_and_refuses_later_loads():
    torch.manual_seed(3)
    K, N, G = 256, 40, 64
    q, z, s = rtn_int4(torch.randn(N, K), G)
    layer = AWQLinear(K, N, True, _awq(G))
    for kind, t in (("qweight", autoawq_pack(q)), ("qzeros", autoawq_pack(z)), ("scales", s)):
        layer.load(kind, t, 0, N, kind)
    layer.bias.data.normal_()
    x = torch.randn(3, K)
    before = layer(x)
    assert repack_awq_kmajor(torch.nn.Sequential(layer, AWQLinear(96, 64, False, _awq(32)))) == 1  # K 96: kept
    assert layer.kmajor and layer.qweight.shape == (K // 8, N) and layer.qweight.dtype == torch.int32
    torch.testing.assert_close(layer(x), before, rtol=0, atol=0)  # the same fp32 reference arithmetic
    assert layer.use_kmajor()  # a second call changes nothing
    with pytest.raises(RuntimeError, match="repacked K-major"):
        layer.load("scales", s, 0, N, "s")


def test_kmajor_is_hoppers_default_and_the_env_overrides_it(monkeypatch):
    def wanted(capability, env):
        if env is None:
            monkeypatch.delenv("TACHYON_AWQ_MMA", raising=False)
        else:
            monkeypatch.setenv("TACHYON_AWQ_MMA", env)
        return awq_kmajor_wanted(capability)

    assert wanted((9, 0), None) and wanted((9, 0), "")
    assert not wanted((9, 0), "0")
    assert not wanted((8, 0), None) and not wanted((8, 9), "1")  # no sm_90 MMA
    assert not wanted((10, 0), None) and wanted((10, 0), "1")  # untimed: opt-in
    with pytest.raises(ValueError, match="TACHYON_AWQ_MMA must be 0 or 1, got 'yes'"):
        wanted((9, 0), "yes")


@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_matches_autoawq(symmetric):
    torch.manual_seed(1)
    K, N, G = 128, 48, 32
    q, z, s = rtn_int4(torch.randn(N, K), G)
    if symmetric:
        z = torch.full_like(z, 8)
    a = AWQLinear(K, N, False, _awq(G))
    for kind, t in (("qweight", autoawq_pack(q)), ("qzeros", autoawq_pack(z)), ("scales", s)):
        a.load(kind, t, 0, N, kind)
    c = AWQLinear(K, N, False, _awq(G, "compressed-tensors", symmetric))
    c.load("weight_packed", ct_pack(q.T.contiguous()), 0, N, "wp")  # [N, K/8], packed along K
    c.load("weight_scale", s.T.contiguous(), 0, N, "ws")  # [N, K/G]
    c.load("weight_shape", torch.tensor([N, K]), 0, N, "shape")
    if not symmetric:
        c.load("weight_zero_point", ct_pack(z.contiguous()).T.contiguous(), 0, N, "zp")  # [N/8, K/G], along N
    assert c.missing() == []
    x = torch.randn(5, K)
    torch.testing.assert_close(c(x), a(x), rtol=0, atol=0)
    dense = (q - z.repeat_interleave(G, 0)).float() * s.repeat_interleave(G, 0)
    torch.testing.assert_close(a(x), x @ dense, rtol=1e-5, atol=1e-5)


def test_int8_from_dense_and_from_its_own_format():
    torch.manual_seed(2)
    w = torch.randn(40, 64)
    layer = Int8Linear(64, 40, True, QuantConfig("int8"))
    layer.load("weight", w, 0, 40, "w")
    layer.load("bias", torch.arange(40.0), 0, 40, "b")
    assert layer.missing() == []
    err = (layer.qweight.float() * layer.scales[:, None] - w).abs().max() / w.abs().max()
    assert err < 1 / 127
    q, s = quantize_int8(w)
    own = Int8Linear(64, 40, True, QuantConfig("int8", checkpoint_format="int8"))
    for kind, t in (("qweight", q), ("scales", s), ("bias", torch.arange(40.0))):
        own.load(kind, t, 0, 40, kind)
    x = torch.randn(3, 64)
    torch.testing.assert_close(own(x), layer(x))
    torch.testing.assert_close(own(x), x @ (q.float() * s[:, None]).T + torch.arange(40.0))


def test_load_errors_say_what_to_change():
    with pytest.raises(ValueError, match="needs an AWQ checkpoint"):
        AWQLinear(64, 64, False, _awq(fmt="dense")).load("weight", torch.zeros(64, 64), 0, 64, "w")
    layer = AWQLinear(64, 64, False, _awq())
    with pytest.raises(ValueError, match="awq-format awq checkpoint hold qweight, qzeros, scales, not 'weight'"):
        layer.load("weight", torch.zeros(64, 64), 0, 64, "model.layers.0.mlp.down_proj.weight")
    with pytest.raises(ValueError, match="hold qweight, qzeros, scales, not 'weight_packed'"):
        layer.load("weight_packed", torch.zeros(64, 8, dtype=torch.int32), 0, 64, "x")
    with pytest.raises(ValueError, match=r"has shape \(64, 4\), the config expects \(64, 8\)"):
        layer.load("qweight", torch.zeros(64, 4, dtype=torch.int32), 0, 64, "x")
    layer.load("qweight", torch.zeros(64, 8, dtype=torch.int32), 0, 64, "x")
    assert layer.missing() == ["qzeros@0", "scales@0"]
    with pytest.raises(ValueError, match="in_features must be a multiple of it"):
        AWQLinear(96, 64, False, _awq(64))


def test_checkpoint_quantization_configs():
    awq = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
    assert quant_config_from_hf({"quantization_config": awq}) == QuantConfig("awq", 64, "awq")
    with pytest.raises(ValueError, match="bits=8"):
        quant_config_from_hf({"quantization_config": {**awq, "bits": 8}})
    with pytest.raises(ValueError, match="quantized with 'gptq'"):
        quant_config_from_hf({"quantization_config": {"quant_method": "gptq"}})
    ct = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                        "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                    "strategy": "group", "group_size": 128}}}}
    assert quant_config_from_hf({"quantization_config": ct}) == QuantConfig("awq", 128, "compressed-tensors", True)
    for actorder in (None, "static", "weight"):  # weight ordering changes GPTQ's calibration, not the layout
        got = quant_config_from_hf({"quantization_config": llmcompressor_config(64, actorder)})
        assert got == QuantConfig("awq", 64, "compressed-tensors", False)
    with pytest.raises(ValueError, match="activation ordering none or 'weight'"):  # weight_g_idx: not read
        quant_config_from_hf({"quantization_config": llmcompressor_config(64, "group")})
    w8a8 = json.loads(json.dumps(ct))
    w8a8["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8}
    with pytest.raises(ValueError, match="W4A16"):
        quant_config_from_hf({"quantization_config": w8a8})
    assert resolve_quantization({}, "int8") == QuantConfig("int8", checkpoint_format="dense")
    assert resolve_quantization({"quantization_config": awq}, None).method == "awq"
    with pytest.raises(ValueError, match="--quantization int8, but the checkpoint is awq-quantized"):
        resolve_quantization({"quantization_config": awq}, "int8")


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b"])
@pytest.mark.parametrize("method", ["awq", "int8", "fp8", "w8a8"])
def test_plan_counts_the_bytes_the_engine_holds(model, method):
    cfg = ModelConfig.from_file(os.path.join(ROOT, "benchmarks", "models", f"{model}.json"))
    cfg.quantization = QuantConfig(method)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    held = sum(p.numel() * p.element_size() for p in m.parameters())
    assert weight_breakdown(cfg, torch.bfloat16, method)["total_bytes"] == held


# -- the engine -------------------------------------------------------------------------------------------------
def _fake_quantize_(hf, method: str, group: int) -> dict[str, torch.Tensor]:
    """Replace the transformers model's linear weights by their dequantized selves; return the checkpoint
    tensors a quantized checkpoint of it holds (AutoAWQ layout for awq, llm-compressor's pack-quantized for
    compressed-tensors, Tachyon's for int8)."""
    tensors = {}
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            w = mod.weight.data
            if method in ("awq", "compressed-tensors"):
                q, z, s = rtn_int4(w, group)
                if method == "awq":
                    tensors[f"{name}.qweight"] = autoawq_pack(q)
                    tensors[f"{name}.qzeros"] = autoawq_pack(z)
                    tensors[f"{name}.scales"] = s.contiguous()
                else:  # [N, K/8] along K; [N, K/G]; zero points [N/8, K/G] along N; the dense shape
                    tensors[f"{name}.weight_packed"] = ct_pack(q.T.contiguous())
                    tensors[f"{name}.weight_scale"] = s.T.contiguous()
                    tensors[f"{name}.weight_zero_point"] = ct_pack(z).T.contiguous()
                    tensors[f"{name}.weight_shape"] = torch.tensor(list(w.shape))
                mod.weight.data = ((q - z.repeat_interleave(group, 0)).float() * s.repeat_interleave(group, 0)).T
            else:
                q, s = quantize_int8(w)
                tensors[f"{name}.qweight"], tensors[f"{name}.scales"] = q, s
                mod.weight.data = (q.float() * s[:, None]).contiguous()
            if mod.bias is not None:
                tensors[f"{name}.bias"] = mod.bias.data.clone()
        elif isinstance(mod, (torch.nn.Embedding, torch.nn.Linear)) or "norm" in name:
            for pn, p in mod.named_parameters(recurse=False):
                tensors[f"{name}.{pn}"] = p.data.clone()
    return tensors


QUANT_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
    "int8": {"quant_method": "int8"},
    "compressed-tensors": llmcompressor_config(32, "static"),
}


@pytest.mark.parametrize("method", ["awq", "int8", "compressed-tensors"])
def test_quantized_checkpoint_greedy_matches_transformers(tmp_path, method):
    hf = make_tiny_checkpoint("llama", str(tmp_path / "dense"))
    tensors = _fake_quantize_(hf, method, group=32)
    out = tmp_path / method
    out.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    cfg = json.load(open(tmp_path / "dense" / "config.json"))
    cfg["quantization_config"] = QUANT_CONFIGS[method]
    json.dump(cfg, open(out / "config.json", "w"))
    llm = LLM(model=str(out), num_kv_blocks=64, block_size=8, max_num_batched_tokens=32, swap_space=0)
    kind = Int8Linear if method == "int8" else AWQLinear
    assert isinstance(llm.engine.runner.model.layers[1].mlp.down_proj, kind)
    prompts = [[11, 12, 13, 14], list(range(40, 75)), [300] * 9]
    got = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for p, o in zip(prompts, got, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 12)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_dense_checkpoint_as_int8_matches_fake_quantized_transformers(tmp_path):
    hf = make_tiny_checkpoint("qwen2", str(tmp_path))  # qkv biases and tied embeddings too
    llm = LLM(model=str(tmp_path), quantization="int8", num_kv_blocks=64, block_size=8, swap_space=0)
    _fake_quantize_(hf, "int8", group=32)
    p = list(range(20, 50))
    got = llm.generate({"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert got[0].outputs[0].token_ids == hf_greedy(hf, p, 10)


def test_awq_on_a_dense_checkpoint_is_refused(tmp_path):
    make_tiny_checkpoint("llama", str(tmp_path))
    with pytest.raises(ValueError, match="needs an AWQ checkpoint .* is dense: quantize it first"):
        LLM(model=str(tmp_path), quantization="awq", swap_space=0)


def test_dummy_awq_runs_and_holds_packed_weights(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    llm = LLM(model=str(path), load_format="dummy", quantization="awq", swap_space=0, max_model_len=128)
    m = llm.engine.runner.model
    assert isinstance(m.layers[0].self_attn.qkv_proj, AWQLinear)
    assert m.layers[0].self_attn.qkv_proj.qweight.dtype == torch.int32
    assert "AWQLinear(in_features=128, out_features=256, bias=False, awq, group_size=128)" in str(m)
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
