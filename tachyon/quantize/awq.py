"""AWQ (Lin et al. 2023, activation-aware weight quantization): 4-bit weights in groups of G input features,
a scale and a zero point per group, made less lossy by scaling each input channel before rounding.

A channel whose activations are large weighs more in the output. Multiplying its weights by s > 1 before
rounding shrinks their relative rounding error; dividing its input by s keeps the float product the same, and
that division is folded into the op before (an RMSNorm's weight, or rows of the linear before):

    y = x W^T = (x / s) (W diag(s))^T          the quantized model computes (x / s) Q(W diag(s))^T

For each group of linears sharing one input (qkv after input_layernorm, gate/up after post_attention_layernorm,
down after the activation, o after v where every query head has its own kv head), s = mean|x|^alpha
(normalised to a geometric mean of max and min of 1), or AutoAWQ's duo form mean|x|^alpha / mean|w|^(1-alpha)
(|w| relative to its group's absmax, averaged over outputs), alpha on a grid of 20 in [0, 1) for each (alpha = 0
of the first: plain round-to-nearest), chosen to minimise the squared error of the group's outputs on the
calibration tokens. That error is exact from the inputs' Gram matrix H = X^T X, gathered once per linear:

    ||X W^T - X E^T||^2 = sum_n (W - E)_n H (W - E)_n^T,     E = Q(W diag(s)) diag(s)^-1

so a grid point costs one [N, K] x [K, K] product whatever the number of tokens.

Then the scaled weight is rounded (`--rounding`):
- gptq (default): GPTQ (Frantar et al. 2022) on the scaled weight and the Gram matrix of the scaled inputs:
  columns rounded in order, each one's error spread over the columns still to round through H^-1 (Cholesky,
  1% damping), so later columns absorb it; a group's scale and zero are fixed when its first column comes up,
  from the weights as updated by then, with the clip search below on that group.
- nearest: each group rounded to nearest over a clipped range (below), then its scale refit by least squares
  under H's block (zero kept, q rounded again, kept where the error drops).
The clip search, per group of G weights of one output feature: shrink the range [min, max] that is rounded over
(ratios 1, 0.95, ..., 0.55) where that lowers the group's own share of the output error (H's diagonal G x G
block).

Layers run in order over the calibration text; layer i calibrates on what layers 0..i-1 compute once rounded.
Where this differs from AutoAWQ: the loss is the output error of a group's linears, not of the attention or MLP
block behind them (measured on the embedded model, ranking the best grid points by the block's output error
made perplexity slightly worse); the clip shrinks [min, max] instead of clamping to +-absmax; the rounding.

Rounding, per group (asymmetric, 0..15): scale = (max - min) / 15 (rounded to fp16, as stored), zero =
round(-min / scale), q = clamp(round(w / scale) + zero, 0, 15), w ~ (q - zero) * scale. The checkpoint is
AutoAWQ's GEMM layout: qweight int32 [K, N/8] and qzeros [K/G, N/8] in its interleaved nibble order
(kernels/quant_ref.natural_to_awq), scales fp16 [K/G, N].
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from tachyon.config import ModelConfig
from tachyon.kernels.quant_ref import natural_to_awq, pack_int4
from tachyon.quantize.calibration import InputStats, packed_prefills, record_input
from tachyon.quantize.checkpoint import LINEARS, parts
from tachyon.quantize.gptq import GPTQ_BLOCK, gptq

ROUNDINGS = ("gptq", "nearest")  # after the scale search: GPTQ's error feedback, or nearest + scale refit
N_GRID = 20
MAX_SHRINK = 0.5  # the clip search tries range ratios 1.0, 0.95, ..., 0.55
REFINE_ITERS = 4  # least-squares scale refits per group after the clip search


def quantization_config(group_size: int) -> dict:
    """config.json's quantization_config, as AutoAWQ and transformers' AwqConfig write it."""
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}


def check_group_size(cfg: ModelConfig, group_size: int) -> None:
    """Every linear's input features a multiple of G, every output a multiple of 8 (one int32 word)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    ins = {cfg.hidden_size, q, cfg.intermediate_size}
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"--group-size {group_size}: Tachyon's int4 kernels take a power of two >= 16")
    bad = sorted(k for k in ins if k % group_size)
    if bad:
        g = math.gcd(*ins)
        fit = g & -g  # the largest power of two dividing every input width
        hint = f"pass --group-size {min(fit, group_size)}" if fit >= 16 else "this model cannot be AWQ-quantized"
        raise ValueError(f"--group-size {group_size} does not divide the input features {bad} of this model's "
                         f"linears: {hint}")
    odd = sorted(n for n in {q, kv, cfg.hidden_size, cfg.intermediate_size} if n % 8)
    if odd:
        raise ValueError(f"output features {odd} are not multiples of 8: int4 packs 8 outputs per int32 word")


# -- rounding -------------------------------------------------------------------------------------------------
def quantize_groups(w: torch.Tensor, group_size: int, ratio: torch.Tensor | float = 1.0):
    """w [N, K] -> (q int32 [N, K] in 0..15, zeros int32 [N, K/G], scales fp32 [N, K/G], fp16-exact); the range of
    group g of row n is ratio[n, g] * [min, max] (the clip)."""
    N, K = w.shape
    wg = w.float().reshape(N, K // group_size, group_size)
    ratio = torch.as_tensor(ratio, dtype=torch.float32, device=w.device)
    wmax, wmin = wg.amax(-1) * ratio, wg.amin(-1) * ratio
    scales = ((wmax - wmin).clamp(min=1e-5) / 15).half().float()
    zeros = torch.round(-wmin / scales).clamp(0, 15)
    q = (torch.round(wg / scales[..., None]) + zeros[..., None]).clamp(0, 15)
    return q.reshape(N, K).to(torch.int32), zeros.to(torch.int32), scales


def dequantize_groups(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    N, K = q.shape
    w = (q.reshape(N, K // group_size, group_size) - zeros[..., None]).float() * scales[..., None]
    return w.reshape(N, K)


def fake_quantize(w: torch.Tensor, group_size: int, ratio: torch.Tensor | float = 1.0) -> torch.Tensor:
    """What the int4 model computes with in place of w [N, K]."""
    return dequantize_groups(*quantize_groups(w, group_size, ratio), group_size)


def pack_awq(hf_name: str, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """One checkpoint linear's tensors in AutoAWQ's layout from q [N, K], zeros and scales [N, K/G]."""
    return {hf_name + ".qweight": natural_to_awq(pack_int4(q.T.contiguous())).cpu(),
            hf_name + ".qzeros": natural_to_awq(pack_int4(zeros.T.contiguous())).cpu(),
            hf_name + ".scales": scales.T.to(torch.float16).contiguous().cpu()}


# -- the search -------------------------------------------------------------------------------------------------
def output_error(w: torch.Tensor, w_hat: torch.Tensor, gram: torch.Tensor) -> float:
    """sum over the calibration tokens and outputs of (x w^T - x w_hat^T)^2, from the Gram matrix."""
    d = (w.float() - w_hat.float()).double()
    return float(((d @ gram) * d).sum())


def scale_for(mean: torch.Tensor, alpha: float, w_mean: torch.Tensor | None = None) -> torch.Tensor:
    """mean|x|^alpha, divided by w_mean^(1 - alpha) when given (AutoAWQ's duo scaling), normalised."""
    s = mean.float().pow(alpha)
    if w_mean is not None:
        s = s / (w_mean.float().pow(1 - alpha) + 1e-4)
    s = s.clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def weight_mean(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per input channel: the mean over output features of |w| relative to its group's absmax."""
    N, K = w.shape
    wg = w.float().abs().reshape(N, K // group_size, group_size)
    return (wg / wg.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(N, K).mean(0)


def search_scale(w: torch.Tensor, stats: InputStats, group_size: int, n_grid: int = N_GRID) -> tuple[torch.Tensor, float]:
    """The per-input-channel scale s of w [N, K] (all linears of a group side by side) and its alpha: the grid
    over alpha of both mean|x|^alpha and AutoAWQ's duo form, whichever gives the least output error."""
    w = w.float()
    w_mean = weight_mean(w, group_size)
    best = (math.inf, None, 0.0)
    for duo in (None, w_mean):
        for i in range(n_grid):
            alpha = i / n_grid
            s = scale_for(stats.mean, alpha, duo)
            err = output_error(w, fake_quantize(w * s, group_size) / s, stats.gram)
            if err < best[0]:
                best = (err, s, alpha)
    return best[1], best[2]


def search_clip(w: torch.Tensor, stats: InputStats, group_size: int, n_grid: int = N_GRID,
                max_shrink: float = MAX_SHRINK) -> torch.Tensor:
    """Per group of w [N, K]: the range ratio [N, K/G] with the least error of the group's share of the output."""
    return clip_ratios(w, group_blocks(stats, group_size), group_size, n_grid, max_shrink)


def clip_ratios(w: torch.Tensor, blocks: torch.Tensor, group_size: int, n_grid: int = N_GRID,
                max_shrink: float = MAX_SHRINK) -> torch.Tensor:
    """search_clip from the groups' G x G Gram blocks [K/G, G, G]."""
    N, K = w.shape
    ng = K // group_size
    wg = w.double().reshape(N, ng, group_size).transpose(0, 1)  # [ng, N, G]
    best_err = torch.full((N, ng), math.inf, dtype=torch.float64, device=w.device)
    best = torch.ones(N, ng, device=w.device)
    for i in range(round(max_shrink * n_grid)):
        r = 1 - i / n_grid
        d = wg - fake_quantize(w, group_size, r).double().reshape(N, ng, group_size).transpose(0, 1)
        err = ((d @ blocks) * d).sum(-1).T  # [N, ng]
        better = err < best_err
        best_err[better], best[better] = err[better], r
    return best


def group_blocks(stats: InputStats, group_size: int) -> torch.Tensor:
    """The G x G diagonal blocks of the Gram matrix, [K/G, G, G]: group g's share of the output error."""
    ng = stats.gram.shape[0] // group_size
    return stats.gram.reshape(ng, group_size, ng, group_size).diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def refine_scales(w: torch.Tensor, stats: InputStats, group_size: int, q: torch.Tensor, zeros: torch.Tensor,
                  scales: torch.Tensor, iters: int = REFINE_ITERS):
    """Lower each group's output error further, keeping its zero point: the scale that is the least-squares
    fit of w to s * (q - z) under H's diagonal block (closed form), then q rounded again on that scale; a group
    keeps the new pair only where its error went down."""
    N, K = w.shape
    ng = K // group_size
    blocks = group_blocks(stats, group_size)
    wg = w.double().reshape(N, ng, group_size).transpose(0, 1)  # [ng, N, G]
    zt = zeros.T.double()[..., None]  # [ng, N, 1]

    def err_of(qt, st):
        d = wg - (qt - zt) * st[..., None]
        return ((d @ blocks) * d).sum(-1)  # [ng, N]

    qt, st = q.reshape(N, ng, group_size).transpose(0, 1).double(), scales.T.double()
    best = err_of(qt, st)
    for _ in range(iters):
        d = qt - zt
        hd = d @ blocks
        den = (hd * d).sum(-1)
        s_new = torch.where(den > 0, (hd * wg).sum(-1) / den.clamp(min=1e-30), st).clamp(min=1e-5).half().double()
        q_new = (torch.round(wg / s_new[..., None]) + zt).clamp(0, 15)
        e = err_of(q_new, s_new)
        better = e < best
        best = torch.where(better, e, best)
        st = torch.where(better, s_new, st)
        qt = torch.where(better[..., None], q_new, qt)
    return (qt.transpose(0, 1).reshape(N, K).to(torch.int32), zeros, st.T.float().contiguous())


def gptq_round(w: torch.Tensor, gram: torch.Tensor, group_size: int, clip: bool = True, n_grid: int = N_GRID,
               max_shrink: float = MAX_SHRINK, block: int = GPTQ_BLOCK):
    """Round w [N, K] column by column, each column's rounding error spread over the columns not yet rounded
    through the inverse Gram matrix (GPTQ, Frantar et al. 2022; tachyon.quantize.gptq), so that the output error
    on the calibration tokens stays small; a group's scale and zero are set when its first column is reached, from
    the weights as updated by then (with the clip search on that group's share of the error). Same result layout
    as quantize_groups: (q int32 [N, K], zeros int32 [N, K/G], scales fp32 [N, K/G])."""
    N, K = w.shape
    q = torch.zeros(N, K, dtype=torch.int32, device=w.device)
    ng = K // group_size
    zeros = torch.zeros(N, ng, dtype=torch.int32, device=w.device)
    scales = torch.zeros(N, ng, dtype=torch.float32, device=w.device)
    zf = sf = None

    def round_column(col: int, rest: torch.Tensor) -> torch.Tensor:
        nonlocal zf, sf
        if col % group_size == 0:  # the group's scale and zero, from its weights as updated by now
            g, wg = col // group_size, rest[:, :group_size]
            ratio = 1.0
            if clip:
                hb = gram[col:col + group_size, col:col + group_size].double()[None]
                ratio = clip_ratios(wg, hb, group_size, n_grid, max_shrink)
            _, z, sc = quantize_groups(wg, group_size, ratio)
            zeros[:, g], scales[:, g] = z[:, 0], sc[:, 0]
            zf, sf = z[:, 0].double(), sc[:, 0].double()
        qi = (torch.round(rest[:, 0] / sf) + zf).clamp(0, 15)
        q[:, col] = qi.to(torch.int32)
        return (qi - zf) * sf

    gptq(w, gram, round_column, max(block, group_size) // group_size * group_size)  # a block holds whole groups
    return q, zeros, scales


# -- one decoder layer ------------------------------------------------------------------------------------------
def scale_groups(layer: nn.Module, cfg: ModelConfig) -> list[tuple[str, nn.Module, slice]]:
    """(linear, the op before it, the rows of that op which make the linear's input) for the linears whose input
    scaling folds into the op before exactly: qkv after input_layernorm, gate/up after post_attention_layernorm,
    down after silu(gate) * up (linear in up). o_proj (through v, MHA only) is the caller's choice."""
    inter = cfg.intermediate_size
    return [("self_attn.qkv_proj", layer.input_layernorm, slice(None)),
            ("mlp.gate_up_proj", layer.post_attention_layernorm, slice(None)),
            ("mlp.down_proj", layer.mlp.gate_up_proj, slice(inter, 2 * inter))]


def fold_scale(prev: nn.Module, rows: slice, linear: nn.Linear, s: torch.Tensor) -> None:
    """linear's inputs become x / s: its weight columns * s, and rows `rows` of the op before (whose outputs are
    those inputs: an RMSNorm's weight, a linear's weight rows and bias) / s."""
    linear.weight.data *= s
    prev.weight.data[rows] /= s if prev.weight.dim() == 1 else s[:, None]
    if getattr(prev, "bias", None) is not None:
        prev.bias.data[rows] /= s


@torch.no_grad()
def quantize_layer(layer: nn.Module, cfg: ModelConfig, stats: dict[str, InputStats] | None, group_size: int,
                   clip: bool = True, rounding: str = "gptq") -> tuple[dict[str, tuple], dict[str, float]]:
    """Search and fold the scales of one decoder layer (in place), then round each of its linears (ROUNDINGS).
    stats None: plain round-to-nearest. Returns {linear: (q, zeros, scales)} and the alphas chosen."""
    attn = layer.self_attn
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    alphas: dict[str, float] = {}
    if stats is not None:
        groups = scale_groups(layer, cfg)
        if cfg.num_heads == cfg.num_kv_heads:  # o's input channel c is v's output c only without grouped heads
            groups.insert(1, ("self_attn.o_proj", attn.qkv_proj, slice(q + kv, q + 2 * kv)))
        for name, prev, rows in groups:
            linear = layer.get_submodule(name)
            s, alphas[name] = search_scale(linear.weight.data, stats[name], group_size)
            fold_scale(prev, rows, linear, s)
            stats[name] = stats[name].scaled(s)
    out = {}
    for name in LINEARS:
        w = layer.get_submodule(name).weight.data
        if stats is None:
            out[name] = quantize_groups(w, group_size)
        elif rounding == "gptq":
            out[name] = gptq_round(w, stats[name].gram, group_size, clip)
        else:
            ratio = search_clip(w, stats[name], group_size) if clip else 1.0
            out[name] = refine_scales(w, stats[name], group_size, *quantize_groups(w, group_size, ratio))
    return out, alphas


# -- the model --------------------------------------------------------------------------------------------------
@torch.no_grad()
def awq_tensors(lm, samples: list[list[int]] | None, group_size: int, clip: bool = True, progress: bool = True,
                rounding: str = "gptq") -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """Quantize every linear of lm.model (a tachyon.eval.ppl.LoadedModel, dense; its scales are folded in place)
    to AutoAWQ tensors in HF's names. samples: calibration sequences of token ids, or None for plain
    round-to-nearest (no calibration, no search). Returns the tensors and each layer's alphas."""
    from tachyon.eval.ppl import kv_cache

    model, cfg = lm.model, lm.model.cfg
    check_group_size(cfg, group_size)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding {rounding!r}: one of {', '.join(ROUNDINGS)}")
    device, block_size = lm.config.device, lm.config.cache.block_size
    steps = packed_prefills(samples or [], block_size, device)
    kv = kv_cache(cfg, max((st[2] for st in steps), default=1), block_size, lm.config.dtype, device)
    state = [(model.embed_tokens(ids), None) for _, _, _, ids in steps]
    tensors: dict[str, torch.Tensor] = {}
    report = []
    layers = model.layers
    if progress:
        from tqdm import tqdm

        layers = tqdm(layers, desc="AWQ search" if samples else "AWQ round-to-nearest", unit="layer",
                      dynamic_ncols=True)
    def run_layer(layer):
        return [layer(pos, h, r, kv, meta, lm.backend, model.rotary)
                for (h, r), (meta, pos, _, _) in zip(state, steps, strict=True)]

    for i, layer in enumerate(layers):
        stats = None
        if samples:
            stats = {n: InputStats(layer.get_submodule(n).in_features, device) for n in LINEARS}
            hooks = [layer.get_submodule(n).register_forward_pre_hook(functools.partial(record_input, stats[n]))
                     for n in LINEARS]
            try:
                run_layer(layer)
            finally:
                for h in hooks:
                    h.remove()
        results, alphas = quantize_layer(layer, cfg, stats, group_size, clip, rounding)
        if samples:  # the next layer calibrates on what this one computes once rounded
            dense = {}
            for name, (q, z, s) in results.items():
                linear = layer.get_submodule(name)
                dense[name], linear.weight.data = linear.weight.data, dequantize_groups(q, z, s, group_size)
            state = run_layer(layer)
            for name, w in dense.items():
                layer.get_submodule(name).weight.data = w
        for name, (q, z, s) in results.items():
            for part in parts(cfg, i, name):
                rows = slice(part.start, part.start + part.size)
                tensors.update(pack_awq(part.hf_name, q[rows], z[rows], s[rows]))
        report.append(alphas)
        if progress and alphas:
            layers.set_postfix({k.rpartition(".")[2]: v for k, v in alphas.items()})
    return tensors, report
