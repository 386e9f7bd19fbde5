"""fp8 and w8a8 (8-bit weights and activations): the checkpoint formats land in the fused layers, errors say what
to change, and the engine runs them token-exact against transformers whose linears compute the same W8A8 math."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tachyon import LLM, SamplingParams
from tachyon.config import QuantConfig, quant_config_from_hf, resolve_quantization
from tachyon.kernels.quant_ref import scaled_linear_ref
from tachyon.layers.linear import Fp8Linear, W8A8Linear, quantize_fp8, quantize_int8
from tests.conftest import make_tiny_checkpoint

LAYER = {"fp8": Fp8Linear, "w8a8": W8A8Linear}
QUANTIZE = {"fp8": quantize_fp8, "w8a8": quantize_int8}


def ct_config(wtype: str, strategy: str = "channel", dynamic: bool = True) -> dict:
    """config.json's quantization_config as llm-compressor writes W8A8 (FP8_DYNAMIC, W8A8 int8, static FP8)."""
    weights = {"num_bits": 8, "type": wtype, "symmetric": True, "strategy": strategy, "dynamic": False,
               "group_size": None, "observer": "minmax"}
    acts = {"num_bits": 8, "type": wtype, "symmetric": True, "dynamic": dynamic,
            "strategy": "token" if dynamic else "tensor", "observer": None if dynamic else "minmax"}
    return {"quant_method": "compressed-tensors", "format": f"{'float' if wtype == 'float' else 'int'}-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}


def test_checkpoint_configs():
    q = quant_config_from_hf({"quantization_config": ct_config("float")})
    assert (q.method, q.checkpoint_format, q.static_input) == ("fp8", "float-quantized", False)
    q = quant_config_from_hf({"quantization_config": ct_config("int")})
    assert (q.method, q.checkpoint_format, q.static_input) == ("w8a8", "int-quantized", False)
    q = quant_config_from_hf({"quantization_config": ct_config("float", "tensor", dynamic=False)})
    assert (q.method, q.static_input) == ("fp8", True)
    q = quant_config_from_hf({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}})
    assert (q.method, q.checkpoint_format, q.static_input) == ("fp8", "fp8", True)
    assert resolve_quantization({}, "fp8") == QuantConfig("fp8", checkpoint_format="dense")
    with pytest.raises(ValueError, match="block-wise scales"):
        quant_config_from_hf({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    bad = ct_config("int")
    bad["config_groups"]["group_0"]["input_activations"]["symmetric"] = False
    with pytest.raises(ValueError, match="8-bit symmetric activations"):
        quant_config_from_hf({"quantization_config": bad})
    with pytest.raises(ValueError, match="--quantization w8a8, but the checkpoint is fp8-quantized"):
        resolve_quantization({"quantization_config": ct_config("float")}, "w8a8")


@pytest.mark.parametrize("method", ["fp8", "w8a8"])
def test_parts_land_in_a_fused_layer_and_keep_their_dtypes(method):
    torch.manual_seed(0)
    K, parts = 64, [64, 32, 32]  # q, k, v of a qkv_proj
    fmt = "float-quantized" if method == "fp8" else "int-quantized"
    layer = LAYER[method](K, sum(parts), False, QuantConfig(method, checkpoint_format=fmt, static_input=True))
    layer = layer.to(torch.bfloat16)  # the engine casts the model to its dtype before loading
    layer.input_scale.data.fill_(1e30)  # what torch.empty may hold: the engine allocates with to_empty
    assert layer.weight.dtype == layer.QTYPE and layer.weight_scale.dtype == torch.float32
    ws, start = [], 0
    for i, n in enumerate(parts):
        q, s = QUANTIZE[method](torch.randn(n, K))
        scale = s[:, None] if i != 1 else s.max().reshape(())  # k_proj's scale per tensor
        if i == 1:
            q = (q.float() * s[:, None] / scale).to(layer.QTYPE) if method == "fp8" else torch.round(
                q.float() * s[:, None] / scale).clamp(-127, 127).to(torch.int8)
        layer.load("weight", q, start, n, f"p{i}.weight")
        layer.load("weight_scale", scale.to(torch.bfloat16), start, n, f"p{i}.weight_scale")
        layer.load("input_scale", torch.tensor(0.01 * (i + 1)), start, n, f"p{i}.input_scale")
        ws.append(scale.float().expand(n) if i == 1 else s)
        start += n
    assert layer.missing() == []
    torch.testing.assert_close(layer.weight_scale.data, torch.cat(ws).to(torch.bfloat16).float())
    assert layer.input_scale.item() == pytest.approx(0.03)  # the largest of the three: one shared input
    x = torch.randn(5, K, dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x), scaled_linear_ref(x, layer.weight, layer.weight_scale, None,
                                                           layer.input_scale))
    assert f"{method}, static input scale" in repr(layer)


def test_dense_weights_quantize_while_loading_and_errors_say_what_to_change():
    torch.manual_seed(1)
    w = torch.randn(40, 64)
    layer = Fp8Linear(64, 40, True, QuantConfig("fp8"))
    layer.load("weight", w, 0, 40, "w")
    layer.load("bias", torch.arange(40.0), 0, 40, "b")
    assert layer.missing() == []
    err = (layer.weight.float() * layer.weight_scale[:, None] - w).abs().max() / w.abs().max()
    assert 0 < err < 1 / 16  # E4M3's 3 mantissa bits
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), scaled_linear_ref(x, layer.weight, layer.weight_scale, layer.bias))
    own = W8A8Linear(64, 40, False, QuantConfig("w8a8", checkpoint_format="int-quantized"))
    with pytest.raises(ValueError, match="is torch.float8_e4m3fn: a w8a8 layer takes torch.int8 weights"):
        own.load("weight", layer.weight.data, 0, 40, "w")
    with pytest.raises(ValueError, match="hold weight, weight_scale, not 'qweight'"):
        own.load("qweight", torch.zeros(40, 64, dtype=torch.int8), 0, 40, "q")
    with pytest.raises(ValueError, match="has shape"):
        layer.load("weight", torch.zeros(40, 32), 0, 40, "w")


# -- the engine against transformers with W8A8 linears ----------------------------------------------------------
# Quantized activations make greedy tokens fragile: a last-bit difference between two fp32 implementations (fused
# qkv against three matmuls, paged attention against SDPA) can move a value across a rounding boundary of its
# 8-bit grid, and a tiny random model's top two logits are often that close. So each token the engine picks must
# be the reference's choice or within MARGIN (log-probability) of it, on the reference's own teacher-forced run.
MARGIN = 0.02


def assert_reference_agrees(hf, prompt: list[int], tokens: list[int]) -> None:
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    lp = torch.log_softmax(logits.float(), dim=-1)
    gaps = lp.max(dim=-1).values - lp[torch.arange(len(tokens)), torch.tensor(tokens)]
    assert gaps.max().item() <= MARGIN, f"engine tokens {tokens} fall {gaps.tolist()} below the reference's best"


def _w8a8_transformers_(hf, method: str, static: bool) -> dict[str, torch.Tensor]:
    """Make every linear of the transformers model (not lm_head) compute scaled_linear_ref on its quantized
    weight; return a compressed-tensors checkpoint of it (k_proj's scale per tensor, the others per channel)."""
    tensors = {}
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            q, s = QUANTIZE[method](mod.weight.data)
            if "k_proj" in name:  # a per-tensor scale: requantize to the largest
                big = s.max()
                v = (q.float() * s[:, None] / big)
                q = v.to(torch.float8_e4m3fn) if method == "fp8" else torch.round(v).clamp(-127, 127).to(torch.int8)
                s = big.expand(q.shape[0]).clone()
                tensors[f"{name}.weight_scale"] = big.reshape(1)
            else:
                tensors[f"{name}.weight_scale"] = s[:, None].clone()
            tensors[f"{name}.weight"] = q
            in_scale = torch.tensor([0.02]) if static else None
            if static:
                tensors[f"{name}.input_scale"] = in_scale.clone()
            if mod.bias is not None:
                tensors[f"{name}.bias"] = mod.bias.data.clone()

            def forward(x, q=q, s=s, b=mod.bias, in_scale=in_scale):
                y = scaled_linear_ref(x.reshape(-1, x.shape[-1]), q, s.float(), b, in_scale)
                return y.reshape(*x.shape[:-1], -1)
            mod.forward = forward
        elif isinstance(mod, (torch.nn.Embedding, torch.nn.Linear)) or "norm" in name:
            for pn, p in mod.named_parameters(recurse=False):
                tensors[f"{name}.{pn}"] = p.data.clone()
    return tensors


@pytest.mark.parametrize("method,static", [("fp8", False), ("w8a8", False), ("fp8", True)])
def test_checkpoint_greedy_matches_transformers(tmp_path, method, static):
    hf = make_tiny_checkpoint("qwen2", str(tmp_path / "dense"))  # qkv biases and tied embeddings too
    tensors = _w8a8_transformers_(hf, method, static)
    out = tmp_path / method
    out.mkdir()
    if static:  # llm-compressor's kv_cache_scheme adds these; the engine calibrates its own fp8 KV scales
        tensors.update({f"model.layers.{i}.self_attn.{kv}_scale": torch.tensor(0.1) for i in range(2) for kv in "kv"})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    cfg = json.load(open(tmp_path / "dense" / "config.json"))
    cfg["quantization_config"] = ct_config("float" if method == "fp8" else "int", dynamic=not static)
    json.dump(cfg, open(out / "config.json", "w"))
    llm = LLM(model=str(out), num_kv_blocks=64, block_size=8, max_num_batched_tokens=32, swap_space=0)
    layer = llm.engine.runner.model.layers[1].self_attn.qkv_proj
    assert isinstance(layer, LAYER[method]) and (layer.input_scale is not None) == static
    prompts = [[11, 12, 13, 14], list(range(40, 75)), [300] * 9]
    got = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for p, o in zip(prompts, got, strict=True):
        assert_reference_agrees(hf, p, o.outputs[0].token_ids)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


@pytest.mark.parametrize("method", ["fp8", "w8a8"])
def test_dense_checkpoint_quantized_while_loading_matches_transformers(tmp_path, method):
    hf = make_tiny_checkpoint("llama", str(tmp_path))
    llm = LLM(model=str(tmp_path), quantization=method, num_kv_blocks=64, block_size=8, swap_space=0)
    assert isinstance(llm.engine.runner.model.layers[0].mlp.down_proj, LAYER[method])
    for name, mod in hf.named_modules():  # per-channel scales of the dense weight, as the engine's load
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            q, s = QUANTIZE[method](mod.weight.data)

            def forward(x, q=q, s=s, b=mod.bias):
                return scaled_linear_ref(x.reshape(-1, x.shape[-1]), q, s, b).reshape(*x.shape[:-1], -1)
            mod.forward = forward
    p = list(range(20, 50))
    got = llm.generate({"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert_reference_agrees(hf, p, got[0].outputs[0].token_ids)


def test_dummy_fp8_runs_and_holds_8bit_weights(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    llm = LLM(model=str(path), load_format="dummy", quantization="fp8", swap_space=0, max_model_len=128)
    m = llm.engine.runner.model
    assert m.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert "Fp8Linear(in_features=128, out_features=256, bias=False, fp8)" in str(m)
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
