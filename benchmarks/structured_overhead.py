"""Overhead of structured outputs: decode throughput of a batch constrained by a JSON schema (xgrammar's token
bitmask every step) against the same batch unconstrained, at batch sizes 1 and 64, offline (LLM.generate).

Every constrained sequence runs the whole max_tokens under the grammar (an array of records with a large
minItems never completes), and the free ones ignore EOS, so both sides generate the same number of tokens.
`mixed` is half and half. Grammar compilation is timed apart (it happens once per schema, off the steps).

    CPU:  PYTHONPATH=. python benchmarks/structured_overhead.py --out benchmarks/results/cpu_structured_overhead
    GPU:  PYTHONPATH=. python benchmarks/structured_overhead.py --model benchmarks/models/llama3-8b-structured \\
              --load-format dummy --max-tokens 256 --out $OUT/structured_overhead

llama3-8b-structured is Llama-3-8B's body with SmolLM2's BPE tokenizer (its README says why): llama3-8b-serve's
synthetic word vocabulary cannot spell JSON, so the schema is refused there.

The GPU image lacks xgrammar and pydantic (xgrammar imports it): carry the cp312 wheels and
`pip install --no-deps` them first: xgrammar 0.2.9, apache-tvm-ffi 0.1.15.post2, pydantic 2.14.4,
pydantic-core 2.50.5, annotated-types, typing-inspection (xgrammar also needs torch, triton, transformers, numpy:
the image has them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon import LLM, SamplingParams  # noqa: E402
from tachyon.sampling_params import StructuredOutputsParams  # noqa: E402

RECORD = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "role": {"enum": ["admin", "user", "guest"]},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
    "required": ["name", "role", "age", "tags"], "additionalProperties": False}
SCHEMA = {"type": "array", "items": RECORD, "minItems": 10_000}


def run(llm: LLM, prompts: list[str], kinds: list[str], max_tokens: int) -> dict:
    params = []
    for k in kinds:
        so = StructuredOutputsParams(json=SCHEMA) if k == "json" else None
        params.append(SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=so is None,
                                     structured_outputs=so))
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    errors = [o.error for o in outs if o.error is not None]  # finish_reason "error": the engine ended it
    return {"seconds": dt, "output_tokens": n, "tok_s": n / dt,
            "min_len": min(len(o.outputs[0].token_ids) for o in outs),
            "errors": len(errors), "first_error": errors[0] if errors else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per configuration")
    ap.add_argument("--kv-cache-memory-gib", type=float, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", required=True, help="path without extension: writes .json and .md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kw = {"swap_space": 0}
    if args.kv_cache_memory_gib is not None:
        kw["kv_cache_memory_gib"] = args.kv_cache_memory_gib
    t0 = time.perf_counter()
    llm = LLM(args.model, load_format=args.load_format, **kw)
    startup = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    grammars = llm.engine.grammars
    t0 = time.perf_counter()
    grammars.compile(StructuredOutputsParams(json=SCHEMA))  # also builds xgrammar's tokenizer info
    first_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammars.compile(StructuredOutputsParams(json={**RECORD, "title": "another schema"}))
    compile_s = time.perf_counter() - t0
    rows = []
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"List {i + 3} users as JSON records."}],
                                           tokenize=False, add_generation_prompt=True) for i in range(bs)]
        run(llm, prompts[:min(bs, 4)], ["free"] * min(bs, 4), 8)  # warm-up
        for name, kinds in (("free", ["free"] * bs), ("json", ["json"] * bs),
                            ("mixed", ["json" if i % 2 else "free" for i in range(bs)])):
            if name == "mixed" and bs == 1:
                continue
            best = max((run(llm, prompts, kinds, args.max_tokens) for _ in range(args.repeats)),
                       key=lambda r: r["tok_s"])
            rows.append({"batch": bs, "kind": name, **best})
            print(rows[-1], flush=True)
    for r in rows:
        free = next(x for x in rows if x["batch"] == r["batch"] and x["kind"] == "free")
        # no figure from a run that made no tokens or lost requests: its errors say why
        ok = r["tok_s"] > 0 and not r["errors"] and not free["errors"]
        r["overhead_pct"] = 100.0 * (free["tok_s"] / r["tok_s"] - 1.0) if ok else None
    import xgrammar

    env = {"device": str(llm.engine.config.device),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "load_avg_at_end": os.getloadavg(),
           "torch": torch.__version__, "python": platform.python_version(),
           "xgrammar": getattr(xgrammar, "__version__", None) or _dist_version("xgrammar")}
    result = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "env": env,
              "model": args.model or "embedded SmolLM2-135M-Instruct", "load_format": args.load_format,
              "max_tokens": args.max_tokens, "startup_s": startup,
              "first_compile_s (incl. tokenizer info)": first_compile, "compile_s (one more schema)": compile_s,
              "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    lines = [f"# Structured outputs overhead ({result['model']}, {env['device']})", "",
             f"`{result['command']}`", "",
             f"env: {json.dumps(env)}", "",
             f"grammar compile: first {first_compile * 1e3:.0f} ms (with xgrammar's tokenizer info), "
             f"another schema {compile_s * 1e3:.1f} ms; decode: greedy, {args.max_tokens} tokens per sequence, "
             f"best of {args.repeats}", "",
             "| batch | requests | out tok/s | overhead vs free | requests ended with an error |",
             "|---|---|---|---|---|"]
    for r in rows:
        overhead = "n/a" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
        failed = f"{r['errors']}: {r['first_error']}" if r["errors"] else "0"
        lines.append(f"| {r['batch']} | {r['kind']} | {r['tok_s']:.1f} | {overhead} | {failed} |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def _dist_version(name: str) -> str | None:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
