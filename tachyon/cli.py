"""`tachyon ...`: the command line. Each subcommand parses its flags here and delegates to its layer."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from tachyon.gateway.cli import add_gateway_args

if TYPE_CHECKING:
    from tachyon.outputs import RequestOutput
    from tachyon.sampling_params import SamplingParams

# The engine's flags (engine_args, and through it torch) load in build_parser and the commands that run a model:
# `tachyon gateway` runs none, and starts without them (see main).


def _sampling(args) -> SamplingParams:
    from tachyon.sampling_params import SamplingParams

    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          max_tokens=args.max_tokens, seed=args.seed_sampling, stop=args.stop or None)


def _add_sampling_args(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--max-tokens", type=int, default=256, help="the most tokens to generate (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=temperature,
                   help="sampling temperature, 0 = greedy (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=-1, help="sample among the k most likely tokens (-1: all)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--seed-sampling", type=int, default=None, help="per-request sampling seed")


def _stream(engine, rid: str, out=None) -> RequestOutput:
    """Step the engine until request rid finishes, printing its text as it grows."""
    out = out or sys.stdout
    shown = 0
    final = None
    while final is None:
        for o in engine.step():
            if o.request_id != rid:
                continue
            text = o.outputs[0].text
            out.write(text[shown:])
            out.flush()
            shown = len(text)
            if o.finished:
                final = o
    out.write("\n")
    return final


def cmd_generate(args) -> int:
    from tachyon.engine_args import EngineArgs
    from tachyon.llm import LLM

    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    sp = _sampling(args)
    if args.chat:
        ids = llm.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        ids = llm.get_tokenizer().encode(args.prompt)
    llm.engine.add_request("cli-0", args.prompt, ids, sp)
    if not args.chat:
        sys.stdout.write(args.prompt)
    final = _stream(llm.engine, "cli-0")
    m = final.metrics
    n = len(final.outputs[0].token_ids)
    if args.verbose:
        dt = (m.finished_time - m.first_token_time) if n > 1 else 0.0
        print(f"[{n} tokens, TTFT {m.ttft * 1000:.0f} ms, {((n - 1) / dt) if dt else 0:.1f} tok/s decode, "
              f"finish: {final.outputs[0].finish_reason}]", file=sys.stderr)
    return 0


def cmd_chat(args) -> int:
    from tachyon.engine_args import EngineArgs
    from tachyon.llm import LLM

    print("loading model ...", file=sys.stderr, flush=True)
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    sp = _sampling(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    print("Tachyon chat. Type a message; /reset clears the conversation, /exit or Ctrl-D quits.", file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("you> " if interactive else "")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": line})
        ids = llm.encode_chat(messages)
        rid = f"chat-{turn}"
        turn += 1
        sys.stdout.write("assistant> ")
        try:
            llm.engine.validate(ids, sp)
        except ValueError as e:
            print(f"\n[{e}; /reset to start over]")
            messages.pop()
            continue
        llm.engine.add_request(rid, None, ids, sp)
        final = _stream(llm.engine, rid)
        messages.append({"role": "assistant", "content": final.outputs[0].text})


def cmd_serve(args) -> int:
    from tachyon.server.cli import run_server

    return run_server(args)


def cmd_bench(args) -> int:
    from tachyon.bench.cli import run_bench

    return run_bench(args)


def cmd_plan(args) -> int:
    from tachyon.plan import run_plan

    return run_plan(args)


def cmd_quantize(args) -> int:
    from tachyon.quantize import run_quantize

    return run_quantize(args)


def cmd_eval(args) -> int:
    from tachyon.eval import run_eval

    return run_eval(args)


def cmd_gateway(args) -> int:
    from tachyon.gateway.cli import run_gateway

    return run_gateway(args)


def build_parser() -> argparse.ArgumentParser:
    from tachyon.bench.cli import add_bench_args
    from tachyon.engine_args import EngineArgs
    from tachyon.eval import add_eval_args
    from tachyon.plan import add_plan_args
    from tachyon.quantize import add_quantize_args
    from tachyon.server.cli import add_serve_args

    parser = argparse.ArgumentParser(prog="tachyon", description="Tachyon LLM inference engine", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="complete one prompt, streaming the text")
    p.add_argument("prompt", help="the text to complete")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("-v", "--verbose", action="store_true", help="print timings")
    EngineArgs.add_cli_args(p)
    _add_sampling_args(p, temperature=0.0)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat on the terminal (streams tokens)")
    p.add_argument("--system", default=None, help="system prompt")
    EngineArgs.add_cli_args(p)
    _add_sampling_args(p, temperature=0.7)
    p.set_defaults(func=cmd_chat)

    # Each layer adds its own flags (bench adds the engine's to each of its subcommands).
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    EngineArgs.add_cli_args(p)
    add_serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("bench", help="benchmarks: latency, throughput, serve, sweep, ladder")
    add_bench_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("plan", help="capacity planner: weights, KV bytes per token, max concurrent sequences")
    add_plan_args(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("quantize", help="write an int8 or AWQ int4 checkpoint of a dense one, then compare perplexity")
    add_quantize_args(p)
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("eval", help="quality of a model as the engine runs it: ppl (held-out perplexity)")
    add_eval_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("gateway", help=_GATEWAY_HELP)
    add_gateway_args(p)
    p.set_defaults(func=cmd_gateway)
    for command in all_parsers(parser):
        command.allow_abbrev = False  # --max-tok is an error, not --max-tokens: a typo never changes a setting
    return parser


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser below it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += all_parsers(sub)
    return found


_GATEWAY_HELP = "API gateway over OpenAI-compatible backends: keys, limits, routing, balancing"


def _gateway_parser() -> argparse.ArgumentParser:
    """`tachyon gateway` alone: the same flags as build_parser's, without the engine's modules."""
    p = argparse.ArgumentParser(prog="tachyon gateway", description=_GATEWAY_HELP, allow_abbrev=False)
    add_gateway_args(p)
    p.set_defaults(func=cmd_gateway, command="gateway")
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gateway"]:  # no model runs here: a gateway process never imports torch
        args = _gateway_parser().parse_args(argv[1:])
    else:
        args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"tachyon: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
