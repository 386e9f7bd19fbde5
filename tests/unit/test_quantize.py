"""`tachyon quantize`: int8 and AWQ checkpoints written, loaded back by the engine, and what the loaded layers
hold compared with what was written; AutoAWQ's nibble order against an independent writer of AutoAWQ's packing
loop; the AWQ scale search against round-to-nearest on inputs with outlier channels; the CLI's errors."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from tachyon import LLM, SamplingParams
from tachyon.cli import main
from tachyon.engine_args import EngineArgs
from tachyon.eval.ppl import load_model
from tachyon.kernels.quant_ref import dequantize_int4
from tachyon.layers.linear import quantize_int8
from tachyon.quantize.awq import (
    InputStats,
    awq_tensors,
    dequantize_groups,
    fake_quantize,
    gptq_round,
    output_error,
    pack_awq,
    quantize_groups,
    refine_scales,
    search_clip,
    search_scale,
)
from tests.unit.test_eval_ppl import make_tiny_with_tokenizer

AUTOAWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, embedded_dir):
    path = str(tmp_path_factory.mktemp("tiny_llama_q"))
    make_tiny_with_tokenizer(path, embedded_dir)
    return path


def _llm(path: str) -> LLM:
    return LLM(model=path, dtype="float32", num_kv_blocks=64, swap_space=0)


def _generates(llm: LLM) -> None:
    out = llm.generate("The for statement", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5


# -- an independent AutoAWQ writer: AutoAWQ's packing loop, written out ----------------------------------------------
def autoawq_pack(intweight: torch.Tensor) -> torch.Tensor:
    """[K, N] ints 0..15 -> int32 [K, N / 8]: word `col` holds column col * 8 + order_map[i] in nibble i."""
    K, N = intweight.shape
    packed = torch.zeros(K, N // 8, dtype=torch.int64)
    for col in range(N // 8):
        for i in range(8):
            packed[:, col] |= intweight[:, col * 8 + AUTOAWQ_ORDER[i]].long() << (i * 4)
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)  # the int32 bit pattern


def autoawq_unpack(packed: torch.Tensor) -> torch.Tensor:
    K, P = packed.shape
    out = torch.empty(K, P * 8, dtype=torch.int64)
    words = packed.long() & 0xFFFFFFFF
    for col in range(P):
        for i in range(8):
            out[:, col * 8 + AUTOAWQ_ORDER[i]] = (words[:, col] >> (i * 4)) & 0xF
    return out


def autoawq_dequant(qweight, qzeros, scales, G) -> torch.Tensor:
    """[K, N] fp32 from AutoAWQ tensors, by the test's own unpacking."""
    q, z = autoawq_unpack(qweight), autoawq_unpack(qzeros).repeat_interleave(G, 0)
    return (q - z).float() * scales.float().repeat_interleave(G, 0)


def test_pack_awq_is_autoawq_packing_loop_bit_for_bit():
    torch.manual_seed(0)
    q = torch.randint(0, 16, (24, 128), dtype=torch.int32)  # [N, K] as quantize_groups gives them
    z = torch.randint(0, 16, (24, 2), dtype=torch.int32)
    s = torch.rand(24, 2) * 0.01
    t = pack_awq("x", q, z, s)
    assert torch.equal(t["x.qweight"], autoawq_pack(q.T))
    assert torch.equal(t["x.qzeros"], autoawq_pack(z.T))
    assert t["x.scales"].dtype == torch.float16 and torch.equal(t["x.scales"], s.T.half())


def test_checkpoint_from_the_independent_writer_loads_with_identical_weights(tiny, tmp_path):
    """Random int4 values packed by the AutoAWQ loop above; Tachyon's loaded layers dequantize to the same."""
    G = 64
    dense = load_file(os.path.join(tiny, "model.safetensors"))
    cfg = json.load(open(os.path.join(tiny, "config.json")))
    gen = torch.Generator().manual_seed(1)
    tensors, expect = {}, {}
    for name, t in dense.items():
        base = name.removesuffix(".weight")
        if not base.endswith(PROJ):
            tensors[name] = t
            continue
        N, K = t.shape
        q = torch.randint(0, 16, (K, N), generator=gen)
        z = torch.randint(0, 16, (K // G, N), generator=gen)
        s = (torch.rand(K // G, N, generator=gen) * 0.01).half()
        tensors.update({base + ".qweight": autoawq_pack(q), base + ".qzeros": autoawq_pack(z), base + ".scales": s})
        expect[base] = (q - z.repeat_interleave(G, 0)).float() * s.float().repeat_interleave(G, 0)
    out = tmp_path / "autoawq"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True,
                                  "version": "gemm"}
    (out / "config.json").write_text(json.dumps(cfg))
    for f in os.listdir(tiny):
        if f.startswith("tokenizer"):
            (out / f).write_bytes(open(os.path.join(tiny, f), "rb").read())
    llm = _llm(str(out))
    for base, w in expect.items():
        assert torch.equal(_loaded_dense(llm, base, G), w), base
    _generates(llm)


def _loaded_dense(llm: LLM, hf_base: str, G: int) -> torch.Tensor:
    """The [K, N] weight the engine's layer holds for checkpoint layer hf_base (its slice of a fused layer)."""
    model = llm.engine.runner.model
    c = model.cfg
    q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    i = int(hf_base.split(".")[2])
    part = hf_base.split(".", 3)[3]
    fused, rows = {"self_attn.q_proj": ("self_attn.qkv_proj", (0, q)),
                   "self_attn.k_proj": ("self_attn.qkv_proj", (q, kv)),
                   "self_attn.v_proj": ("self_attn.qkv_proj", (q + kv, kv)),
                   "mlp.gate_proj": ("mlp.gate_up_proj", (0, inter)),
                   "mlp.up_proj": ("mlp.gate_up_proj", (inter, inter))}.get(part, (part, None))
    layer = model.layers[i].get_submodule(fused)
    if hasattr(layer, "qzeros"):
        w = dequantize_int4(layer.qweight, layer.qzeros, layer.scales, G)
    else:
        w = (layer.qweight.float() * layer.scales.float()[:, None]).T
    return w if rows is None else w[:, rows[0]:rows[0] + rows[1]]


# -- round trips through the CLI ------------------------------------------------------------------------------------
def test_int8_round_trip(tiny, tmp_path):
    out = str(tmp_path / "int8")
    assert main(["quantize", "--model", tiny, "--method", "int8", "--out", out, "--no-eval"]) == 0
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["quantization_config"]["quant_method"] == "int8"
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(os.listdir(out))
    written = load_file(os.path.join(out, "model.safetensors"))
    dense = load_file(os.path.join(tiny, "model.safetensors"))
    llm = _llm(out)
    for i in range(2):
        for p in PROJ:
            base = f"model.layers.{i}.{p}"
            q, s = quantize_int8(dense[base + ".weight"])
            assert torch.equal(written[base + ".qweight"], q) and torch.equal(written[base + ".scales"], s)
            assert torch.equal(_loaded_dense(llm, base, 0), (q.float() * s[:, None]).T)
    assert torch.equal(written["model.embed_tokens.weight"], dense["model.embed_tokens.weight"])
    assert "lm_head.weight" not in written  # tied
    _generates(llm)


# GPTQ trades error on the weights for error on the outputs: its weights sit further from the dense ones
@pytest.mark.parametrize("rounding,tolerance", [("nearest", 0.15), ("gptq", 0.3)])
def test_awq_round_trip(tiny, tmp_path, rounding, tolerance):
    out = str(tmp_path / "awq")
    assert main(["quantize", "--model", tiny, "--method", "awq", "--group-size", "64", "--calib-samples", "4",
                 "--calib-seq-len", "128", "--rounding", rounding, "--out", out, "--no-eval"]) == 0
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                                          "version": "gemm", "modules_to_not_convert": None}
    written = load_file(os.path.join(out, "model.safetensors"))
    dense = load_file(os.path.join(tiny, "model.safetensors"))
    llm = _llm(out)
    for i in range(2):
        for p in PROJ:
            base = f"model.layers.{i}.{p}"
            w = autoawq_dequant(written[base + ".qweight"], written[base + ".qzeros"], written[base + ".scales"], 64)
            assert torch.equal(_loaded_dense(llm, base, 64), w), base
        # the scales folded into the norm: norm weight x dequantized weight ~ the dense product (not up_proj:
        # its rows carry down_proj's scales too)
        for norm, projs in (("input_layernorm", PROJ[:3]), ("post_attention_layernorm", PROJ[4:5])):
            g, g0 = written[f"model.layers.{i}.{norm}.weight"], dense[f"model.layers.{i}.{norm}.weight"]
            for p in projs:
                base = f"model.layers.{i}.{p}"
                eff = _loaded_dense(llm, base, 64).T * g
                ref = dense[base + ".weight"] * g0
                assert (eff - ref).norm() / ref.norm() < tolerance, base
    _generates(llm)


def test_folding_keeps_the_dense_model_and_o_proj_scales_through_v(tmp_path):
    """awq_tensors folds its scales into the dense model in place (norms, v rows and bias, up rows): before
    rounding, the model computes what it did. MHA with qkv bias, so o_proj's scale goes into v."""
    cfg = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256,
           "eos_token_id": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    lm = load_model(EngineArgs(model=str(tmp_path / "config.json"), load_format="dummy", dtype="float32"))
    model = lm.model
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.embed_tokens.weight[:, :4] *= 30  # outlier channels, so the scales are far from 1
        for n in ("input_layernorm", "post_attention_layernorm"):
            model.layers[0].get_submodule(n).weight.uniform_(0.5, 1.5, generator=gen)
    samples = [torch.randint(0, 256, (96,), generator=gen).tolist() for _ in range(3)]

    def hidden() -> torch.Tensor:
        from tachyon.eval.ppl import kv_cache, positions_of, prefill_metadata

        meta, nb = prefill_metadata([96], 16, "cpu")
        kv = [kv_cache(model.cfg, nb, 16, torch.float32, "cpu")]
        with torch.no_grad():
            return model(torch.tensor(samples[0]), positions_of([96], "cpu"), kv, meta, lm.backend)

    before = hidden()
    attn = model.layers[0].self_attn
    v_bias = attn.qkv_proj.bias[256:].clone()
    tensors, alphas = awq_tensors(lm, samples, 64, progress=False)
    assert set(alphas[0]) == {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"}
    assert alphas[0]["self_attn.qkv_proj"] > 0  # the outliers made scaling worth it
    assert not torch.equal(attn.qkv_proj.bias[256:], v_bias) or alphas[0]["self_attn.o_proj"] == 0
    torch.testing.assert_close(hidden(), before, rtol=1e-4, atol=1e-4)
    assert {k.rpartition(".")[2] for k in tensors} == {"qweight", "qzeros", "scales"}


# -- the search ------------------------------------------------------------------------------------------------
def _outlier_case(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    T, K, N = 2048, 256, 96
    x = torch.randn(T, K, generator=gen)
    x[:, torch.randperm(K, generator=gen)[:6]] *= 40  # a few input channels dominate the output
    w = torch.randn(N, K, generator=gen) * 0.02
    stats = InputStats(K, "cpu")
    stats.add(x)
    return x, w, stats


def test_output_error_from_the_gram_matrix_is_the_direct_one():
    x, w, stats = _outlier_case()
    w_hat = fake_quantize(w, 64)
    direct = ((x.double() @ w.double().T - x.double() @ w_hat.double().T) ** 2).sum().item()
    assert output_error(w, w_hat, stats.gram) == pytest.approx(direct, rel=1e-6)


def test_awq_search_beats_round_to_nearest_with_outlier_channels():
    x, w, stats = _outlier_case()
    G = 64
    s, alpha = search_scale(w, stats, G)
    assert alpha > 0

    def mse(w_hat):
        return ((x @ w.T - x @ w_hat.T) ** 2).mean().item()

    rtn = mse(fake_quantize(w, G))
    awq = mse(fake_quantize(w * s, G) / s)
    assert awq < 0.7 * rtn, (awq, rtn)
    # the clip search (on the scaled weight, inputs x / s) only lowers the error further
    ratio = search_clip(w * s, stats.scaled(s), G)
    assert ratio.min() < 1
    clipped = mse(fake_quantize(w * s, G, ratio) / s)
    assert clipped <= awq * 1.0001


def _correlated_case(seed: int = 0):
    """Inputs whose channels are mixed (so H is far from diagonal), one outlier channel group."""
    gen = torch.Generator().manual_seed(seed)
    T, K, N = 2048, 256, 64
    x = torch.randn(T, K, generator=gen) @ (torch.eye(K) + 0.3 * torch.randn(K, K, generator=gen) / K ** 0.5)
    x[:, :8] *= 10
    stats = InputStats(K, "cpu")
    stats.add(x)
    return x, torch.randn(N, K, generator=gen) * 0.02, stats


def test_gptq_rounding_beats_nearest_on_the_output_error():
    x, w, stats = _correlated_case()
    G = 64
    nearest = quantize_groups(w, G)
    refit = refine_scales(w, stats, G, *quantize_groups(w, G, search_clip(w, stats, G)))
    gptq = gptq_round(w, stats.gram, G)
    err = {name: output_error(w, dequantize_groups(*r, G), stats.gram)
           for name, r in (("nearest", nearest), ("refit", refit), ("gptq", gptq))}
    assert err["refit"] < 0.8 * err["nearest"] and err["gptq"] < 0.9 * err["refit"], err
    q, z, sc = gptq
    assert q.dtype == z.dtype == torch.int32 and q.shape == w.shape and z.shape == sc.shape == (64, 4)
    assert 0 <= int(q.min()) and int(q.max()) <= 15 and 0 <= int(z.min()) and int(z.max()) <= 15
    assert torch.equal(sc, sc.half().float())  # stored as fp16


def test_refit_never_raises_a_groups_error():
    x, w, stats = _correlated_case(1)
    G = 32
    before, after = quantize_groups(w, G), refine_scales(w, stats, G, *quantize_groups(w, G))
    blocks = stats.gram.reshape(8, G, 8, G).diagonal(dim1=0, dim2=2).permute(2, 0, 1)

    def per_group(r):
        d = (w - dequantize_groups(*r, G)).double().reshape(64, 8, G).transpose(0, 1)
        return ((d @ blocks) * d).sum(-1)

    assert (per_group(after) <= per_group(before) * (1 + 1e-9)).all()
    assert torch.equal(after[1], before[1])  # zero points kept
    assert (per_group(after) < per_group(before)).any()


def test_gptq_keeps_weights_already_on_the_grid():
    """Nothing to compensate when every weight is representable: GPTQ returns the exact levels."""
    G = 32
    levels = torch.randint(0, 16, (8, 64), generator=torch.Generator().manual_seed(2)).float()
    levels[:, ::G], levels[:, 1::G] = 0, 15
    w = (levels - 5) * 0.0625
    _, _, stats = _correlated_case()
    q, z, s = gptq_round(w, stats.gram[:64, :64], G)
    assert torch.equal(q.float(), levels) and (z == 5).all() and (s == 0.0625).all()


def test_rounding_is_asymmetric_and_exact_on_a_16_level_grid():
    G = 32
    levels = torch.randint(0, 16, (8, 64), generator=torch.Generator().manual_seed(0)).float()
    levels[:, ::G] = 0
    levels[:, 1::G] = 15  # every group spans all 16 levels
    w = (levels - 5) * 0.0625  # scale and zero exactly representable
    q, z, s = quantize_groups(w, G)
    assert torch.equal(q.float(), levels) and (z == 5).all() and (s == 0.0625).all()
    assert torch.equal(fake_quantize(w, G), w)


# -- the command line -----------------------------------------------------------------------------------------------
def test_cli_errors(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["quantize", "--model", tiny, "--method", "gptq", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "invalid choice: 'gptq'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["quantize", "--model", tiny, "--method", "int8"])
    assert e.value.code == 2 and "required: --out" in capsys.readouterr().err
    assert main(["quantize", "--model", tiny, "--method", "awq", "--group-size", "256", "--out",
                 str(tmp_path / "y")]) == 2
    assert "pass --group-size 128" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    assert main(["quantize", "--model", tiny, "--method", "int8", "--out", str(tmp_path / "full")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    out = str(tmp_path / "q")
    assert main(["quantize", "--model", tiny, "--method", "int8", "--out", out, "--no-eval"]) == 0
    assert main(["quantize", "--model", out, "--method", "awq", "--out", str(tmp_path / "z")]) == 2
    assert "already int8-quantized" in capsys.readouterr().err
