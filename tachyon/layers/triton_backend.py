"""The layers' Triton fast paths: the attention backend (same interface as `layers.attention.TorchAttentionBackend`)
and the hook that swaps the fused Triton ops into a model's RMSNorm / rotary / MLP activation.

Here, above the kernels, because both put kernels into layers: `tachyon.kernels` imports nothing of the layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tachyon import envs
from tachyon.kernels.decode_attention import decode_attention
from tachyon.kernels.fused_ops import (
    fused_add_rms_norm,
    rotary,
    rotary_write_kv,
    silu_and_mul,
    silu_and_mul_quant,
)
from tachyon.kernels.kv_write import write_kv
from tachyon.kernels.paged_attention import prefill_attention
from tachyon.layers.activation import silu_and_mul_ref
from tachyon.layers.linear import QuantizedRows, ScaledLinear
from tachyon.layers.norm import RMSNorm
from tachyon.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:  # layers.attention imports this module when the triton backend is asked for
    from tachyon.layers.attention import AttentionMetadata


class TritonAttentionBackend:
    """write_kv, then split-K decode for the first num_decodes sequences and prefill/extend for the rest.

    Only Python ints from `meta` decide what launches, so a decode-only step can be captured in a CUDA graph
    (set meta.max_seq_len to the capture-time bound on context length).
    """

    name = "triton"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                v_scale: float = 1.0) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return self.attend(q, k_cache, v_cache, meta, scale, k_scale=k_scale, v_scale=v_scale)

    def forward_rotary(self, positions, cos_sin_cache, q, k, v, k_cache, v_cache, meta: AttentionMetadata,
                       scale: float, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        """Rotary embedding and the KV write in one kernel, then attention (one launch fewer per layer)."""
        rotary_write_kv(positions, q, k, v, cos_sin_cache, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return self.attend(q, k_cache, v_cache, meta, scale, k_scale=k_scale, v_scale=v_scale)

    def attend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float,
               out: torch.Tensor | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        nd = meta.num_decodes
        num_seqs = meta.seq_lens.shape[0]
        if nd > 0:
            decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
                             meta.max_seq_len, out=out[:nd], k_scale=k_scale, v_scale=v_scale)
        if num_seqs > nd:
            prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale,
                              meta.max_query_len, seq_start=nd, num_seqs=num_seqs - nd, out=out,
                              k_scale=k_scale, v_scale=v_scale)
        return out


class _SiluAndMulQuant:
    """An MLP's activation that also quantizes its output rows for the ScaledLinear after it."""

    def __init__(self, linear: ScaledLinear):
        self.qtype, self.input_scale = linear.input_quantization()

    def __call__(self, x: torch.Tensor) -> QuantizedRows:
        out, (q, scale) = silu_and_mul_quant(x, self.qtype, self.input_scale)
        return QuantizedRows(out, q, scale)


def install_fused_ops(model: torch.nn.Module, quantized_inputs: bool | None = None) -> torch.nn.Module:
    """Point every RMSNorm / RotaryEmbedding `.fused` hook, and every MLP `.act` that is the torch
    silu_and_mul reference, at the Triton kernels. Where a module declares which of its norms or activation feeds
    which linear (`QUANT_FEEDS`: (producer, linear) attribute paths) and that linear is a `ScaledLinear`, the
    producer also writes its output's rows quantized for it (`QuantizedRows`): one launch and one read of the
    activations fewer a linear. quantized_inputs: whether to (default: only with TACHYON_FUSED_QUANT=1 until a GPU
    run has measured it against the linears' own quantize_rows; the switch is for that A/B). Returns the model."""
    if quantized_inputs is None:
        quantized_inputs = bool(envs.flag("TACHYON_FUSED_QUANT"))
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.fused = fused_add_rms_norm
        elif isinstance(module, RotaryEmbedding):
            module.fused = rotary
        elif getattr(module, "act", None) is silu_and_mul_ref:
            module.act = silu_and_mul
    for module in model.modules():
        for producer, consumer in getattr(type(module), "QUANT_FEEDS", ()):
            linear = module.get_submodule(consumer)
            on = quantized_inputs and isinstance(linear, ScaledLinear)
            if producer == "act":
                if on and module.act is silu_and_mul:
                    module.act = _SiluAndMulQuant(linear)
                elif not on and isinstance(module.act, _SiluAndMulQuant):
                    module.act = silu_and_mul
            else:
                module.get_submodule(producer).quantize_for = linear.input_quantization() if on else None
    return model
