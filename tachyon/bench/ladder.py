"""`tachyon bench ladder`: one workload up the seeds' steps, each in its own process, one bar chart.

    transformers fp16 eager -> + torch.compile -> + SDPA / flash attention -> bf16 -> Tachyon
    -> Tachyon with each quantization method this build has

Each step is `tachyon bench throughput` with that step's flags in a fresh process, so its peak memory is
its own and a crash or OOM fails only that step; a failed step stays in the table and chart with its reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Flags forwarded from the ladder's own command line to every step.
_FORWARD = ["workload", "input_len", "output_len", "num_prompts", "workload_seed", "prefix_len", "dataset",
            "model", "tokenizer", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
            "kv_cache_memory_gib", "gpu_memory_utilization", "load_format", "hf_batch_size", "num_warmups"]


def _flash_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import flash_attn  # noqa: F401

        return True
    except Exception:
        return False


def quantization_methods() -> list[str]:
    """The methods the engine accepts, if it has a quantization option at all."""
    from tachyon.engine_args import EngineArgs

    if "quantization" not in EngineArgs.field_names():
        return []
    from tachyon.config import QUANTIZATION_METHODS

    return list(QUANTIZATION_METHODS)


def ladder_steps() -> list[tuple[str, list[str]]]:
    attn = "flash_attention_2" if _flash_available() else "sdpa"
    steps = [
        ("hf fp16 eager", ["--backend", "hf", "--hf-dtype", "float16", "--hf-attn", "eager"]),
        ("hf fp16 eager +compile", ["--backend", "hf", "--hf-dtype", "float16", "--hf-attn", "eager",
                                    "--hf-compile"]),
        (f"hf fp16 {attn} +compile", ["--backend", "hf", "--hf-dtype", "float16", "--hf-attn", attn,
                                      "--hf-compile"]),
        (f"hf bf16 {attn} +compile", ["--backend", "hf", "--hf-dtype", "bfloat16", "--hf-attn", attn,
                                      "--hf-compile"]),
        ("tachyon", ["--backend", "tachyon"]),
    ]
    for q in quantization_methods():
        steps.append((f"tachyon {q}", ["--backend", "tachyon", "--quantization", q]))
    return steps


def _forwarded(args) -> list[str]:
    out = []
    for name in _FORWARD:
        v = getattr(args, name, None)
        if v is None or v is False:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(v, tuple):
            v = f"{v[0]}:{v[1]}"
        out += [flag, str(v)]
    if getattr(args, "dtype", "auto") not in (None, "auto"):
        out += ["--dtype", args.dtype]
    return out


def run_step(name: str, flags: list[str], args, tmpdir: str) -> dict:
    out = os.path.join(tmpdir, f"step{abs(hash(name))}.json")
    cmd = [sys.executable, "-m", "tachyon.cli", "bench", "throughput", *flags, *_forwarded(args),
           "--output", out, "--no-progress", "--percentiles", args.percentiles]
    step = {"name": name, "command": " ".join(cmd[2:])}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.step_timeout)
    except subprocess.TimeoutExpired:
        step["error"] = f"timed out after {args.step_timeout:.0f}s"
        return step
    res = None
    if os.path.exists(out):
        with open(out) as f:
            res = json.load(f)
    run = (res or {}).get("runs", [{}])[0] if res else {}
    if p.returncode != 0 or not run.get("metrics"):
        lines = [x for x in (p.stderr or "").strip().splitlines() if x.strip() and "it/s]" not in x]
        step["error"] = run.get("error") or (lines[-1] if lines else f"exit code {p.returncode}")
        return step
    m, mem = run["metrics"], run.get("memory", {})
    step.update(tok_s=m["output_throughput"], total_tok_s=m["total_token_throughput"],
                median_ttft_ms=m["median_ttft_ms"],
                memory_gib=mem.get("gpu_peak_allocated_gib", mem.get("process_peak_rss_gib")),
                memory_kind="GPU peak allocated" if "gpu_peak_allocated_gib" in mem else "CPU peak RSS",
                config=run.get("config"), metrics=m)
    return step


def table(done: list[dict]) -> str:
    """The finished steps as a text table (a failed one with its reason)."""
    lines = [f"{'step':32} {'out tok/s':>12} {'TTFT ms':>10} {'memory GiB':>11}"]
    for s in done:
        if s.get("error"):
            lines.append(f"{s['name']:32} {'failed: ' + s['error'][:80]}")
        else:
            lines.append(f"{s['name']:32} {s['tok_s']:12.1f} {s['median_ttft_ms']:10.1f} {s['memory_gib']:11.2f}")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    lines = [f"# `tachyon bench ladder`: {result['workload']['name']}", "", f"- command: `{result['argv']}`",
             f"- hardware: {result['env']['hardware']}", f"- versions: {result['env']['versions']}",
             f"- git: {result['env']['git']}", "", "| step | output tok/s | median TTFT (ms) | memory (GiB) |",
             "|---|---:|---:|---:|"]
    for s in result["steps"]:
        if s.get("error"):
            lines.append(f"| {s['name']} | failed: {s['error'][:120]} | | |")
        else:
            lines.append(f"| {s['name']} | {s['tok_s']:.1f} | {s['median_ttft_ms']:.1f} | {s['memory_gib']:.2f} "
                         f"({s['memory_kind']}) |")
    if result.get("plot"):
        lines += ["", f"![ladder]({os.path.basename(result['plot'])})"]
    return "\n".join(lines) + "\n"
