"""The scales of an fp8 KV cache (--kv-cache-dtype fp8): one for K and one for V per layer.

E4M3 keeps 3 mantissa bits at every magnitude from 2^-6 to 448, so a scale only has to place the layer's
largest values inside that range: k_scale = HEADROOM * max|K| / 448, with max|K| what one calibration forward
sees (K after rotary embedding, as the cache stores it). The headroom covers inputs larger than the
calibration's (larger values saturate at 448 * k_scale); it costs precision only below ~1e-4 of the largest
value, which no dot product notices. The forward runs before any KV pool exists: attention is plain causal
SDPA over the step's own K and V.

Calibration tokens are drawn at random from the vocabulary (seeded): a checkpoint's fp8 scales, when it ships
them, are not read yet.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tachyon.layers.attention import FP8_MAX, AttentionMetadata

HEADROOM = 4.0
CALIBRATION_TOKENS = 512


class _AmaxBackend:
    """An attention backend for one unpaged prefill that records each layer's largest |K| and |V|."""

    name = "amax"

    def __init__(self):
        self.amax: list[tuple[float, float]] = []

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, k_scale=1.0, v_scale=1.0):
        self.amax.append((k.abs().max().item(), v.abs().max().item()))
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                           scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return o.transpose(0, 1)


@torch.inference_mode()
def calibrate_kv_scales(model: torch.nn.Module, vocab_size: int, device: torch.device,
                        num_tokens: int = CALIBRATION_TOKENS, seed: int = 0) -> list[tuple[float, float]]:
    """Set every attention layer's k_scale / v_scale from one forward over random tokens; returns them."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab_size, (num_tokens,), generator=g).to(device)
    positions = torch.arange(num_tokens, device=device)
    layers = [m for m in model.modules() if hasattr(m, "k_scale") and hasattr(m, "v_scale")]
    backend = _AmaxBackend()
    meta = AttentionMetadata(slot_mapping=torch.full((num_tokens,), -1, device=device), query_start_loc=None,
                             seq_lens=None, block_tables=None, num_decodes=0, max_query_len=num_tokens,
                             max_seq_len=num_tokens)
    model(ids, positions, [(None, None)] * len(layers), meta, backend)
    assert len(backend.amax) == len(layers), "one attention call per layer"
    scales = []
    for layer, (k_amax, v_amax) in zip(layers, backend.amax, strict=True):
        layer.k_scale = max(HEADROOM * k_amax / FP8_MAX, 1e-8)
        layer.v_scale = max(HEADROOM * v_amax / FP8_MAX, 1e-8)
        scales.append((layer.k_scale, layer.v_scale))
    return scales
