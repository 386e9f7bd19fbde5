"""`tachyon quantize --method fp8|w8a8`: SmoothQuant's folding leaves the dense model's function unchanged while
moving weight into the smoothed linears; the written checkpoint is compressed-tensors' layout to the tensor;
its weights are the (smoothed) dense ones within one rounding step; and on a model with an outlier input
channel, per-token int8 activations lose less after smoothing than without it (the point of SmoothQuant)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from tachyon.cli import main
from tachyon.engine_args import EngineArgs
from tachyon.eval.ppl import (
    calibration_text,
    encode,
    heldout_text,
    kv_cache,
    load_model,
    positions_of,
    prefill_metadata,
)
from tachyon.layers.linear import quantize_fp8, quantize_int8
from tachyon.quantize.calibration import calibration_samples
from tachyon.quantize.checkpoint import LINEARS
from tachyon.quantize.gptq import gptq_channel
from tachyon.quantize.w8a8 import smooth, w8a8_tensors
from tests.unit.test_eval_ppl import make_tiny_with_tokenizer
from tests.unit.test_quantize import _correlated_case

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")
CALIB = ["--calib-samples", "4", "--calib-seq-len", "64"]
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 128, 256, 4, 2, 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, embedded_dir):
    path = str(tmp_path_factory.mktemp("tiny_llama_w8a8"))
    make_tiny_with_tokenizer(path, embedded_dir)
    return path


def _outlier_model(tmp_path, outlier: float = 40.0):
    """A 2-layer random Llama (dummy weights) whose norms give a few input channels of qkv and gate/up `outlier`
    times the range of the rest, as LLMs' norms do."""
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": HIDDEN,
           "intermediate_size": INTER, "num_hidden_layers": 2, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "max_position_embeddings": 256, "eos_token_id": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    lm = load_model(EngineArgs(model=str(tmp_path / "config.json"), load_format="dummy", dtype="float32"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in lm.model.layers:
            for n in ("input_layernorm", "post_attention_layernorm"):
                w = layer.get_submodule(n).weight
                w.uniform_(0.5, 1.5, generator=gen)
                w[torch.randperm(HIDDEN, generator=gen)[:3]] *= outlier
            layer.mlp.gate_up_proj.weight.mul_(20)  # down_proj's input away from silu's linear range near 0
    samples = [torch.randint(3, 256, (64,), generator=gen).tolist() for _ in range(4)]
    return lm, samples


def _logits(lm, samples) -> torch.Tensor:
    lens = [len(s) for s in samples]
    meta, nb = prefill_metadata(lens, 16, "cpu")
    kv = [kv_cache(lm.model.cfg, nb, 16, torch.float32, "cpu") for _ in range(lm.model.cfg.num_layers)]
    with torch.no_grad():
        hidden = lm.model(torch.tensor([t for s in samples for t in s]), positions_of(lens, "cpu"), kv, meta,
                          lm.backend)
        return lm.model.compute_logits(hidden)


def _copy(lm):
    return dataclasses.replace(lm, model=copy.deepcopy(lm.model))


# -- (a) smoothing is exact before rounding --------------------------------------------------------------------------
def test_smoothing_keeps_the_dense_model_and_moves_weight(tmp_path):
    lm, samples = _outlier_model(tmp_path)
    before, dense = _logits(lm, samples), _copy(lm).model
    factors = smooth(lm, samples, alpha=0.5)
    torch.testing.assert_close(_logits(lm, samples), before, rtol=1e-4, atol=1e-4)
    for i, (layer, old) in enumerate(zip(lm.model.layers, dense.layers, strict=True)):
        assert set(factors[i]) == {"self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"}
        for name, s in factors[i].items():
            assert torch.isfinite(s).all() and s.min() > 0
            assert (s.max() / s.min()) > 4, name  # the outliers made the factors far from uniform
        for name in ("self_attn.qkv_proj", "mlp.down_proj"):  # gate_up below: its up rows carry down's too
            torch.testing.assert_close(layer.get_submodule(name).weight,
                                       old.get_submodule(name).weight * factors[i][name])
        # what each factor was folded into: the norms, and up_proj's rows (not gate's)
        torch.testing.assert_close(layer.input_layernorm.weight * factors[i]["self_attn.qkv_proj"],
                                   old.input_layernorm.weight)
        torch.testing.assert_close(layer.post_attention_layernorm.weight * factors[i]["mlp.gate_up_proj"],
                                   old.post_attention_layernorm.weight)
        gu, gu_old = layer.mlp.gate_up_proj.weight, old.mlp.gate_up_proj.weight * factors[i]["mlp.gate_up_proj"]
        torch.testing.assert_close(gu[:INTER], gu_old[:INTER])
        torch.testing.assert_close(gu[INTER:] * factors[i]["mlp.down_proj"][:, None], gu_old[INTER:])
        assert torch.equal(layer.self_attn.o_proj.weight, old.self_attn.o_proj.weight)  # o_proj not smoothed


def test_alpha_zero_and_one_are_the_two_extremes(tmp_path):
    """alpha 1: s = max|X|, the smoothed inputs' range is 1 in every channel; alpha 0: s = 1 / max|W|, the
    smoothed weights' range is 1 in every column."""
    lm, samples = _outlier_model(tmp_path)
    ranges = {}

    def record(name):
        def hook(module, args):
            ranges[name] = torch.maximum(ranges.get(name, torch.zeros(())), args[0].abs().amax(0))
        return hook

    one = _copy(lm)
    smooth(one, samples, alpha=1.0)
    layer = one.model.layers[0]
    hooks = [layer.get_submodule(n).register_forward_pre_hook(record(n)) for n in ("self_attn.qkv_proj",
                                                                                  "mlp.down_proj")]
    _logits(one, samples)
    for h in hooks:
        h.remove()
    for r in ranges.values():
        torch.testing.assert_close(r, torch.ones_like(r))
    zero = _copy(lm)
    smooth(zero, samples, alpha=0.0)
    for n in ("self_attn.qkv_proj", "mlp.down_proj"):  # (gate_up's up rows were divided by down's after)
        w = zero.model.layers[1].get_submodule(n).weight
        torch.testing.assert_close(w.abs().amax(0), torch.ones(w.shape[1]))


# -- (d) the point of SmoothQuant --------------------------------------------------------------------------------------
def _per_token(x: torch.Tensor, kind: str) -> torch.Tensor:
    """What a W8A8 / FP8 layer computes with in place of x: 8 bits per element, one absmax scale per token."""
    top = 127.0 if kind == "int" else 448.0
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / top
    if kind == "int":
        return torch.round(x / scale).clamp(-127, 127) * scale
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def _fake_w8a8(lm):
    """lm with every linear's weight rounded to int8 per output feature and its inputs to int8 per token."""
    lm = _copy(lm)
    for layer in lm.model.layers:
        for name in LINEARS:
            linear = layer.get_submodule(name)
            q, s = quantize_int8(linear.weight.data)
            linear.weight.data = q.float() * s[:, None]
            linear.register_forward_pre_hook(lambda m, args: (_per_token(args[0], "int"),))
    return lm


def test_smoothing_lowers_the_w8a8_error_with_outlier_channels(tmp_path):
    lm, samples = _outlier_model(tmp_path)
    dense = _logits(lm, samples)

    def err(model) -> float:
        return ((_logits(model, samples) - dense).norm() / dense.norm()).item()

    plain = err(_fake_w8a8(lm))
    smoothed = _copy(lm)
    smooth(smoothed, samples, alpha=0.5)
    smooth_err = err(_fake_w8a8(smoothed))
    assert smooth_err < 0.5 * plain, (smooth_err, plain)


# -- (b, c) the checkpoint -------------------------------------------------------------------------------------------
def _expected_config(num_type: str) -> dict:
    """llm-compressor's quantization_config for W8A8 (int) and FP8_DYNAMIC (float), written out."""
    return {"quant_method": "compressed-tensors", "format": f"{num_type}-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": num_type, "symmetric": True, "strategy": "channel",
                            "dynamic": False},
                "input_activations": {"num_bits": 8, "type": num_type, "symmetric": True, "strategy": "token",
                                      "dynamic": True}}},
            "ignore": ["lm_head"]}


def _shape(p: str) -> tuple[int, int]:
    out = {"self_attn.q_proj": HEADS * HEAD_DIM, "self_attn.k_proj": KV_HEADS * HEAD_DIM,
           "self_attn.v_proj": KV_HEADS * HEAD_DIM, "self_attn.o_proj": HIDDEN, "mlp.gate_proj": INTER,
           "mlp.up_proj": INTER, "mlp.down_proj": HIDDEN}[p]
    return out, {"self_attn.o_proj": HEADS * HEAD_DIM, "mlp.down_proj": INTER}.get(p, HIDDEN)


def _check_layout(out: str, tiny: str, num_type: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["quantization_config"] == _expected_config(num_type)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    written = load_file(os.path.join(out, "model.safetensors"))
    dense = load_file(os.path.join(tiny, "model.safetensors"))
    expect = {}
    for name, t in dense.items():
        base = name.removesuffix(".weight")
        if base.endswith(PROJ):
            N, K = _shape(base.split(".", 3)[3])
            expect[base + ".weight"] = (dtype, (N, K))
            expect[base + ".weight_scale"] = (torch.float32, (N, 1))
        else:
            expect[name] = (t.dtype, tuple(t.shape))
    assert {k: (t.dtype, tuple(t.shape)) for k, t in written.items()} == expect
    return written


def _checkpoint_weights(written, i: int, p: str) -> tuple[torch.Tensor, torch.Tensor]:
    base = f"model.layers.{i}.{p}"
    return written[base + ".weight"].float(), written[base + ".weight_scale"]


def _model_part(lm, i: int, p: str) -> torch.Tensor:
    """The dense model's [N, K] weight rows of checkpoint linear p in layer i."""
    c = lm.model.cfg
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    fused, start, size = {"self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
                          "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
                          "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
                          "mlp.gate_proj": ("mlp.gate_up_proj", 0, c.intermediate_size),
                          "mlp.up_proj": ("mlp.gate_up_proj", c.intermediate_size, c.intermediate_size)
                          }.get(p, (p, 0, None))
    w = lm.model.layers[i].get_submodule(fused).weight.data
    return w[start:start + (size or w.shape[0])]


def test_w8a8_checkpoint_is_compressed_tensors_and_the_smoothed_model_within_a_rounding_step(tiny, tmp_path):
    out = str(tmp_path / "w8a8")
    assert main(["quantize", "--model", tiny, "--method", "w8a8", "--alpha", "0.8", "--rounding", "nearest", *CALIB,
                 "--out", out, "--no-eval"]) == 0
    written = _check_layout(out, tiny, "int", torch.int8)
    # the same smoothing, by the library on the same calibration tokens
    lm = load_model(EngineArgs(model=tiny, dtype="float32"))
    samples = calibration_samples(encode(lm.tokenizer, calibration_text(), "calibration"), 4, 64)
    tensors = w8a8_tensors(lm, samples, alpha=0.8, rounding="nearest")
    for i in range(2):
        for p in PROJ:
            q, s = _checkpoint_weights(written, i, p)
            assert torch.equal(q, tensors[f"model.layers.{i}.{p}.weight"].float())
            w = _model_part(lm, i, p)
            assert ((q * s - w).abs() <= s * (0.5 + 1e-5)).all(), p
            assert q.abs().amax() == 127  # one element per row sets the scale
        for norm in ("input_layernorm", "post_attention_layernorm"):  # the smoothed norms went out
            g = written[f"model.layers.{i}.{norm}.weight"]
            assert torch.equal(g, lm.model.layers[i].get_submodule(norm).weight.data)
            assert not torch.equal(g, torch.ones_like(g))


def test_fp8_checkpoint_is_compressed_tensors_and_the_dense_model_within_a_rounding_step(tiny, tmp_path):
    out = str(tmp_path / "fp8")
    assert main(["quantize", "--model", tiny, "--method", "fp8", "--rounding", "nearest", "--out", out,
                 "--no-eval"]) == 0
    written = _check_layout(out, tiny, "float", torch.float8_e4m3fn)
    dense = load_file(os.path.join(tiny, "model.safetensors"))
    for i in range(2):
        for p in PROJ:
            q, s = _checkpoint_weights(written, i, p)
            w = dense[f"model.layers.{i}.{p}.weight"]
            # E4M3: 3 mantissa bits (half a step is 2^-4 of the value), subnormal steps of 2^-9
            assert ((q * s - w).abs() <= w.abs() * 2 ** -4 + s * 2 ** -10).all(), p
            assert (q.abs().amax(1) == 448).all()
        assert torch.equal(written[f"model.layers.{i}.input_layernorm.weight"],
                           dense[f"model.layers.{i}.input_layernorm.weight"])  # nothing smoothed


@pytest.mark.parametrize("method,num_type,dtype", [("fp8", "float", torch.float8_e4m3fn),
                                                    ("w8a8", "int", torch.int8)])
def test_gptq_rounding_checkpoint_keeps_the_scales(tiny, tmp_path, method, num_type, dtype):
    """The default rounding (GPTQ) writes the same layout and the same per-output-feature scales as round to
    nearest; only the values differ."""
    outs = {}
    for rounding in ("gptq", "nearest"):
        outs[rounding] = str(tmp_path / rounding)
        assert main(["quantize", "--model", tiny, "--method", method, "--rounding", rounding, *CALIB, "--out",
                     outs[rounding], "--no-eval"]) == 0
    gptq, nearest = (_check_layout(outs[r], tiny, num_type, dtype) for r in ("gptq", "nearest"))
    moved = 0
    for i in range(2):
        for p in PROJ:
            (qg, sg), (qn, sn) = _checkpoint_weights(gptq, i, p), _checkpoint_weights(nearest, i, p)
            assert torch.equal(sg, sn), p
            moved += int((qg != qn).sum())
    assert moved > 0


@pytest.mark.parametrize("num_type,nearest", [("int", quantize_int8), ("float", quantize_fp8)])
def test_gptq_channel_lowers_the_output_error(num_type, nearest):
    x, w, stats = _correlated_case()
    q, s = gptq_channel(w, stats.gram, num_type)
    qn, sn = nearest(w)
    assert q.dtype == qn.dtype and torch.equal(s, sn)

    def err(q, s) -> float:
        return ((x @ w.T - x @ (q.float() * s[:, None]).T) ** 2).mean().item()

    assert err(q, s) < 0.85 * err(qn, sn), (err(q, s), err(qn, sn))


def test_alpha_out_of_range(tiny, tmp_path, capsys):
    assert main(["quantize", "--model", tiny, "--method", "w8a8", "--alpha", "1.5", "--out",
                 str(tmp_path / "x")]) == 2
    assert "--alpha 1.5" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# -- end to end: written by tachyon quantize, run by the engine ------------------------------------------------------
@pytest.mark.parametrize("method,rounding", [("fp8", "gptq"), ("w8a8", "gptq"), ("w8a8", "nearest")])
def test_engine_runs_the_checkpoint_close_to_the_dense_model(tiny, tmp_path, method, rounding):
    from tachyon import LLM, SamplingParams

    out = str(tmp_path / method)
    assert main(["quantize", "--model", tiny, "--method", method, "--rounding", rounding, *CALIB, "--out", out,
                 "--no-eval"]) == 0
    quant = load_model(EngineArgs(model=out, dtype="float32"))
    layer = quant.model.layers[0]
    assert type(layer.self_attn.qkv_proj).__name__ == {"fp8": "Fp8Linear", "w8a8": "W8A8Linear"}[method]
    dense = load_model(EngineArgs(model=tiny, dtype="float32"))
    ids = encode(dense.tokenizer, heldout_text(), "held-out")
    samples = [ids[:48], ids[48:96]]
    ref, got = _logits(dense, samples), _logits(quant, samples)
    # E4M3 keeps 3 mantissa bits of every weight and activation, int8 about 5-6 of the typical one: on this
    # random model the logits move by about 10% (fp8) and 3% (w8a8) of their norm
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < {"fp8": 0.15, "w8a8": 0.05}[method], rel
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.75
    llm = LLM(model=out, dtype="float32", num_kv_blocks=64, swap_space=0)
    outs = llm.generate("The for statement", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(outs[0].outputs[0].token_ids) == 5
