"""`tachyon eval ppl`: quality measurements of a model as the engine runs it (tachyon.eval.ppl)."""

from __future__ import annotations

import argparse
import json
import sys

from tachyon.engine_args import EngineArgs
from tachyon.eval.ppl import DEFAULT_MAX_TOKENS, DEFAULT_SEQ_LEN, HELDOUT_DESCRIPTION

MODEL_KNOBS = ("model", "tokenizer", "dtype", "device", "quantization", "kv_cache_dtype")


def add_eval_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="eval_command", required=True)
    q = sub.add_parser("ppl", help="perplexity on held-out text that ships with Python",
                       description="Perplexity of the model, computed by Tachyon's own forward (quantized layers as "
                                   "the engine runs them, torch attention), on held-out text: pydoc_data.topics, "
                                   "every 4th topic in sorted order. The other topics are the calibration text of "
                                   "`tachyon quantize --method awq`, so the two never overlap.")
    add_ppl_args(q)
    EngineArgs.add_cli_args(q, only=MODEL_KNOBS)


def add_ppl_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """--max-tokens / --seq-len (with `prefix`, e.g. --eval-max-tokens, where a command has its own)."""
    p.add_argument(f"--{prefix}max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="held-out tokens to score, from the start (0 = all; default %(default)s)")
    p.add_argument(f"--{prefix}seq-len", type=int, default=DEFAULT_SEQ_LEN,
                   help="tokens per window; each window is one fresh sequence (default %(default)s)")
    if not prefix:
        p.add_argument("--json", action="store_true", help="print one JSON object instead of the line")


def run_eval(args: argparse.Namespace) -> int:
    from tachyon.eval.ppl import heldout_perplexity

    r = heldout_perplexity(EngineArgs.from_cli_args(args), args.max_tokens, args.seq_len, progress=not args.json)
    if args.json:
        json.dump({"model": args.model or "embedded SmolLM2-135M-Instruct", "quantization": args.quantization,
                   "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype, "text": HELDOUT_DESCRIPTION, **r.to_dict()}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"perplexity {r.ppl:.4f} over {r.num_tokens} tokens ({r.num_windows} windows of <= {r.seq_len}; "
              f"held-out text: {HELDOUT_DESCRIPTION})")
    return 0
