"""One script per H200 call: correctness of the GPU path, then the llama3-8b workloads, Tachyon and the
transformers baseline in the same run. Writes JSON under --out.

    PYTHONPATH=. python benchmarks/gpu_run.py correctness --out $OUT/correctness.json
    PYTHONPATH=. python benchmarks/gpu_run.py perf --workloads single,sweep,throughput,random,prefix,hf --out $OUT/perf.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon import LLM, SamplingParams  # noqa: E402
from tachyon.bench.workloads import NAMED, build  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA8B = os.path.join(HERE, "models", "llama3-8b.json")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def env_info() -> dict:
    import transformers
    import triton

    p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {"gpu": p.name if p else None, "gpu_mem_gib": p.total_memory / 2**30 if p else None,
            "torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count()}


# -- ceilings ------------------------------------------------------------------------------------------------
def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (median of 20)."""
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / sorted(times)[len(times) // 2]


# -- correctness ----------------------------------------------------------------------------------------------
def _set_fused(model, on: bool):
    from tachyon.layers.activation import silu_and_mul_ref
    from tachyon.layers.norm import RMSNorm
    from tachyon.layers.rotary import RotaryEmbedding
    from tachyon.layers.triton_backend import install_fused_ops
    from tachyon.models.llama import MLP

    if on:
        install_fused_ops(model)
        return
    for m in model.modules():
        if isinstance(m, (RMSNorm, RotaryEmbedding)):
            m.fused = None
        elif isinstance(m, MLP):
            m.act = silu_and_mul_ref


def triton_vs_torch(model_dir: str, enforce_eager: bool, dtype: str = "bfloat16") -> dict:
    """Every step of a staggered workload (prefill chunks, prefix hits, decodes) runs twice from the same KV
    state: the pure-torch reference path, then the Triton path (CUDA graphs unless eager). Compare logits."""
    from tachyon.layers.attention import TorchAttentionBackend

    llm = LLM(model=model_dir, dtype=dtype, max_num_batched_tokens=256, enforce_eager=enforce_eager,
              swap_space=0, gpu_memory_utilization=0.3, max_model_len=2048)
    runner = llm.engine.runner
    ref_backend = TorchAttentionBackend()
    errs, argmax_same, kinds = [], [], {"mixed": 0, "decode_only": 0, "prefill_only": 0, "graph_steps": 0,
                                        "piecewise_graph_steps": 0}
    captured = {}
    orig_sample = runner.sampler.sample

    def sample(logits, reqs, num_outputs=None):
        captured["logits"] = logits.clone()
        return orig_sample(logits, reqs, num_outputs)

    runner.sampler.sample = sample
    orig_submit = runner.submit

    def submit(out):
        x = runner.prepare(out.seqs)
        backup = runner._kv.clone()
        _set_fused(runner.model, False)
        with torch.inference_mode():
            hidden = runner.model(runner._input_ids(x), runner._to_device(x.positions), runner.kv_caches,
                                  runner._metadata(x), ref_backend)
            ref = runner.model.compute_logits(hidden[runner._to_device(x.logits_indices)]) if x.sample_reqs else None
        _set_fused(runner.model, True)
        runner._kv.copy_(backup)
        nd, S = x.num_decodes, len(x.q_lens)
        kinds["decode_only" if nd == S else "prefill_only" if nd == 0 else "mixed"] += 1
        if nd == S and runner.cuda_graphs is not None and runner.cuda_graphs.fits(S):
            kinds["graph_steps"] += 1
        elif nd != S and runner.piecewise_graphs is not None and runner.piecewise_graphs.fits(len(x.positions)):
            kinds["piecewise_graph_steps"] += 1
        captured.pop("logits", None)
        result = orig_submit(out)
        if ref is not None:
            got = captured["logits"][: ref.shape[0]]
            errs.append(((got - ref).norm() / ref.norm()).item())
            argmax_same.append((got.argmax(-1) == ref.argmax(-1)).float().mean().item())
        return result

    runner.submit = submit
    rng = random.Random(0)
    prefixes = [[rng.randrange(100, 30000) for _ in range(rng.choice([64, 160]))] for _ in range(3)]
    prompts = [prefixes[i % 3] + [rng.randrange(100, 30000) for _ in range(rng.randrange(5, 300))] for i in range(24)]
    eng = llm.engine
    pending = list(enumerate(prompts))
    while pending or eng.has_unfinished_requests():
        for _ in range(3):
            if pending:
                i, p = pending.pop(0)
                eng.add_request(f"c{i}", None, p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        eng.step()
    eng.check_integrity()
    res = {"steps": len(errs), "max_rel_err": max(errs), "median_rel_err": sorted(errs)[len(errs) // 2],
           "argmax_agreement": sum(argmax_same) / len(argmax_same),
           "step_kinds": kinds, "prefix_hit_tokens": eng.kv.prefix_hits, "enforce_eager": enforce_eager, "dtype": dtype}
    runner.submit = orig_submit  # break the closures' reference cycles so the engine can be freed
    del runner.sampler.sample
    return res  # the caller collects the engine once this frame is gone


def _hf_greedy(hf_model, prompts, new) -> list[list[int]]:
    hf_model.generation_config.eos_token_id = None  # no EOS stop, no EOS masking: plain argmax decoding
    outs = []
    for p in prompts:
        ids = torch.tensor([p], device=hf_model.device)
        with torch.no_grad():
            o = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                  pad_token_id=0)
        outs.append(o[0, len(p):].tolist())
    return outs


def _agreement(a: list[list[int]], b: list[list[int]], new: int) -> dict:
    firsts = [next((i for i, (x, y) in enumerate(zip(u, v, strict=False)) if x != y), new) for u, v in zip(a, b, strict=True)]
    return {"exact_fraction": sum(u == v for u, v in zip(a, b, strict=True)) / len(a),
            "mean_tokens_before_first_divergence": sum(firsts) / len(firsts)}


def _random_prompts(n: int, vocab_hi: int) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(100, vocab_hi) for _ in range(rng.randrange(65, 400))] for _ in range(n)]


def _cycle_prompts(n: int, vocab_hi: int) -> list[list[int]]:
    """Prompts of 65-400 tokens that repeat a random segment of 8-32 tokens: the trained model's task."""
    rng = random.Random(2)
    out = []
    for _ in range(n):
        seg = [rng.randrange(100, vocab_hi) for _ in range(rng.randrange(8, 33))]
        length = rng.randrange(65, 400)
        out.append((seg * (length // len(seg) + 1))[:length])
    return out


def trained_copy_llama(path: str, device: str, vocab: int = 512, hidden: int = 128, layers: int = 2,
                       steps: int = 1500, batch: int = 32, seq: int = 96) -> dict:
    """A small Llama made here and trained for a few seconds to continue a repeated segment (an induction
    task), saved to `path` in fp32. A random-weight model's logits are nearly tied, so bf16 rounding flips its
    greedy choices whatever the implementation (transformers bf16 vs fp32 agree on 0/48 prompts); a model with
    real margins tests the bf16 path itself. The defaults learn the task on a CPU in ~500 steps (loss 6.3 -> 1.3
    by 700, cpu_trained_greedy.json); vocab 4096 / hidden 512 / 4 layers had not left the plateau after 600
    steps on the H200 (loss 8.4 -> 7.9)."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                   num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                   num_key_value_heads=max(1, hidden // 128), max_position_embeddings=4096,
                                   initializer_range=0.02, rms_norm_eps=1e-5, rope_theta=500000.0,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    losses = []
    for step in range(steps):
        rows = []
        for _ in range(batch):
            seg = torch.randint(100, vocab, (int(torch.randint(8, 33, (1,), generator=g)),), generator=g)
            rows.append(seg.repeat(seq // len(seg) + 1)[:seq])
        x = torch.stack(rows).to(device)
        loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 50 == 0 or step == steps - 1:
            losses.append((step, round(loss.item(), 3)))
    model.save_pretrained(path)
    return {"vocab": vocab, "hidden": hidden, "layers": layers, "steps": steps, "batch": batch, "seq": seq,
            "train_s": round(time.perf_counter() - t0, 1), "loss": losses}


def greedy_vs_transformers(model_dir: str, hf_model, dtype: str, hf_ref: list[list[int]] | None = None,
                           prompts: list[list[int]] | None = None) -> dict:
    kw = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}
    llm = LLM(model=model_dir, dtype=dtype, swap_space=0, max_model_len=2048, **kw)
    prompts = prompts or _random_prompts(48, 30000)
    new = 32
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=new, ignore_eos=True))
    got = [o.outputs[0].token_ids for o in outs]
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    ref = _hf_greedy(hf_model, prompts, new)
    res = {"dtype": dtype, "prompts": len(prompts), "prompt_lens": "65..400", "new_tokens": new,
           "tachyon_vs_transformers": _agreement(got, ref, new)}
    if hf_ref is not None:
        res["transformers_this_dtype_vs_transformers_fp32"] = _agreement(ref, hf_ref, new)
    return res, ref


def cmd_correctness(args) -> dict:
    import transformers

    out = {"env": env_info()}
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                                   initializer_range=0.06, rms_norm_eps=1e-5, rope_theta=500000.0,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    # Made in fp32 and saved; each dtype is then loaded with from_pretrained. (Casting a model with .to(bf16)
    # also casts transformers' rotary inv_freq buffer, which changes its positions: not the same model.)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d := tempfile.mkdtemp())
    for dtype in (("float32", "bfloat16") if not args.greedy_only else ()):
        for eager in (True, False):
            key = f"triton_vs_torch_{dtype}_{'eager' if eager else 'graphs'}"
            try:
                out[key] = triton_vs_torch(d, eager, dtype)
            except Exception:
                out[key] = {"error": traceback.format_exc()}
            gc.collect()
            torch.cuda.empty_cache()
            log(key, out[key])
    if not args.trained_only:
        out.update(greedy_both_dtypes(d, "greedy_vs_transformers", None))
    if args.trained or args.trained_only:
        t = tempfile.mkdtemp()
        try:
            out["trained_model"] = trained_copy_llama(t, "cuda")
            log("trained_model", out["trained_model"])
            out.update(greedy_both_dtypes(t, "trained_greedy_vs_transformers", _cycle_prompts(48, 512)))
        except Exception:
            out["trained_model"] = {"error": traceback.format_exc()}
    return out


def greedy_both_dtypes(model_dir: str, prefix: str, prompts: list[list[int]] | None, device: str = "cuda") -> dict:
    """Tachyon vs transformers greedy in fp32 and bf16 on one checkpoint; bf16 also vs transformers fp32."""
    import transformers

    out, hf32 = {}, None
    for dtype in ("float32", "bfloat16"):
        key = f"{prefix}_{dtype}"
        try:
            hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
            out[key], ref = greedy_vs_transformers(model_dir, hf.eval(), dtype, hf32, prompts)
            del hf
            hf32 = ref if dtype == "float32" else hf32
        except Exception:
            out[key] = {"error": traceback.format_exc()}
        log(key, out[key])
    return out


# -- performance ----------------------------------------------------------------------------------------------
def run_offline(llm, reqs) -> dict:
    """All requests at once (no per-step outputs); first-token and finish times from the request metrics.
    Also splits the wall time by step kind (decode-only vs steps with prefill tokens)."""
    eng = llm.engine
    first, done = {}, {}
    steps = {"decode": [0, 0.0, 0], "mixed": [0, 0.0, 0]}  # count, seconds, tokens
    sched = eng.scheduler
    orig = sched.schedule

    def schedule(num_in_flight=0):
        out = orig(num_in_flight)
        kind = "decode" if all(x.num_new_tokens == 1 for x in out.seqs) else "mixed"
        schedule.kind, schedule.tokens = kind, sum(x.num_new_tokens for x in out.seqs)
        return out

    sched.schedule = schedule
    t0 = time.monotonic()
    for i, r in enumerate(reqs):
        eng.add_request(f"p{i}", None, r.prompt_token_ids,
                        SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True), stream=False)
    try:
        with torch.inference_mode():
            while eng.has_unfinished_requests():
                ts = time.monotonic()
                for o in eng.step():
                    if o.finished:
                        first[o.request_id] = o.metrics.first_token_time - t0
                        done[o.request_id] = o.metrics.finished_time - t0
                st = steps[schedule.kind]
                st[0] += 1
                st[1] += time.monotonic() - ts
                st[2] += schedule.tokens
    finally:
        del sched.schedule
    dur = max(done.values())
    n_out = sum(r.output_len for r in reqs)
    n_in = sum(r.prompt_len for r in reqs)
    return {"requests": len(reqs), "duration_s": dur, "output_tok_s": n_out / dur, "total_tok_s": (n_in + n_out) / dur,
            "mean_ttft_s": sum(first.values()) / len(first), "time_to_all_first_tokens_s": max(first.values()),
            "steps": {k: {"count": c, "seconds": round(t, 3), "tokens": n, "ms_per_step": round(1e3 * t / max(c, 1), 3)}
                      for k, (c, t, n) in steps.items()}}


def _triton_compiled() -> int:
    """How many kernel variants Triton holds compiled for tachyon's kernels (a rise mid-run is a JIT stall)."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import tachyon.kernels

    n = 0
    for m in pkgutil.iter_modules(tachyon.kernels.__path__):
        mod = importlib.import_module(f"tachyon.kernels.{m.name}")
        for v in vars(mod).values():
            fn = getattr(v, "fn", v)  # autotuned/heuristics wrappers hold the JITFunction in .fn
            if isinstance(fn, JITFunction):
                n += sum(len(c[0]) for c in getattr(fn, "device_caches", {}).values())
    return n


class DeviceTimeline:
    """CUDA events around each runner.submit: a step's device time (its first kernel to the copy of its sampled
    ids) and the device's idle time before it, by kind (decode: one token a sequence; mixed: prompt tokens too).
    Unlike the host time of engine.step, which waits on the oldest step in flight, these belong to the step."""

    def __init__(self, runner):
        self.runner, self.orig, self.steps = runner, runner.submit, []

        def submit(sched):
            s = torch.cuda.Event(enable_timing=True)
            s.record()
            h = self.orig(sched)
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            n = sum(x.num_new_tokens for x in sched.seqs)
            self.steps.append((s, e, n, sum(x.num_new_tokens == 1 for x in sched.seqs)))
            return h

        runner.submit = submit

    def close(self) -> dict:
        del self.runner.submit
        torch.cuda.synchronize()
        rows = [(s.elapsed_time(e), tok, nd) for s, e, tok, nd in self.steps]
        gaps = [a[0].elapsed_time(b[0]) for a, b in zip(self.steps, self.steps[1:], strict=False)]  # start to next start
        idle = [max(0.0, g - d) for g, (d, _, _) in zip(gaps, rows, strict=False)]
        busy = sum(d for d, _, _ in rows)

        def summary(sel):
            ds = [d for d, tok, nd in sel]
            return {"count": len(ds), "mean_device_ms": round(float(np.mean(ds)), 3) if ds else None,
                    "p50": round(float(np.median(ds)), 3) if ds else None,
                    "mean_tokens": round(float(np.mean([tok for _, tok, _ in sel])), 1) if sel else None}

        dec = [r for r in rows if r[1] and r[1] == r[2]]
        mixed = [r for r in rows if r[1] and r[1] != r[2]]
        by_batch = {}
        for lo, hi in ((1, 16), (17, 32), (33, 48), (49, 64), (65, 128), (129, 256)):
            sel = [r for r in dec if lo <= r[2] <= hi]
            if sel:
                by_batch[f"{lo}-{hi}"] = summary(sel)
        by_tokens = {}
        for lo, hi in ((2, 256), (257, 600), (601, 1200), (1201, 8192)):
            sel = [r for r in mixed if lo <= r[1] <= hi]
            if sel:
                by_tokens[f"{lo}-{hi}"] = summary(sel)
        span = self.steps[0][0].elapsed_time(self.steps[-1][1]) if self.steps else 0.0
        return {"steps": len(rows), "span_ms": round(span, 1), "busy_ms": round(busy, 1),
                "idle_ms": round(sum(idle), 1), "idle_gaps_over_1ms": sum(g > 1.0 for g in idle),
                "decode": summary(dec), "decode_by_batch": by_batch, "mixed": summary(mixed),
                "mixed_by_tokens": by_tokens}


def kernel_rows(prof) -> list[tuple[str, float, int]]:
    """A torch profiler's events with device time: (name, ms, count), the longest first."""
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.key and not ev.key.startswith("ProfilerStep"):
            rows.append((ev.key[:90], t / 1e3, ev.count))
    rows.sort(key=lambda r: -r[1])
    return rows


def poisson_kernel_window(llm, steps: int = 40) -> tuple:
    """A torch profiler over the next `steps` engine steps of a run in progress: (start, stop, summary)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU])

    def summary() -> dict:
        rows = kernel_rows(prof)
        return {"steps": steps, "total_kernel_ms": round(sum(r[1] for r in rows), 2),
                "kernels": [{"name": k, "ms": round(ms, 3), "count": c} for k, ms, c in rows[:40]]}

    return prof, summary


def run_poisson(llm, reqs, rate: float, seed: int = 0, timeline: bool = False, kernel_window: bool = False) -> dict:
    """Requests arrive as a Poisson process of `rate` per second (in-process: the engine's own latency, no
    HTTP or IPC); arrival times are the schedule's, so a request the host admits late counts its wait.
    Also the step trace (host seconds per engine.step by kind), GC pauses and Triton compiles during the run;
    with `timeline`, each step's device time and the device's idle time (DeviceTimeline); with `kernel_window`, a
    kernel profile of 40 steps from the middle of the run (starting the profiler stalls the run: its latencies are
    then not comparable)."""
    eng = llm.engine
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, len(reqs))
    sched = eng.scheduler
    orig = sched.schedule
    trace = []

    def schedule(num_in_flight=0):
        out = orig(num_in_flight)
        schedule.last = (sum(x.num_new_tokens for x in out.seqs), sum(x.num_new_tokens == 1 for x in out.seqs))
        return out

    schedule.last = (0, 0)
    gc_pauses, gc_t = [], [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_t[0] = time.perf_counter()
        else:
            gc_pauses.append((info["generation"], time.perf_counter() - gc_t[0]))

    sched.schedule = schedule
    gc.callbacks.append(on_gc)
    compiled0 = _triton_compiled()
    res = {}
    tl = DeviceTimeline(eng.runner) if timeline else None
    prof, prof_summary = poisson_kernel_window(llm) if kernel_window else (None, None)
    prof_steps = []  # the trace indices the profiler saw
    t0 = time.monotonic()
    arrivals = t0 + np.cumsum(gaps)
    i = 0
    try:
        with torch.inference_mode():
            while i < len(reqs) or eng.has_unfinished_requests():
                if prof is not None and i >= len(reqs) // 2 and not prof_steps:
                    prof.start()
                    prof_steps.append(len(trace))
                elif prof is not None and len(prof_steps) == 1 and len(trace) >= prof_steps[0] + 40:
                    prof.stop()
                    prof_steps.append(len(trace))
                now = time.monotonic()
                while i < len(reqs) and arrivals[i] <= now:
                    r = reqs[i]
                    eng.add_request(f"q{i}", None, r.prompt_token_ids,
                                    SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True),
                                    arrival_time=float(arrivals[i]), stream=False)
                    i += 1
                if not eng.has_unfinished_requests():
                    time.sleep(max(0.0, arrivals[i] - time.monotonic()))
                    continue
                schedule.last = (0, 0)
                ts = time.monotonic()
                for o in eng.step():
                    if o.finished:
                        m = o.metrics
                        n = len(o.outputs[0].token_ids)
                        res[o.request_id] = (m.first_token_time - m.arrival_time, m.finished_time - m.arrival_time,
                                             (m.finished_time - m.first_token_time) / max(n - 1, 1))
                trace.append((ts - t0, time.monotonic() - ts, *schedule.last))
    finally:
        del sched.schedule
        gc.callbacks.remove(on_gc)
        timeline_out = tl.close() if tl is not None else None
        if prof is not None and len(prof_steps) == 1:
            prof.stop()
            prof_steps.append(len(trace))
    ttft, e2el, tpot = (np.array(v) * 1e3 for v in zip(*res.values(), strict=True))
    dur = max(t + w for t, w, *_ in trace)

    def pct(a):
        return {"mean": round(float(a.mean()), 2), "median": round(float(np.median(a)), 2),
                "p90": round(float(np.percentile(a, 90)), 2), "p99": round(float(np.percentile(a, 99)), 2),
                "max": round(float(a.max()), 2)}

    host = np.array([w for _, w, *_ in trace]) * 1e3
    kinds = {"decode": [w for _, w, tok, nd in trace if tok and tok == nd],
             "mixed": [w for _, w, tok, nd in trace if tok and tok != nd],
             "none": [w for _, w, tok, nd in trace if not tok]}
    slow = sorted(trace, key=lambda x: -x[1])[:12]
    return {"requests": len(res), "rate": rate, "duration_s": round(dur, 2),
            "output_tok_s": sum(r.output_len for r in reqs) / dur,
            "ttft_ms": pct(ttft), "tpot_ms": pct(tpot), "e2el_ms": pct(e2el),
            "steps": {k: {"count": len(v), "mean_host_ms": round(1e3 * float(np.mean(v)), 3) if v else None}
                      for k, v in kinds.items()},
            "step_host_ms": pct(host),
            "slowest_steps": [{"t_s": round(t, 3), "host_ms": round(1e3 * w, 2), "tokens": tok, "decodes": nd}
                              for t, w, tok, nd in slow],
            "gc": {"collections": len(gc_pauses), "gen2": sum(g == 2 for g, _ in gc_pauses),
                   "max_ms": round(1e3 * max((p for _, p in gc_pauses), default=0.0), 2),
                   "total_ms": round(1e3 * sum(p for _, p in gc_pauses), 2)},
            "triton_compiles_during_run": _triton_compiled() - compiled0,
            **({"device_timeline": timeline_out} if timeline_out is not None else {}),
            **({"kernel_window": {**prof_summary(), "trace_steps": prof_steps,
                                  "step_kinds": [("decode" if tok == nd else "mixed", tok)
                                                 for _, _, tok, nd in trace[prof_steps[0]:prof_steps[1]]]}}
               if len(prof_steps) == 2 else {})}


def _recapture_piecewise(llm, sizes: list[int] | None) -> float:
    """Replace the runner's piecewise graphs by ones with these buckets (None: mixed steps run eagerly)."""
    from tachyon.worker import piecewise_graphs as pg

    runner = llm.engine.runner
    runner.piecewise_graphs = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if sizes is None:
        return 0.0
    t = time.perf_counter()
    orig = pg.piecewise_buckets
    pg.piecewise_buckets = lambda max_tokens, per_octave=8: sizes
    try:
        runner.piecewise_graphs = pg.PiecewiseGraphs.capture(runner)
    finally:
        pg.piecewise_buckets = orig
    return time.perf_counter() - t


def graph_kernel_profile(llm, batch: int) -> dict:
    """Per-kernel GPU time inside one decode CUDA-graph replay (what a decode step of this batch runs)."""
    from torch.profiler import ProfilerActivity, profile

    g = llm.engine.runner.cuda_graphs
    graph = g.graphs[g.sizes[min(range(len(g.sizes)), key=lambda i: abs(g.sizes[i] - batch))]]
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    rows = kernel_rows(prof)
    return {"batch": batch, "total_kernel_ms": sum(r[1] for r in rows), "num_kernels": sum(r[2] for r in rows),
            "kernels": [{"name": k, "ms": round(ms, 4), "count": c} for k, ms, c in rows[:25]]}


def step_kernel_profile(llm, req, tokens: int = 32) -> dict:
    """Per-kernel GPU time of this process's rank over the decode steps that make `tokens` tokens of one request,
    per step. With tensor parallelism the decode graphs cannot be replayed on rank 0 alone (its all-reduces wait
    for peers that replay nothing), so this profiles the engine's own steps, which every rank runs."""
    from torch.profiler import ProfilerActivity, profile

    eng = llm.engine
    eng.add_request("profile", None, req.prompt_token_ids, SamplingParams(temperature=0, max_tokens=tokens + 24,
                                                                           ignore_eos=True))
    got = 0

    def advance(until: int) -> None:
        nonlocal got
        while eng.has_unfinished_requests() and got < until:
            for o in eng.step():
                got = len(o.outputs[0].token_ids)

    with torch.inference_mode():
        advance(8)  # the prefill and the first decodes stay outside
        torch.cuda.synchronize()
        start = got
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            advance(8 + tokens)
            torch.cuda.synchronize()
        steps = got - start
        advance(1 << 30)
    rows = [(k, ms / max(steps, 1), c / max(steps, 1)) for k, ms, c in kernel_rows(prof)]
    return {"batch": 1, "decode_steps": steps, "total_kernel_ms": sum(r[1] for r in rows),
            "num_kernels": sum(r[2] for r in rows), "per": "decode step (mean over the profiled steps)",
            "kernels": [{"name": k, "ms": round(ms, 4), "count": round(c, 2)} for k, ms, c in rows[:25]]}


def run_single(llm, req) -> dict:
    eng = llm.engine
    times = []
    t0 = time.perf_counter()
    eng.add_request("single", None, req.prompt_token_ids, SamplingParams(temperature=0, max_tokens=req.output_len,
                                                                          ignore_eos=True))
    n_prev = 0
    with torch.inference_mode():
        while eng.has_unfinished_requests():
            for o in eng.step():
                n = len(o.outputs[0].token_ids)
                t = time.perf_counter() - t0
                times.extend([t] * (n - n_prev))
                n_prev = n
    return {"ttft_s": times[0], "decode_tok_s": (len(times) - 1) / (times[-1] - times[0]), "tokens": len(times)}


def graph_replay_ms(llm, batch: int) -> float | None:
    """GPU time of one decode CUDA-graph replay (no host work between replays): the step's device floor."""
    g = llm.engine.runner.cuda_graphs
    if g is None:
        return None
    bs = g.sizes[min(range(len(g.sizes)), key=lambda i: abs(g.sizes[i] - batch))]
    graph = g.graphs[bs]
    for _ in range(3):
        graph.replay()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(50):
        graph.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 50


@torch.inference_mode()
def decode_floor(llm, batch: int, ctx: int, reps: int = 20, kernels: bool = False) -> dict:
    """GPU time of one decode CUDA-graph replay with `batch` sequences at context `ctx` (real blocks, so
    attention reads ctx tokens per sequence): the device floor of a decode step at that load, to set against
    the wall time per forward that a workload measured. kernels: also the per-kernel time of one replay."""
    import bisect

    from tachyon.engine.sequence import Sequence
    from tachyon.outputs import RequestMetrics

    runner = llm.engine.runner
    kv = llm.engine.kv
    g = runner.cuda_graphs
    bs = g.sizes[bisect.bisect_left(g.sizes, batch)]
    reqs = []
    for j in range(batch):
        r = Sequence(seq_id=f"floor{j}", request_id=f"floor{j}", index=0, prompt_token_ids=[5] * ctx,
                    sampling_params=SamplingParams(temperature=0), max_tokens=1, eos_token_ids=frozenset(),
                    metrics=RequestMetrics(0.0))
        assert kv.allocate(r, ctx), "decode floor does not fit the KV pool"
        reqs.append(r)
    try:
        nb = len(reqs[0].block_ids)
        bt = torch.tensor([r.block_ids for r in reqs], dtype=torch.int32)
        g.block_tables[:batch, :nb].copy_(bt)
        pos = ctx - 1
        g.positions[:bs].fill_(pos)
        g.seq_lens[:batch].fill_(ctx)
        g.seq_lens[batch:bs].fill_(0)
        slots = bt[:, pos // 16].long() * 16 + pos % 16
        g.slot_mapping[:batch].copy_(slots)
        g.slot_mapping[batch:bs].fill_(-1)
        g.input_ids[:bs].fill_(7)
        graph = g.graphs[bs]
        for _ in range(3):
            graph.replay()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            graph.replay()
        e.record()
        e.synchronize()
        ms = s.elapsed_time(e) / reps
        rows = None
        if kernels:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                graph.replay()
                torch.cuda.synchronize()
            rows = kernel_rows(prof)
    finally:
        for r in reqs:
            kv.free(r)
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters()) - \
        runner.model.embed_tokens.weight.numel() * 2
    kv_bytes = batch * ctx * 32 * 8 * 128 * 2 * runner.kv_dtype.itemsize
    res = {"batch": batch, "graph_size": bs, "ctx": ctx, "replay_ms": ms,
           "GB_moved": (weights + kv_bytes) / 1e9, "TBps": (weights + kv_bytes) / ms / 1e9}
    if rows is not None:  # (with PDL a kernel's time includes its wait for the one before: the sum exceeds the replay)
        res["kernels"] = [{"name": k, "ms": round(t, 4), "count": c} for k, t, c in rows[:25]]
        res["total_kernel_ms"] = round(sum(r[1] for r in rows), 4)
    return res


def step_profile(llm, batch: int, ctx: int, prefill_seqs: int, prefill_len: int, mixed_decodes: int = 40) -> dict:
    """Per-kernel GPU time of one eager decode step (batch x 1 token at context ctx), one prefill step
    (prefill_seqs prompts of prefill_len tokens) and one mixed step as Poisson 20 req/s runs them (mixed_decodes
    decodes at ctx beside one prompt of prefill_len: "mixed" eager, "mixed_graphs" the way the engine runs it,
    piecewise graphs included), each with the step's wall time (host included) beside it."""
    from torch.profiler import ProfilerActivity, profile

    from tachyon.engine.sequence import Sequence
    from tachyon.interface import ScheduledSeq, SchedulerOutput
    from tachyon.outputs import RequestMetrics

    runner = llm.engine.runner
    kv = llm.engine.kv
    res = {}
    mixed = [(ctx, 1)] * mixed_decodes + [(0, prefill_len)]
    for name, seqs_spec in (("decode", [(ctx, 1)] * batch), ("prefill", [(0, prefill_len)] * prefill_seqs),
                            ("mixed", mixed), ("mixed_graphs", mixed)):
        reqs, seqs = [], []
        for j, (computed, new) in enumerate(seqs_spec):
            r = Sequence(seq_id=f"prof{j}", request_id=f"prof{j}", index=0, prompt_token_ids=[5] * (computed + new),
                        sampling_params=SamplingParams(temperature=0), max_tokens=1, eos_token_ids=frozenset(),
                        metrics=RequestMetrics(0.0))
            assert kv.allocate(r, computed + new), "profile step does not fit the KV pool"
            r.num_computed_tokens = computed
            reqs.append(r)
            seqs.append(ScheduledSeq(r, computed, new, True))
        graphs, pieces = runner.cuda_graphs, runner.piecewise_graphs
        if name != "mixed_graphs":
            runner.cuda_graphs = runner.piecewise_graphs = None  # eager, so every kernel shows
        runner.collect(runner.submit(SchedulerOutput(seqs=seqs)))
        torch.cuda.synchronize()
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            runner.collect(runner.submit(SchedulerOutput(seqs=seqs)))
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.collect(runner.submit(SchedulerOutput(seqs=seqs)))
            torch.cuda.synchronize()
        runner.cuda_graphs, runner.piecewise_graphs = graphs, pieces
        rows = kernel_rows(prof)
        total = sum(r[1] for r in rows)
        res[name] = {"batch": len(seqs), "tokens": sum(n for _, n in seqs_spec), "total_kernel_ms": total,
                     "wall_ms": 1e3 * sorted(walls)[1],
                     "kernels": [{"name": k, "ms": round(ms, 4), "count": c} for k, ms, c in rows[:25]]}
        for r in reqs:
            kv.free(r)
    return res


def hf_sweep(concurrencies, in_len, out_len) -> dict:
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(LLAMA8B) + "/llama3-8b-serve")
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    rng = random.Random(0)
    res = {}
    for c in concurrencies:
        ids = torch.tensor([[rng.randrange(1000, 127000) for _ in range(in_len)] for _ in range(c)], device="cuda")
        with torch.no_grad():
            model.generate(ids[:, :16], attention_mask=torch.ones_like(ids[:, :16]), max_new_tokens=2, do_sample=False,
                           pad_token_id=0)
            torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, min_new_tokens=out_len,
                           do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
        res[str(c)] = {"output_tok_s": c * out_len / dt, "duration_s": dt}
        log("hf", c, res[str(c)])
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return res


def cmd_perf(args) -> dict:
    wl = args.workloads.split(",")
    model_path = os.path.join(HERE, "models", f"{args.model}.json")
    weights = f"random {args.quantization} weights" if args.quantization else "random bf16 weights"
    out = {"env": env_info(), "model": f"{args.model} (benchmarks/models/{args.model}.json), {weights}",
           "quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype, "command": " ".join(sys.argv)}
    out["copy_bandwidth_TBps"] = copy_bandwidth() / 1e12
    log("copy bandwidth TB/s", out["copy_bandwidth_TBps"])
    if "hf" in wl:
        try:
            out["hf_sweep"] = hf_sweep([int(c) for c in args.hf_concurrency.split(",")], 512, args.hf_out)
        except Exception:
            out["hf_sweep"] = {"error": traceback.format_exc()}
    t = time.perf_counter()
    llm = LLM(model=model_path, load_format="dummy", dtype="bfloat16", max_model_len=4096, quantization=args.quantization,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=True, swap_space=0, num_scheduler_steps=args.num_scheduler_steps,
              enable_pdl=not args.no_pdl, kv_cache_dtype=args.kv_cache_dtype,
              tensor_parallel_size=args.tensor_parallel_size)
    runner = llm.engine.runner  # rank 0's (in this process) with tensor parallelism: its shard, its kernels
    out["pdl"] = runner.pdl
    if runner.cuda_graphs is not None:
        out["pdl_graph_sizes"] = runner.cuda_graphs.pdl_sizes
        out["graph_replay_ms_by_launch"] = runner.cuda_graphs.replay_ms
    out["startup_s"] = time.perf_counter() - t
    out["startup_breakdown"] = runner.timings
    out["num_kv_blocks"] = llm.engine.kv.num_blocks
    out["engine_config"] = {"tensor_parallel_size": args.tensor_parallel_size, "max_num_seqs": args.max_num_seqs,
                            "max_num_batched_tokens": args.max_num_batched_tokens,
                            "num_scheduler_steps": llm.engine.config.scheduler.num_scheduler_steps,
                            "max_model_len": 4096, "block_size": 16, "cuda_graph_sizes": runner.cuda_graphs.sizes
                            if runner.cuda_graphs else None}
    params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    embed = runner.model.embed_tokens.weight.numel() * 2
    out["weight_bytes"] = params
    out["gemv_tuning"] = getattr(runner, "gemv_report", None)
    log("startup", out["startup_s"], runner.timings, "blocks", out["num_kv_blocks"])
    log("gemv", json.dumps(out["gemv_tuning"]))
    vocab = 128256

    def save():
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    if "cold" in wl:  # the first request a fresh engine serves (before any other workload warms it)
        req = build(NAMED["single"], vocab)[0]
        req = type(req)(req.prompt_token_ids, 8)
        out["cold_first_request"] = run_single(llm, req)
        out["cold_first_request"]["warm_ttft_s"] = run_single(llm, req)["ttft_s"]
        log("cold first request", out["cold_first_request"])
        save()
    if "single" in wl:
        req = build(NAMED["single"], vocab)[0]
        if args.single_out:
            req = type(req)(req.prompt_token_ids, args.single_out)
        run_single(llm, req)  # warm-up
        r = [run_single(llm, req) for _ in range(3)]
        best = sorted(r, key=lambda x: x["decode_tok_s"])[1]
        mc = llm.engine.config.model
        kv_read = (len(req.prompt_token_ids) + req.output_len / 2) * mc.kv_bytes_per_token_per_dtype_byte * 2  # mean context
        kv_read /= args.tensor_parallel_size  # each rank holds its share of the KV heads (8 for Llama 3 70B: TP <= 8)
        step_bytes = params - embed + kv_read
        ceiling = out["copy_bandwidth_TBps"] * 1e12 / step_bytes
        best["bytes_per_step_GB"] = step_bytes / 1e9
        best["ceiling_tok_s"] = ceiling
        best["fraction_of_ceiling"] = best["decode_tok_s"] / ceiling
        best["runs"] = [dict(x) for x in r]
        tp = args.tensor_parallel_size > 1  # rank 0's graphs cannot replay alone: profile real steps instead
        best["graph_replay_ms_batch1"] = None if tp else graph_replay_ms(llm, 1)
        try:
            best["graph_kernels_batch1"] = step_kernel_profile(llm, req) if tp else graph_kernel_profile(llm, 1)
        except Exception:
            best["graph_kernels_batch1"] = {"error": traceback.format_exc()}
        best["step_ms"] = 1e3 / best["decode_tok_s"]
        out["single"] = best
        save()
        sc = llm.engine.config.scheduler
        best["num_scheduler_steps"] = k = sc.num_scheduler_steps
        sc.num_scheduler_steps = 1  # the same with one host round trip per token
        if not args.lean_single:
            best["one_step_per_round_trip"] = sorted((run_single(llm, req) for _ in range(3)),
                                                     key=lambda x: x["decode_tok_s"])[1]
        best["by_num_scheduler_steps"] = {}
        for depth in () if args.lean_single else (2, 3, 4, 8):
            sc.num_scheduler_steps = depth
            best["by_num_scheduler_steps"][depth] = sorted((run_single(llm, req) for _ in range(3)),
                                                          key=lambda x: x["decode_tok_s"])[1]["decode_tok_s"]
        sc.num_scheduler_steps = k
        out["single"] = best
        log("single", best)
        save()
    if "sweep" in wl:
        out["sweep"] = {}
        for c in [int(v) for v in args.sweep_concurrency.split(",")]:
            spec = NAMED["sweep"]
            spec.num_prompts = c
            if args.sweep_out:
                spec.output_len = args.sweep_out
            spec.seed = 1000 + c  # warm-up at this batch size: other prompts, so the prefix cache gives nothing
            run_offline(llm, [type(r)(r.prompt_token_ids, 8) for r in build(spec, vocab)])
            spec.seed = c  # fresh prompts per concurrency
            out["sweep"][str(c)] = run_offline(llm, build(spec, vocab))
            if c == 256 and args.tensor_parallel_size == 1:  # the graph's buffers still hold the last step
                try:
                    out["graph_kernels_batch256"] = graph_kernel_profile(llm, 256)
                except Exception:
                    out["graph_kernels_batch256"] = {"error": traceback.format_exc()}
            log("sweep", c, out["sweep"][str(c)])
        save()
    if "throughput" in wl:
        out["throughput"] = run_offline(llm, build(NAMED["throughput"], vocab))
        log("throughput", out["throughput"])
        save()
    if "random" in wl:
        out["random"] = run_offline(llm, build(NAMED["random"], vocab))
        if args.random_runs > 1:
            # the same prompts again would be served from the prefix cache (run 17 did that: 13.8k tok/s, not
            # comparable): repeats run with it off, which for these unrelated prompts costs nothing else
            llm.engine.kv.enable_prefix_caching = False
            out["random_repeats_prefix_cache_off_output_tok_s"] = [
                run_offline(llm, build(NAMED["random"], vocab))["output_tok_s"] for _ in range(args.random_runs - 1)]
            llm.engine.kv.enable_prefix_caching = True
        log("random", out["random"], out.get("random_repeats_prefix_cache_off_output_tok_s"))
        save()
    if "prefix" in wl:
        res = {}
        for on in (True, False):
            llm.engine.kv.enable_prefix_caching = on
            spec = NAMED["prefix"]
            spec.seed = 100 + on  # a fresh shared prefix per measurement
            reqs = build(spec, vocab)
            first = run_offline(llm, [type(r)(r.prompt_token_ids, 1) for r in reqs])
            spec.seed = 200 + on
            reqs = build(spec, vocab)
            full = run_offline(llm, reqs)
            res["on" if on else "off"] = {"time_to_all_first_tokens_s": first["duration_s"],
                                          "mean_ttft_s": full["mean_ttft_s"], "full_run_s": full["duration_s"],
                                          "output_tok_s": full["output_tok_s"]}
            log("prefix", on, res["on" if on else "off"])
        llm.engine.kv.enable_prefix_caching = True
        out["prefix"] = res
        save()
    if "poisson" in wl:
        # 512 in / 256 out at 20 req/s in-process, by piecewise bucket policy (the serve table's Poisson point
        # without the HTTP process); prefix caching off as `tachyon bench serve --no-enable-prefix-caching`
        from tachyon.worker.piecewise_graphs import piecewise_buckets

        llm.engine.kv.enable_prefix_caching = False
        spec = NAMED["serve"]
        spec.num_prompts = args.poisson_prompts
        reqs = build(spec, vocab)
        mt = args.max_num_batched_tokens
        coarse = [s for s in (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144) if s < mt]
        variants = {"fine": None, "fine_depth2": None, "coarse": coarse + [mt], "eager": "eager"}
        out["poisson"] = {"buckets": {"fine": piecewise_buckets(mt), "coarse": coarse + [mt]}}
        for name in args.poisson_variants.split(","):
            v = variants[name]
            fine = name.startswith("fine")
            cap = 0.0 if fine else _recapture_piecewise(llm, None if v == "eager" else v)
            if fine and llm.engine.runner.piecewise_graphs is None:
                log("poisson: no piecewise graphs to run 'fine' with")
            sc = llm.engine.config.scheduler
            depth = sc.num_scheduler_steps
            if name == "fine_depth2":  # one step in flight behind the one the host prepares, not two
                sc.num_scheduler_steps = 2
            try:
                r = run_poisson(llm, reqs, args.poisson_rate, timeline=args.poisson_timeline,
                                kernel_window=args.poisson_kernel_window)
            finally:
                sc.num_scheduler_steps = depth
            r["capture_s"] = cap
            r["num_scheduler_steps"] = 2 if name == "fine_depth2" else depth
            out["poisson"][name] = r
            log("poisson", name, json.dumps(r)[:1500])
            save()
        llm.engine.kv.enable_prefix_caching = True
    if "floor" in wl:
        try:
            out["decode_floor"] = [decode_floor(llm, b, c, kernels=b in (16, 40))
                                   for b, c in ((1, 768), (4, 640), (16, 640), (40, 640), (64, 640), (256, 640),
                                                (256, 768))]
        except Exception:
            out["decode_floor"] = {"error": traceback.format_exc()}
        log("decode floor", out["decode_floor"])
        save()
    if "profile" in wl:
        try:
            out["profile"] = step_profile(llm, batch=256, ctx=640, prefill_seqs=16, prefill_len=512)
        except Exception:
            out["profile"] = {"error": traceback.format_exc()}
        save()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["correctness", "perf"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", default="single,sweep,throughput,random,prefix,profile")
    ap.add_argument("--model", default="llama3-8b", help="perf: a config under benchmarks/models (random weights)")
    ap.add_argument("--quantization", default=None, choices=["awq", "int8", "fp8", "w8a8"], help="perf: random packed weights")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"], help="perf: the KV cache's dtype")
    ap.add_argument("--lean-single", action="store_true", help="perf/single: skip the scheduler-depth comparison")
    ap.add_argument("--single-out", type=int, default=None, help="perf/single: output tokens (default: 512)")
    ap.add_argument("--sweep-concurrency", default="1,4,16,64,256")
    ap.add_argument("--sweep-out", type=int, default=None, help="perf/sweep: output tokens (default: the workload's)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="perf: GPUs the model is split over (weight_bytes and the ceilings are then rank 0's shard)")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--num-scheduler-steps", type=int, default=None)
    ap.add_argument("--no-pdl", action="store_true", help="perf: launch the Triton kernels without PDL")
    ap.add_argument("--random-runs", type=int, default=1, help="perf: run `random` this many times (the repeats with the prefix cache off)")
    ap.add_argument("--poisson-rate", type=float, default=20.0)
    ap.add_argument("--poisson-prompts", type=int, default=400)
    ap.add_argument("--poisson-variants", default="fine,coarse,eager",
                    help="perf/poisson: piecewise bucket policies to run (fine: the default; coarse: run 20's)")
    ap.add_argument("--poisson-timeline", action="store_true",
                    help="perf/poisson: each step's device time and the idle time between steps (CUDA events)")
    ap.add_argument("--poisson-kernel-window", action="store_true",
                    help="perf/poisson: a kernel profile of 40 steps mid-run (the profiler's start stalls the run)")
    ap.add_argument("--hf-concurrency", default="1,4,16,64,256")
    ap.add_argument("--hf-out", type=int, default=256)
    ap.add_argument("--greedy-only", action="store_true", help="correctness: skip the Triton-vs-torch logits check")
    ap.add_argument("--trained-only", action="store_true", help="correctness: the trained model's check alone")
    ap.add_argument("--trained", action="store_true",
                    help="correctness: also a small Llama trained here for seconds (greedy margins bf16 can resolve)")
    args = ap.parse_args()
    res = cmd_correctness(args) if args.mode == "correctness" else cmd_perf(args)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    log("wrote", args.out)


if __name__ == "__main__":
    main()
