"""A result as a printed table, a JSON file (figures + hardware, versions, config, command) and Markdown."""

from __future__ import annotations

import json
import math
import os

from tachyon.bench.metrics import METRICS, pct_key

# The headline rows, in print order: (result key, label).
_ROWS = [
    ("completed", "Successful requests"),
    ("failed", "Failed requests"),
    ("duration", "Benchmark duration (s)"),
    ("total_input_tokens", "Total input tokens"),
    ("total_output_tokens", "Total generated tokens"),
    ("request_throughput", "Request throughput (req/s)"),
    ("request_goodput", "Request goodput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    ("max_output_tokens_per_s", "Peak output throughput (tok/s)"),
    ("median_decode_tok_s", "Median decode (tok/s, per request)"),
    ("spec_acceptance_rate", "Spec decode acceptance rate"),
    ("spec_mean_acceptance_length", "Spec decode mean acceptance length"),
    ("spec_acceptance_per_pos", "Spec decode acceptance per position"),
]
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}
# For ratios: bigger is better for throughputs, smaller for latencies.
RATIO_KEYS = ("output_throughput", "total_token_throughput", "median_decode_tok_s", "median_ttft_ms",
              "median_e2el_ms")


def run_label(run: dict) -> str:
    label = run.get("label") or run["backend"]
    if run.get("concurrency") is not None:
        label += f" @{run['concurrency']}"
    return label


def metric_rows(metrics: dict, percentiles: list[float]) -> list[tuple[str, str]]:
    rows = [(k, lab) for k, lab in _ROWS if k in metrics]
    for m in METRICS:
        rows.append((f"mean_{m}_ms", f"Mean {_NAMES[m]} (ms)"))
        rows.append((f"median_{m}_ms", f"Median {_NAMES[m]} (ms)"))
        for p in percentiles:
            if p != 50:
                rows.append((f"{pct_key(p)}_{m}_ms", f"P{pct_key(p)[1:]} {_NAMES[m]} (ms)"))
    return rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return " ".join(_fmt(x) for x in v)
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        return f"{v:.2f}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def ratios(runs: list[dict], num: str = "tachyon", den: str = "hf") -> dict:
    """num/den for the headline figures, per concurrency (None = one run each)."""
    out = {}
    by = {(r["backend"], r.get("concurrency")): r for r in runs if r.get("metrics")}
    for (b, c), r in by.items():
        if b != num or (den, c) not in by:
            continue
        a, d = r["metrics"], by[(den, c)]["metrics"]
        rat = {k: a[k] / d[k] for k in RATIO_KEYS if a.get(k) and d.get(k)}
        out[f"{num}/{den}" + (f" @{c}" if c is not None else "")] = rat
    return out


def table(runs: list[dict], percentiles: list[float], title: str = "Benchmark result") -> str:
    runs = [r for r in runs if r.get("metrics")]
    if not runs:
        return f"{title}: no finished runs"
    keys = []
    for r in runs:
        for k, lab in metric_rows(r["metrics"], percentiles):
            if (k, lab) not in keys:
                keys.append((k, lab))
    heads = [run_label(r) for r in runs]
    w0 = max(len(lab) for _, lab in keys) + 2
    ws = [max(12, len(h) + 2) for h in heads]
    width = w0 + sum(ws)
    lines = [f"{' ' + title + ' ':=^{width}}", "".ljust(w0) + "".join(h.rjust(w) for h, w in zip(heads, ws, strict=False))]
    for k, lab in keys:
        lines.append(lab.ljust(w0) + "".join(_fmt(r["metrics"].get(k)).rjust(w) for r, w in zip(runs, ws, strict=False)))
    lines.append("=" * width)
    return "\n".join(lines)


def ratio_lines(rat: dict) -> list[str]:
    lines = []
    for name, vals in rat.items():
        parts = [f"{k} {v:.2f}x" for k, v in vals.items()]
        lines.append(f"{name}: " + ", ".join(parts))
    return lines


def _jsonable(x):
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def write_json(result: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(result), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def load_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise FileNotFoundError(f"{path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a bench result (bad JSON: {e.msg})") from None


def markdown(result: dict) -> str:
    pcts = result.get("percentiles", [99.0])
    runs = [r for r in result.get("runs", []) if r.get("metrics")]
    env = result.get("env", {})
    hw, ver, git = env.get("hardware", {}), env.get("versions", {}), env.get("git", {})
    lines = [f"# `tachyon bench {result.get('command')}`: {result.get('workload', {}).get('name', 'custom')}", ""]
    lines.append(f"- command: `{result.get('argv')}`")
    lines.append(f"- date: {result.get('date')}; git {str(git.get('commit'))[:12]}"
                 f"{' (dirty)' if git.get('dirty') else ''}")
    hw_line = f"- hardware: {hw.get('cpu')} ({hw.get('cpu_cores')} cores, {hw.get('memory_gib')} GiB)"
    if hw.get("gpu"):
        hw_line += f"; GPU {hw['gpu']} x{hw.get('gpu_count', 1)}"
    lines.append(hw_line)
    lines.append(f"- versions: torch {ver.get('torch')}, transformers {ver.get('transformers')}, "
                 f"tachyon {ver.get('tachyon')}, python {ver.get('python')}")
    load = result.get("load", {})
    if load:
        lines.append(f"- machine load (1/5/15 min): before {load.get('before')}, after {load.get('after')}"
                     + (f"; {load['note']}" if load.get("note") else ""))
    wl = result.get("workload", {})
    lines.append(f"- workload: `{json.dumps(wl.get('spec', wl))}`")
    if result.get("interrupted"):
        lines.append("- **interrupted**: only the runs that finished are shown")
    lines.append("")
    if runs:
        keys = []
        for r in runs:
            for k, lab in metric_rows(r["metrics"], pcts):
                if (k, lab) not in keys:
                    keys.append((k, lab))
        lines.append("| metric | " + " | ".join(run_label(r) for r in runs) + " |")
        lines.append("|---|" + "---:|" * len(runs))
        for k, lab in keys:
            lines.append(f"| {lab} | " + " | ".join(_fmt(r["metrics"].get(k)) for r in runs) + " |")
        lines.append("")
    if result.get("ratios"):
        lines.append("## Ratios")
        lines.append("")
        lines.extend(f"- {x}" for x in ratio_lines(result["ratios"]))
        lines.append("")
    failed = [r for r in result.get("runs", []) if r.get("error")]
    if failed:
        lines.append("## Failed runs")
        lines.append("")
        lines.extend(f"- {run_label(r)}: {r['error']}" for r in failed)
        lines.append("")
    lines.append("## Configuration")
    lines.append("")
    for r in result.get("runs", []):
        if r.get("config") and r.get("concurrency") in (None, result.get("runs")[0].get("concurrency")):
            lines.append(f"- {r.get('label') or r['backend']}: `{json.dumps(_jsonable(r['config']))}`")
    if result.get("plot"):
        lines.append("")
        lines.append(f"![plot]({os.path.basename(result['plot'])})")
    return "\n".join(lines) + "\n"


def write_markdown(result: dict, path: str) -> None:
    with open(path, "w") as f:
        f.write(markdown(result))


# The run-level keys of `vllm bench serve --save-result`, in its order.
_VLLM_RUN_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                  "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                  "max_output_tokens_per_s", "max_concurrent_requests")


def metadata_fields(items: list[str] | None) -> dict[str, str]:
    """vLLM's --metadata KEY=VALUE ...: extra keys of the result JSON."""
    out = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--metadata {item!r}: give KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def vllm_flat_fields(result: dict, args) -> dict:
    """`bench serve`'s one run as the flat keys vLLM's result JSON has (date, backend, model_id, num_prompts,
    request_rate, ..., mean/median/std/pNN of --percentile-metrics), so scripts written for vLLM's results read
    ours; the nested "runs" stay beside them."""
    run = next((r for r in result["runs"] if r.get("metrics")), None)
    if run is None:
        return {}
    m = run["metrics"]
    selected = [x.strip() for x in args.percentile_metrics.split(",") if x.strip()]
    unknown = sorted(set(selected) - set(METRICS))
    if unknown:
        raise ValueError(f"--percentile-metrics {unknown}: choose among {', '.join(METRICS)}")
    rate = args.request_rate
    flat = {"date": result["date"], "endpoint_type": run["backend"], "backend": run["backend"],
            "label": run.get("label"), "model_id": (run.get("config") or {}).get("model")
            or getattr(args, "served_model_name", None) or getattr(args, "model", None),
            "tokenizer_id": getattr(args, "tokenizer", None) or getattr(args, "model", None),
            "best_of": 1, "num_prompts": run["num_requests"]}
    flat.update(metadata_fields(getattr(args, "metadata", None)))
    flat.update({"request_rate": "inf" if math.isinf(rate) else rate, "burstiness": args.burstiness,
                 "max_concurrency": args.max_concurrency})
    # request_goodput is there without --goodput too (null), as vLLM writes it
    flat.update({k: m.get(k) for k in _VLLM_RUN_KEYS if k in m or k == "request_goodput"})
    for name in selected:
        flat.update({k: v for k, v in m.items() if k.endswith(f"_{name}_ms")})
    flat.update(run.get("per_request", {}))
    return flat
