"""`tachyon bench {latency,throughput,serve,sweep,ladder}` and `tachyon bench --compare A.json B.json`.

Every command runs one workload through one or more backends, prints a table, and saves JSON + Markdown
(+ PNG for sweep, ladder and compare) under benchmarks/results/ unless --output says otherwise.
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import os
import sys

from tachyon.bench.workloads import NAMED, WorkloadSpec, parse_len
from tachyon.engine_args import EngineArgs

RESULTS_DIR = os.path.join("benchmarks", "results")
_PARSERS: dict[str, argparse.ArgumentParser] = {}


# -- arguments ------------------------------------------------------------------------------------------------
def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=sorted(NAMED), default=None,
                   help="a standard workload of shared/WORKLOADS.md (flags below override its fields)")
    g.add_argument("--input-len", "--random-input-len", type=parse_len, default=None,
                   help="tokens, or a range LO:HI drawn uniformly")
    g.add_argument("--output-len", "--random-output-len", type=parse_len, default=None,
                   help="tokens, or a range LO:HI")
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="vLLM's: input and output lengths drawn uniformly from [len*(1-r), len*(1+r)] (default: 0, "
                        "fixed lengths)")
    g.add_argument("--dataset-name", choices=["random"], default=None,
                   help="vLLM's: random (random token prompts of --input-len, the default here); other data: "
                        "--dataset FILE.jsonl")
    g.add_argument("--num-prompts", type=int, default=None, help="requests to run (default: the workload's)")
    g.add_argument("--workload-seed", type=int, default=None, help="seed of the prompt token ids")
    g.add_argument("--prefix-len", "--random-prefix-len", type=int, default=None,
                   help="tokens shared by every prompt (prefix workload)")
    g.add_argument("--chat", action="store_true", help="the fixed chat prompt through the chat template")
    g.add_argument("--dataset", default=None, metavar="FILE.jsonl",
                   help='one request a line: {"prompt": "..." | "prompt_token_ids": [...], "output_len": N}')


def _add_backend_args(p: argparse.ArgumentParser, default: str | None) -> None:
    g = p.add_argument_group("backends")
    g.add_argument("--backend", action="append", default=None, choices=["tachyon", "hf", "openai", "vllm"],
                   help=f"repeatable; runs each in turn (default: {default}; vllm: vLLM's name for openai)")
    g.add_argument("--label", default=None, help="name of this run in tables and plots (one backend)")
    g.add_argument("--hf-batch-size", type=int, default=None,
                   help="hf: static batch size (default: every request in one batch)")
    g.add_argument("--hf-dtype", default=None, help="hf: dtype (default: --dtype; auto = fp32 CPU, bf16 GPU)")
    g.add_argument("--hf-attn", default="sdpa", help="hf: attn_implementation (sdpa, eager, flash_attention_2)")
    g.add_argument("--hf-compile", action="store_true", help="hf: torch.compile the forward (static cache)")
    g.add_argument("--num-warmups", type=int, default=1, help="requests run before timing starts")
    g.add_argument("--interleave", action="store_true",
                   help="load every backend at once and alternate them run by run (fair on a busy machine)")
    _add_http_args(p)


def _add_http_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP (openai backend, serve)")
    g.add_argument("--base-url", default=None, help="OpenAI-compatible server (default http://127.0.0.1:8000)")
    g.add_argument("--host", default=None, help="vLLM's: the server's host, when no --base-url (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=None, help="vLLM's: the server's port, when no --base-url (default 8000)")
    g.add_argument("--endpoint", default="/v1/completions", help="the API route requests go to (default: %(default)s)")
    g.add_argument("--served-model-name", default=None, help="the 'model' field (default: the server's first)")
    g.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    g.add_argument("--vocab-size", type=int, default=None, help="for random prompts without a tokenizer")
    g.add_argument("--prompt-format", choices=["auto", "ids", "text"], default="auto",
                   help="send token ids, or text decoded with --tokenizer (auto: text iff --tokenizer)")
    g.add_argument("--request-rate", type=float, default=math.inf, help="req/s (default inf: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 = Poisson arrivals")
    g.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request counts as failed")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="requests run to their output length whatever they generate (--no-ignore-eos: EOS ends "
                        "them) (default: on)")


def _add_report_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("results")
    g.add_argument("--percentiles", "--metric-percentiles", default="99", help="comma-separated, e.g. 50,90,99")
    g.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="vLLM's: the metrics (ttft, tpot, itl, e2el) whose mean/median/std/percentiles go into the "
                        "flat vLLM-style keys of the result JSON (default: %(default)s)")
    g.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs, e.g. ttft:2000 e2el:5000")
    g.add_argument("--output", default=None, help="JSON path (default benchmarks/results/<workload>_<cmd>_<time>.json)")
    g.add_argument("--save-result", action="store_true",
                   help="vLLM's: save the result JSON (always done here unless --no-save)")
    g.add_argument("--result-dir", default=None, help="vLLM's: the directory of the result JSON")
    g.add_argument("--result-filename", default=None, help="vLLM's: the result JSON's file name")
    g.add_argument("--plot", default=None, help="PNG path (sweep, ladder, compare; default beside the JSON)")
    g.add_argument("--no-save", action="store_true", help="print only")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--load-note", default=None, help="a note on machine load, saved with the result")
    g.add_argument("--metadata", nargs="+", default=None, metavar="KEY=VALUE",
                   help="vLLM's: extra KEY=VALUE pairs written into the result JSON (bench serve)")


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compare", nargs="+", default=None, metavar="RESULT.json",
                   help="plot saved results against each other (no benchmark is run)")
    p.add_argument("--plot-out", default=None, help="--compare: PNG path")
    sub = p.add_subparsers(dest="bench_command")

    def common(name, help, default_backend, engine=True):
        sp = sub.add_parser(name, help=help)
        _PARSERS[name] = sp
        _add_workload_args(sp)
        _add_backend_args(sp, default_backend)
        _add_report_args(sp)
        if engine:
            EngineArgs.add_cli_args(sp)
            # Repeated prompts (warm-up, --num-iters) must not hit the prefix cache unless the workload is
            # about prefixes: None = on only for workloads with a shared prefix.
            sp.set_defaults(enable_prefix_caching=None)
        return sp

    sp = common("latency", "one request at a time: decode tok/s and TTFT, median of --num-iters", "tachyon")
    sp.add_argument("--num-iters", type=int, default=3, help="timed runs; the median is reported")
    sp = common("throughput", "every request at once (offline): output and total tok/s", "tachyon")
    sp.add_argument("--num-iters", type=int, default=1, help="timed runs; the median is reported")
    sp = common("serve", "HTTP client against an OpenAI-compatible --base-url", "openai")
    sp = common("sweep", "throughput (or serve with --base-url) over a list of concurrencies", "tachyon")
    sp.add_argument("--concurrency", default=None, help="comma-separated (default: the workload's, or 1,4,16,64)")
    sp.add_argument("--prompts-per-concurrency", type=int, default=None,
                    help="requests per run = concurrency x this (default: the workload's own counts, "
                         "as serve's 16/128/256/1000 at 1/16/64/256; else 1)")
    sp = common("ladder", "transformers fp16 eager -> +compile -> +SDPA/flash -> bf16 -> Tachyon (-> quantized)",
                "all steps")
    sp.add_argument("--steps", default=None, help="comma-separated step names (default: all)")
    sp.add_argument("--step-timeout", type=float, default=1800.0, help="seconds one step of the ladder may take")


# -- the workload -----------------------------------------------------------------------------------------------
def workload_spec(args, command: str) -> WorkloadSpec:
    if args.workload:
        spec = copy.deepcopy(NAMED[args.workload])
    else:
        spec = WorkloadSpec("custom", 1 if command == "latency" else 32, 128, 128, seed=0)
    if args.input_len is not None:
        spec.input_len = args.input_len
        spec.chat = False
    if args.output_len is not None:
        spec.output_len = args.output_len
    if args.num_prompts is not None:
        spec.num_prompts = args.num_prompts
    ratio = args.random_range_ratio
    if not 0 <= ratio < 1:
        raise ValueError(f"--random-range-ratio {ratio}: it must be in [0, 1)")
    if ratio:
        spec.input_len, spec.output_len = (_ratio_range(n, ratio) for n in (spec.input_len, spec.output_len))
    if args.workload_seed is not None:
        spec.seed = args.workload_seed
    if args.prefix_len is not None:
        spec.prefix_len = args.prefix_len
    if args.chat:
        spec.chat = True
    if args.dataset:
        spec.jsonl = args.dataset
        spec.name = os.path.splitext(os.path.basename(args.dataset))[0]
    if spec.num_prompts < 1 and command not in ("sweep",):
        raise ValueError(f"workload {spec.name!r} sets no request count here: pass --num-prompts")
    return spec


def _ratio_range(n: int | tuple[int, int], ratio: float) -> int | tuple[int, int]:
    """vLLM's --random-range-ratio: a length n becomes the range [n*(1-ratio), n*(1+ratio)]."""
    if not isinstance(n, int):
        raise ValueError("--random-range-ratio needs fixed lengths, not LO:HI ranges")
    return max(1, round(n * (1 - ratio))), max(1, round(n * (1 + ratio)))


def build_requests(spec: WorkloadSpec, backend, num_prompts: int | None = None):
    from tachyon.bench.workloads import CHAT_MESSAGE, build, tokenize_text_prompts

    s = copy.copy(spec)
    if num_prompts is not None:
        s.num_prompts = num_prompts
    chat_ids = backend.chat_ids(CHAT_MESSAGE) if s.chat else None
    reqs = build(s, backend.vocab_size, chat_ids)
    tokenize_text_prompts(reqs, backend.tokenizer)
    return reqs


# -- running ----------------------------------------------------------------------------------------------------
def _progress(args, total: int, desc: str):
    if args.no_progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)


def _concurrencies(args, spec: WorkloadSpec, command: str) -> list[int | None]:
    if command != "sweep":
        return [args.max_concurrency if command == "serve" else None]
    if args.concurrency:
        try:
            cs = [int(x) for x in args.concurrency.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--concurrency {args.concurrency!r}: give integers like 1,4,16") from None
    else:
        cs = spec.concurrencies or [1, 4, 16, 64]
    if not cs or min(cs) < 1:
        raise ValueError("--concurrency values must be >= 1")
    if args.prompts_per_concurrency is not None and args.prompts_per_concurrency < 1:
        raise ValueError("--prompts-per-concurrency must be >= 1")
    return cs


def _warm_up(backend, reqs, n: int) -> None:
    if n <= 0 or not reqs:
        return
    import random

    from tachyon.bench.workloads import BenchRequest, random_token_ids

    rng = random.Random(-1)  # prompts of the same shape but not the workload's own (no cache hits)
    warm = [BenchRequest(random_token_ids(rng, r.prompt_len, backend.vocab_size), min(r.output_len, 8))
            for r in reqs[:n]]
    backend.run(warm)


class _Slot:
    """One backend's runs at one concurrency: the iterations pooled into one result."""

    def __init__(self, name: str, label: str, c: int | None):
        self.name, self.label, self.c = name, label, c
        self.reqs = None
        self.pooled, self.duration, self.repeats = [], 0.0, []
        self.config, self.memory = None, None
        self.spec: dict = {}  # speculative decoding counters summed over the iterations

    def as_run(self, pcts, slos) -> dict:
        from tachyon.bench.metrics import summarize

        run = {"backend": self.name, "label": self.label, "concurrency": self.c, "num_requests": len(self.reqs),
               "config": self.config, "memory": self.memory,
               "metrics": summarize(self.pooled, self.duration, pcts, slos)}
        if self.spec:
            run["metrics"].update(spec_summary(self.spec))
        if len(self.repeats) > 1:
            run["repeats"] = self.repeats
        if self.name == "openai":  # vLLM's per-request arrays (bench serve's result JSON carries them)
            from tachyon.bench.metrics import per_request_arrays

            run["per_request"] = per_request_arrays(self.pooled)
        return run


class _Failed(Exception):
    pass


def _describe_error(name: str, e: Exception) -> str:
    from tachyon.bench.backends.openai import ServerUnreachable

    msg = str(e) if isinstance(e, (ServerUnreachable, ValueError, FileNotFoundError)) else f"{type(e).__name__}: {e}"
    print(f"tachyon bench: backend {name} failed: {msg}", file=sys.stderr)
    if os.environ.get("TACHYON_BENCH_TRACEBACK"):
        import traceback

        traceback.print_exc()
    return msg


def _prepare(backend, slot: _Slot, args, spec: WorkloadSpec, command: str) -> None:
    c = slot.c
    n = None
    if command == "sweep":
        ppc = args.prompts_per_concurrency
        n = c * ppc if ppc else spec.prompts_at.get(c, c)  # the workload's own counts (serve: 16 at c=1, ...)
        if slot.name == "hf" and not args.hf_batch_size:
            backend.batch_size = c
        if slot.name == "openai":
            backend.max_concurrency = c
    if slot.reqs is None:
        slot.reqs = build_requests(spec, backend, n)
        _warm_up(backend, slot.reqs, args.num_warmups)


def _iterate(backend, slot: _Slot, args, spec, command, it: int, iters: int, pcts, slos) -> bool:
    """One timed iteration into the slot; True if it was interrupted."""
    from tachyon.bench.metrics import summarize

    _prepare(backend, slot, args, spec, command)
    bar = _progress(args, len(slot.reqs), slot.label + (f" @{slot.c}" if slot.c is not None else "")
                    + (f" [{it + 1}/{iters}]" if iters > 1 else ""))
    rr = backend.run(slot.reqs, bar)
    if bar is not None:
        bar.close()
    slot.pooled.extend(rr.results)
    slot.duration += rr.duration
    one = summarize(rr.results, rr.duration, pcts, slos, rr.t0)
    slot.repeats.append({k: one.get(k) for k in ("duration", "completed", "output_throughput", "median_ttft_ms",
                                                 "median_decode_tok_s") if k in one})
    slot.config, slot.memory = backend.config(), backend.memory()
    for k, v in rr.extra.items():  # counters: summed over the iterations (lists element-wise)
        old = slot.spec.get(k)
        if old is None:
            slot.spec[k] = list(v) if isinstance(v, list) else v
        else:
            slot.spec[k] = [a + b for a, b in zip(old, v, strict=True)] if isinstance(v, list) else old + v
    return rr.interrupted


def spec_summary(spec: dict) -> dict:
    """vLLM's speculative-decoding figures: acceptance rate (accepted / proposed tokens), mean acceptance length
    (tokens per verifying step: accepted + 1), and the acceptance rate at each proposal position."""
    drafts, proposed, accepted = spec["spec_num_drafts"], spec["spec_num_draft_tokens"], spec["spec_num_accepted_tokens"]
    return {**spec, "spec_acceptance_rate": accepted / proposed if proposed else None,
            "spec_mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "spec_acceptance_per_pos": [n / drafts for n in spec["spec_accepted_per_pos"]] if drafts else None}


def run_all(names: list[str], args, spec: WorkloadSpec, command: str, pcts, slos) -> tuple[list[dict], bool]:
    """Run every (backend, concurrency, iteration) of the command.

    One backend at a time by default (load, run everything, free it). With --interleave every backend is
    loaded at once and they take turns run by run, so a machine whose load drifts (a shared CI box) biases
    none of them.
    """
    from tachyon.bench.backends import make_backend

    cs = _concurrencies(args, spec, command)
    iters = getattr(args, "num_iters", 1) or 1
    labels = {n: (args.label or n) if len(names) == 1 else n for n in names}
    slots = {(n, c): _Slot(n, labels[n], c) for n in names for c in cs}
    errors: dict[str, str] = {}
    loaded: dict[str, object] = {}
    interrupted = False

    def load(n):
        b = make_backend(n, args)
        loaded[n] = b
        b.load()
        return b

    def free(n):
        b = loaded.pop(n, None)
        if b is not None:
            b.close()
        gc.collect()

    def attempt(n, fn):
        if n in errors:
            return False
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except Exception as e:
            errors[n] = _describe_error(n, e)
            free(n)
            return False

    def run_one(n, c, it) -> bool:
        return attempt(n, lambda: _iterate(loaded[n], slots[(n, c)], args, spec, command, it, iters, pcts, slos))

    try:
        if getattr(args, "interleave", False):
            for n in names:
                attempt(n, lambda n=n: load(n) and False)
            for c in cs:
                for it in range(iters):
                    for n in names:
                        if n in loaded and run_one(n, c, it):
                            raise KeyboardInterrupt
        else:
            for n in names:
                attempt(n, lambda n=n: load(n) and False)
                for c in cs:
                    for it in range(iters):
                        if n in loaded and run_one(n, c, it):
                            raise KeyboardInterrupt
                free(n)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for n in list(loaded):
            free(n)
    runs = [slots[(n, c)].as_run(pcts, slos) for n in names for c in cs if slots[(n, c)].pooled]
    runs += [{"backend": n, "label": labels[n], "error": msg} for n, msg in errors.items()]
    return runs, interrupted


def _default_output(spec: WorkloadSpec, command: str) -> str:
    from tachyon.bench.env import timestamp

    return os.path.join(RESULTS_DIR, f"{spec.name}_{command}_{timestamp()}.json")


def _finish(result: dict, args, plot_kind: str | None) -> int:
    """Print, save JSON + Markdown (+ plot); the exit code says whether anything failed."""
    from tachyon.bench import report
    from tachyon.bench.env import loadavg

    result["load"]["after"] = loadavg()
    runs = result["runs"]
    result["ratios"] = report.ratios(runs)
    print(report.table(runs, result["percentiles"], f"tachyon bench {result['command']}"))
    for line in report.ratio_lines(result["ratios"]):
        print(line)
    if result["command"] == "serve":
        result.update(report.vllm_flat_fields(result, args))
    if not args.no_save:
        path = _result_path(result, args)
        stem = os.path.splitext(path)[0]
        if plot_kind:
            from tachyon.bench import plots

            good = [r for r in runs if r.get("metrics")]
            if good:
                try:
                    if plot_kind == "concurrency":
                        series: dict[str, list] = {}
                        for r in good:
                            series.setdefault(r["label"], []).append(r)
                        result["plot"] = plots.plot_concurrency(series, args.plot or stem + ".png",
                                                                _plot_title(result))
                except Exception as e:  # a plot must not lose the figures
                    print(f"tachyon bench: could not draw the plot: {e}", file=sys.stderr)
        report.write_json(result, path)
        report.write_markdown(result, stem + ".md")
        print(f"saved {path} and {stem}.md" + (f" and {result['plot']}" if result.get("plot") else ""),
              file=sys.stderr)
    failed_runs = [r for r in runs if r.get("error")]
    failed_reqs = sum((r.get("metrics") or {}).get("failed", 0) for r in runs)
    if result.get("interrupted"):
        print("tachyon bench: interrupted; saved what finished", file=sys.stderr)
        return 130
    if failed_reqs:
        first = next((e for r in runs for e in (r.get("metrics") or {}).get("errors", {})), "")
        print(f"tachyon bench: {failed_reqs} request(s) failed; first error: {first}", file=sys.stderr)
    if failed_runs or failed_reqs:
        return 1
    return 0


def _result_path(result: dict, args) -> str:
    """--output, else --result-dir/--result-filename (vLLM's), else benchmarks/results/<workload>_<cmd>_<time>."""
    path = args.output or _default_output_name(result)
    if not args.output and (args.result_dir or args.result_filename):
        path = os.path.join(args.result_dir or RESULTS_DIR, args.result_filename or os.path.basename(path))
    return path


def _default_output_name(result: dict) -> str:
    return os.path.join(RESULTS_DIR, f"{result['workload']['name']}_{result['command']}_{result['stamp']}.json")


def _plot_title(result: dict) -> str:
    hw = result["env"]["hardware"]
    where = hw.get("gpu") or f"{hw.get('cpu')} ({hw.get('cpu_cores')} cores)"
    return f"tachyon bench {result['command']} - {result['workload']['name']} - {where}"


def reconstruct_argv(args, command: str) -> str:
    """The command line, from sys.argv when this process is `tachyon`, else from the parsed flags."""
    import shlex

    from tachyon.bench.env import command_line

    if sys.argv and (os.path.basename(sys.argv[0]) == "tachyon" or sys.argv[0].endswith(os.path.join("tachyon", "cli.py"))):
        return command_line()
    parts = ["tachyon", "bench", command]
    sp = _PARSERS.get(command)
    for action in (sp._actions if sp else []):
        if not action.option_strings or action.dest == "help":
            continue
        v = getattr(args, action.dest, None)
        if v == action.default or v is None:
            continue
        flag = next((o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")),
                    action.option_strings[0])
        if v is True:
            parts.append(flag)
        elif v is False:
            parts.append(flag.replace("--", "--no-", 1))
        elif isinstance(v, list):
            if isinstance(action, argparse._AppendAction):
                for x in v:
                    parts += [flag, str(x)]
            else:
                parts += [flag, *map(str, v)]
        else:
            parts += [flag, f"{v[0]}:{v[1]}" if isinstance(v, tuple) else str(v)]
    return shlex.join(parts)


def base_result(args, command: str, spec: WorkloadSpec | None) -> dict:
    from tachyon.bench.env import environment, iso_now, loadavg, timestamp
    from tachyon.bench.metrics import parse_percentiles

    return {
        "tachyon_bench": 1, "command": command, "argv": reconstruct_argv(args, command), "date": iso_now(), "stamp": timestamp(),
        "workload": {"name": spec.name if spec else None, "spec": spec.describe() if spec else None},
        "env": environment(), "load": {"before": loadavg(), "note": getattr(args, "load_note", None)},
        "percentiles": parse_percentiles(args.percentiles), "runs": [], "interrupted": False,
    }


def cmd_offline(args, command: str) -> int:
    from tachyon.bench.metrics import parse_goodput, parse_percentiles

    pcts = parse_percentiles(args.percentiles)
    if 50.0 not in pcts:
        pcts = sorted(set(pcts) | {50.0}) if command == "serve" else pcts
    slos = parse_goodput(args.goodput)
    spec = workload_spec(args, command)
    if spec.jsonl:  # a bad file fails before any model loads
        from tachyon.bench.workloads import load_jsonl

        load_jsonl(spec.jsonl, spec.output_len if isinstance(spec.output_len, int) else None)
    _concurrencies(args, spec, command)  # bad flags fail before any model loads
    from tachyon.bench.report import metadata_fields

    metadata_fields(getattr(args, "metadata", None))
    if getattr(args, "enable_prefix_caching", False) is None:
        args.enable_prefix_caching = spec.prefix_len > 0
    if args.base_url is None and (args.host is not None or args.port is not None):  # vLLM's --host/--port
        args.base_url = f"http://{args.host or '127.0.0.1'}:{args.port or 8000}"
    backends = [("openai" if b == "vllm" else b) for b in args.backend or ()]  # vLLM calls it vllm
    backends = backends or (["openai"] if command == "serve" or args.base_url else ["tachyon"])
    if command == "serve" and any(b != "openai" for b in backends):
        raise ValueError("`bench serve` talks HTTP: use --backend openai (the default) with --base-url")
    result = base_result(args, command, spec)
    result["percentiles"] = pcts
    result["runs"], result["interrupted"] = run_all(backends, args, spec, command, pcts, slos)
    return _finish(result, args, "concurrency" if command == "sweep" else None)


def cmd_compare(args) -> int:
    from tachyon.bench import plots, report

    series: dict[str, list] = {}
    flat = []
    for path in args.compare:
        res = report.load_json(path)
        if "runs" not in res:
            raise ValueError(f"{path} is not a `tachyon bench` result (no 'runs')")
        stem = os.path.splitext(os.path.basename(path))[0]
        for r in res["runs"]:
            if not r.get("metrics"):
                continue
            label = f"{stem}:{r.get('label') or r['backend']}" if len(args.compare) > 1 else (r.get("label")
                                                                                               or r["backend"])
            series.setdefault(label, []).append(r)
            flat.append({**r, "label": label + (f" @{r['concurrency']}" if r.get("concurrency") else "")})
    if not flat:
        raise ValueError("no finished runs in the given results")
    print(report.table(flat, [99.0], "tachyon bench compare"))
    out = args.plot_out or os.path.join(RESULTS_DIR, "compare.png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if any(r.get("concurrency") is not None for r in flat):
        plots.plot_concurrency(series, out, "compare: " + ", ".join(os.path.basename(p) for p in args.compare))
    else:
        plots.plot_bars(flat, out, "compare")
    print(f"saved {out}", file=sys.stderr)
    return 0


def cmd_ladder(args) -> int:
    """Each step of tachyon.bench.ladder in its own process; one table, JSON, Markdown and bar chart of them."""
    import tempfile

    from tachyon.bench import ladder, plots
    from tachyon.bench.report import write_json

    spec = workload_spec(args, "throughput")
    steps = ladder.ladder_steps()
    if args.steps:
        want = [s.strip() for s in args.steps.split(",")]
        unknown = [w for w in want if w not in {n for n, _ in steps}]
        if unknown:
            raise ValueError(f"unknown ladder steps {unknown}; the steps are: {[n for n, _ in steps]}")
        steps = [s for s in steps if s[0] in want]
    result = base_result(args, "ladder", spec)
    done = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, flags in steps:
                print(f"ladder: {name} ...", file=sys.stderr, flush=True)
                step = ladder.run_step(name, flags, args, tmp)
                done.append(step)
                print(f"ladder: {name}: " + (f"FAILED ({step['error']})" if step.get("error")
                                            else f"{step['tok_s']:.1f} tok/s, {step['memory_gib']:.2f} GiB"),
                      file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        result["interrupted"] = True
    result["steps"] = done
    print(ladder.table(done))
    if not args.no_save:
        path = _result_path(result, args)
        stem = os.path.splitext(path)[0]
        if done:
            result["plot"] = plots.plot_ladder(done, args.plot or stem + ".png", _plot_title(result))
        write_json(result, path)
        with open(stem + ".md", "w") as f:
            f.write(ladder.markdown(result))
        print(f"saved {path}, {stem}.md" + (f", {result['plot']}" if result.get("plot") else ""), file=sys.stderr)
    if result["interrupted"]:
        return 130
    return 0 if done and any(not s.get("error") for s in done) else 1


def run_bench(args) -> int:
    if getattr(args, "compare", None):
        return cmd_compare(args)
    cmd = getattr(args, "bench_command", None)
    if cmd is None:
        print("tachyon bench: choose one of latency, throughput, serve, sweep, ladder (or --compare A.json ...)",
              file=sys.stderr)
        return 2
    if cmd == "ladder":
        return cmd_ladder(args)
    return cmd_offline(args, cmd)
