"""`tachyon quantize`: a dense checkpoint in, a weight-quantized one out, then both models' held-out perplexity.

    tachyon quantize --model IN --method int8 --out DIR     8-bit, one absmax scale per output feature
    tachyon quantize --model IN --method awq --out DIR      4-bit AWQ in groups, GPTQ rounding (tachyon.quantize.awq)
    tachyon quantize --model IN --method fp8 --out DIR      E4M3 weights per output feature, E4M3 activations
                                                            per token (tachyon.quantize.fp8)
    tachyon quantize --model IN --method w8a8 --out DIR     SmoothQuant: int8 weights per output feature, int8
                                                            activations per token (tachyon.quantize.w8a8)

DIR is an HF checkpoint directory (model.safetensors in HF's names, config.json with `quantization_config`,
the tokenizer files), so `tachyon serve --model DIR` runs it. Embeddings, norms and lm_head stay dense. The
AWQ checkpoint is AutoAWQ's GEMM layout; fp8 and w8a8 are llm-compressor's compressed-tensors layouts
(float-/int-quantized: weight [N, K], weight_scale [N, 1]); the int8 one is Tachyon's own (qweight int8 [N, K],
scales [N]).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tachyon.config import QUANTIZATION_METHODS
from tachyon.engine_args import EngineArgs
from tachyon.eval import add_ppl_args
from tachyon.quantize.w8a8 import DEFAULT_ALPHA

DEFAULT_GROUP_SIZE = 128
DEFAULT_CALIB_SAMPLES = 32
DEFAULT_CALIB_SEQ_LEN = 512


def add_quantize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", required=True, choices=QUANTIZATION_METHODS,
                   help="awq: 4-bit weights in groups, a scale and zero point each, activation-aware scale and clip "
                        "search on calibration text; int8: 8-bit weights, one absmax scale per output feature; "
                        "fp8: E4M3 weights, one scale per output feature, E4M3 activations with a scale per token "
                        "(compressed-tensors FP8_DYNAMIC); w8a8: SmoothQuant, int8 weights per output feature and "
                        "int8 activations per token, activation outliers moved into the weights on calibration "
                        "text (compressed-tensors W8A8)")
    p.add_argument("--out", required=True, help="the directory to write the quantized checkpoint to")
    p.add_argument("--overwrite", action="store_true", help="replace the checkpoint already in --out")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                   help="dtype of what stays dense (embeddings, norms, lm_head, biases); auto: the input's. AWQ "
                        "scales are float16 (AutoAWQ's layout), int8, fp8 and w8a8 scales float32. Calibration "
                        "runs in float32")
    g = p.add_argument_group("awq")
    g.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                   help="input features per scale and zero point: a power of two >= 16 that divides every "
                        "linear's input features (SmolLM2-135M's 576: 64) (default %(default)s)")
    g.add_argument("--no-search", action="store_true",
                   help="plain round-to-nearest: no calibration, no scale or clip search")
    g.add_argument("--no-clip", action="store_true", help="the scale search without the clip search")
    p.add_argument("--rounding", choices=("gptq", "nearest"), default="gptq",
                   help="awq, fp8, w8a8: how the (scaled) weights are rounded: gptq, each column's error compensated "
                        "by the columns after it on the calibration text's inputs (GPTQ); nearest, round to nearest "
                        "(awq: with a least-squares scale refit; fp8: no calibration) (default %(default)s)")
    g = p.add_argument_group("w8a8")
    g.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help="SmoothQuant's migration strength in [0, 1]: s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha) "
                        "(default %(default)s)")
    g = p.add_argument_group("calibration (awq, w8a8)")
    g.add_argument("--calib-samples", type=int, default=DEFAULT_CALIB_SAMPLES,
                   help="calibration sequences (default %(default)s)")
    g.add_argument("--calib-seq-len", type=int, default=DEFAULT_CALIB_SEQ_LEN,
                   help="tokens per calibration sequence (default %(default)s). The text: pydoc_data.topics, the "
                        "topics `tachyon eval ppl` does not hold out")
    g = p.add_argument_group("perplexity after writing (tachyon eval ppl, dense vs quantized)")
    g.add_argument("--no-eval", action="store_true", help="skip it")
    add_ppl_args(g, prefix="eval-")
    EngineArgs.add_cli_args(p, only=("model", "tokenizer", "device"))


def run_quantize(args: argparse.Namespace) -> int:
    import torch

    from tachyon.config import parse_dtype
    from tachyon.eval.ppl import HELDOUT_DESCRIPTION, calibration_text, encode, heldout_perplexity, load_model
    from tachyon.quantize.checkpoint import checkpoint_dtype, dense_tensors, prepare_out_dir, write_checkpoint

    t0 = time.perf_counter()
    source = EngineArgs(model=args.model, tokenizer=args.tokenizer, device=args.device, dtype="float32")
    lm = load_model(source)
    cfg = lm.config.model
    if cfg.quantization is not None:
        raise ValueError(f"{lm.path} is already {cfg.quantization.method}-quantized: quantize a dense checkpoint")
    from tachyon.quantize import awq
    from tachyon.quantize.calibration import calibration_samples

    if args.method == "awq":
        awq.check_group_size(cfg, args.group_size)
    if not 0 <= args.alpha <= 1:
        raise ValueError(f"--alpha {args.alpha}: SmoothQuant's migration strength lies in [0, 1]")
    prepare_out_dir(args.out, lm.path, args.overwrite)
    out_dtype = checkpoint_dtype(cfg.hf_config) if args.dtype == "auto" else parse_dtype(args.dtype)
    samples = None
    if (args.method == "w8a8" or (args.method == "awq" and not args.no_search)
            or (args.method == "fp8" and args.rounding == "gptq")):
        ids = encode(lm.tokenizer, calibration_text(), "calibration")
        samples = calibration_samples(ids, args.calib_samples, args.calib_seq_len)
    calibrated = "" if samples is None else f" on {len(samples)} x {len(samples[0])} calibration tokens"
    with torch.no_grad():
        if args.method == "int8":
            from tachyon.quantize.int8 import QUANTIZATION_CONFIG, int8_tensors

            tensors, qc, what = int8_tensors(lm.model), QUANTIZATION_CONFIG, "int8 per output channel"
        elif args.method == "fp8":
            from tachyon.quantize.fp8 import QUANTIZATION_CONFIG, fp8_tensors

            tensors, qc = fp8_tensors(lm, samples), QUANTIZATION_CONFIG
            what = f"fp8 E4M3 per output channel, {args.rounding} rounding{calibrated}"
        elif args.method == "w8a8":
            from tachyon.quantize.w8a8 import QUANTIZATION_CONFIG, w8a8_tensors

            tensors, qc = w8a8_tensors(lm, samples, args.alpha, args.rounding), QUANTIZATION_CONFIG
            what = f"SmoothQuant alpha {args.alpha}, int8 per output channel, {args.rounding} rounding{calibrated}"
        else:
            tensors, _ = awq.awq_tensors(lm, samples, args.group_size, clip=not args.no_clip, rounding=args.rounding)
            qc = awq.quantization_config(args.group_size)
            what = (f"AWQ int4, group {args.group_size}, "
                    + ("round-to-nearest" if samples is None else
                       f"scale{'' if args.no_clip else ' + clip'} search and {args.rounding} rounding{calibrated}"))
        tensors.update(dense_tensors(lm.model, out_dtype))
    write_checkpoint(args.out, lm.path, tensors, cfg.hf_config, qc, out_dtype)
    del lm, tensors
    size = os.path.getsize(os.path.join(args.out, "model.safetensors")) / (1 << 20)
    print(f"wrote {args.out} ({what}; {size:.1f} MiB) in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if args.no_eval:
        return 0
    common = dict(tokenizer=args.tokenizer, device=args.device)
    n, L = args.eval_max_tokens, args.eval_seq_len
    dense = heldout_perplexity(EngineArgs(model=args.model, **common), n, L, progress=True)
    quant = heldout_perplexity(EngineArgs(model=args.out, **common), n, L, progress=True)
    delta = 100 * (quant.ppl / dense.ppl - 1)
    print(f"perplexity over {quant.num_tokens} held-out tokens ({HELDOUT_DESCRIPTION}): dense {dense.ppl:.4f}, "
          f"{args.method} {quant.ppl:.4f} ({delta:+.2f}%)")
    return 0
