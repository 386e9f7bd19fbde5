"""W8A8 checkpoints another tool wrote, loaded by Tachyon: llm-compressor's FP8 (`float-quantized`) and INT8
SmoothQuant (`int-quantized`) compressed-tensors checkpoints of the embedded SmolLM2-135M-Instruct, their
perplexity in `tachyon eval ppl` against that of llm-compressor's own fake-quantized model on the same held-out
tokens and windows. The W4A16 counterpart, whose helpers this reuses, is `llmcompressor_w4a16.py`.

Recipes, every Linear but lm_head:
  fp8_dynamic   QuantizationModifier "FP8_DYNAMIC": E4M3 weights per channel, activations per token (no data)
  w8a8_sq_gptq  SmoothQuantModifier(0.8), GPTQModifier "W8A8": int8 weights per channel, int8 activations per token
  w8a8_sq_rtn   SmoothQuantModifier(0.8), QuantizationModifier "W8A8" (the same, weights rounded to nearest)
  fp8_static    QuantizationModifier "FP8": E4M3 weights per tensor, one static activation scale per tensor

Dynamic int8 activations: compressed-tensors quantizes a token with scale max|x| / 127.5 (its range is -128..127,
half of 255) and clamps to -128..127, so the token's largest positive value lands on 127.5 and is clipped to 127.
Tachyon (like vLLM's int8 kernels) uses max|x| / 127 and -127..127. For int8 recipes the script also scores the
fake-quantized model with the dynamic scale switched to max|x| / 127 (`fake_quant_tachyon_rule`): what is left
between that and Tachyon is arithmetic order alone. `layer0` compares, on one window's real inputs, each layer-0
Linear of the fake-quantized model with `scaled_linear_ref` on the checkpoint's tensors.

The noise floor: rounding activations to 8 bits amplifies fp32-level differences (another attention kernel, another
summation order) into whole steps for the few values near a rounding boundary, and from layer to layer they spread.
`fake_quant_eager_attention` rescores llm-compressor's model with transformers' eager attention instead of sdpa, a
change of that size inside one implementation; Tachyon's difference is to be read against it.

Runs in llm-compressor's venv (see `llmcompressor_w4a16.py`); Tachyon's venv runs `tachyon eval ppl`:

    OMP_NUM_THREADS=1 PYTHONPATH=. /work/venv-llmc/bin/python benchmarks/llmcompressor_w8a8.py \\
        --tachyon /work/venv/bin/tachyon --out /tmp/llmc_w8a8 \\
        --json benchmarks/results/cpu_llmcompressor_w8a8.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time

import torch
from llmcompressor_w4a16 import (
    add_run_args,
    dense_baseline,
    hf_perplexity,
    load_decompressed,
    rel,
    run_oneshot,
    run_report,
    score_tachyon,
    write_json,
)

from tachyon.eval.ppl import DEFAULT_SEQ_LEN
from tachyon.kernels.quant_ref import scaled_linear_ref

RECIPES = ("fp8_dynamic", "w8a8_sq_gptq", "fp8_static", "w8a8_sq_rtn")
SMOOTHING_STRENGTH = 0.8


def recipe(name: str) -> list:
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    if name == "fp8_dynamic":
        return [QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])]
    if name == "w8a8_sq_gptq":
        return [SmoothQuantModifier(smoothing_strength=SMOOTHING_STRENGTH),
                GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]
    if name == "w8a8_sq_rtn":
        return [SmoothQuantModifier(smoothing_strength=SMOOTHING_STRENGTH),
                QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]
    if name == "fp8_static":
        return [QuantizationModifier(targets="Linear", scheme="FP8", ignore=["lm_head"])]
    raise ValueError(f"unknown recipe {name!r}; one of {RECIPES}")


@contextlib.contextmanager
def int8_scale_over_127():
    """compressed-tensors' dynamic int8 scale, max|x| / 127.5, replaced by Tachyon's max|x| / 127 (the values
    then lie in -127..127, so its -128..127 clamp no longer clips). FP8's scale, max|x| / 448, is left as is."""
    forward = importlib.import_module("compressed_tensors.quantization.lifecycle.forward")
    own = forward.compute_dynamic_scales_and_zp

    def tachyon_rule(value, args, module, global_scale=None):
        scale, zp = own(value=value, args=args, module=module, global_scale=global_scale)
        if args.type == "int" and args.num_bits == 8 and args.symmetric:
            scale = scale * (127.5 / 127)
        return scale, zp

    forward.compute_dynamic_scales_and_zp = tachyon_rule
    try:
        yield
    finally:
        forward.compute_dynamic_scales_and_zp = own


def layer0_linears(model) -> dict:
    return {n: m for n, m in model.named_modules() if ".layers.0." in n and isinstance(m, torch.nn.Linear)}


@torch.inference_mode()
def capture_layer0(model, window: list[int]) -> dict:
    """Each layer-0 Linear's input and fake-quantized output on one window."""
    seen, hooks = {}, []
    for name, mod in layer0_linears(model).items():
        hooks.append(mod.register_forward_hook(
            lambda m, inp, out, name=name: seen.__setitem__(name, (inp[0][0].clone(), out[0].clone()))))
    model(input_ids=torch.tensor([window]), use_cache=False)
    for h in hooks:
        h.remove()
    return seen


def compare_layer0(seen: dict, path: str) -> dict:
    """scaled_linear_ref on the checkpoint's tensors against llm-compressor's fake-quantized output, per Linear:
    the largest difference relative to the largest output, and the mean one relative to the mean |y|."""
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(path, f)))
    out = {}
    for name, (x, y) in seen.items():
        t = {k: tensors.get(f"{name}.{k}") for k in ("weight", "weight_scale", "input_scale", "bias")}
        ours = scaled_linear_ref(x.float(), t["weight"], t["weight_scale"].float().reshape(-1).expand(t["weight"].shape[0]).contiguous(), t["bias"],
                                 None if t["input_scale"] is None else t["input_scale"].float().reshape(1))
        d = (ours - y).abs()
        out[name.split(".layers.0.")[1]] = {"max_rel": (d.max() / y.abs().max()).item(),
                                            "mean_rel": (d.mean() / y.abs().mean()).item()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, "llmc_w8a8", RECIPES)
    args = p.parse_args(argv)
    started = time.time()
    command, dense_dir, tok, gguf, ids, dense = dense_baseline(args, "+.2e")

    results = {}
    for name in args.recipes.split(","):
        t0 = time.time()
        model, r = run_oneshot(recipe(name), dense_dir, tok, args.calib_samples)
        r["fake_quant"] = hf_perplexity(model, ids, DEFAULT_SEQ_LEN)  # oneshot leaves the model fake-quantized
        # the noise floor: transformers' own eager attention instead of sdpa, an fp32-rounding-level change
        model.set_attn_implementation("eager")
        r["fake_quant_eager_attention"] = hf_perplexity(model, ids, DEFAULT_SEQ_LEN)
        model.set_attn_implementation("sdpa")
        r["eager_vs_sdpa"] = rel(r["fake_quant_eager_attention"]["ppl"], r["fake_quant"]["ppl"])
        int8 = name.startswith("w8a8")
        if int8:
            with int8_scale_over_127():
                r["fake_quant_tachyon_rule"] = hf_perplexity(model, ids, DEFAULT_SEQ_LEN)
        seen = capture_layer0(model, ids[:DEFAULT_SEQ_LEN])
        if int8:
            with int8_scale_over_127():
                seen_rule = capture_layer0(model, ids[:DEFAULT_SEQ_LEN])
        path = os.path.join(args.out, name)
        model.save_pretrained(path, save_compressed=True)
        tok.save_pretrained(path)
        del model
        r["checkpoint_quantization_config"] = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
        r["layer0"] = {"llmcompressor_rule": compare_layer0(seen, path)}
        if int8:
            r["layer0"]["tachyon_rule"] = compare_layer0(seen_rule, path)
        try:
            r["hf_decompressed"] = hf_perplexity(load_decompressed(path), ids, DEFAULT_SEQ_LEN)
        except Exception as e:  # a reload transformers cannot do on the CPU is noted, not fatal
            r["hf_decompressed"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        got = score_tachyon(r, args, path, dense, "+.2e")
        if int8 and "ppl" in r["tachyon"]:
            r["rel_diff_tachyon_rule"] = rel(r["tachyon"]["ppl"], r["fake_quant_tachyon_rule"]["ppl"])
            got += f", vs max|x|/127 fake-quant {r['rel_diff_tachyon_rule']:+.2e}"
        r["all_s"] = round(time.time() - t0, 1)
        results[name] = r
        reloaded = r["hf_decompressed"].get("ppl", float("nan"))
        print(f"{name}: fake-quant {r['fake_quant']['ppl']:.4f} ({r['vs_dense']:+.2%} vs dense), reloaded "
              f"{reloaded:.4f}, {got} [oneshot {r['oneshot_s']:.0f} s, all {r['all_s']:.0f} s]", flush=True)
        if args.json:  # after every recipe, so a run cut short keeps what it measured
            write_json(args.json, {**run_report(command, args, gguf, dense, wall_s=round(time.time() - started, 1)),
                                    "w8a8": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
