"""The Llama family in one file: Llama 2/3/3.1, Mistral, Qwen2 (qkv bias), Qwen3 (q/k RMSNorm), SmolLM.

Inputs are packed and unpadded: `input_ids` and `positions` are [T] for all sequences of a step together;
attention reads and writes the paged KV cache through the backend in `layers/attention.py`.

Under tensor parallelism (`tp`, tachyon.layers.parallel) the model is built from this rank's slice of the config
(tachyon.models.sharding: its heads, its intermediate features), o_proj and down_proj each end in one all-reduce,
and the embedding and LM head hold their vocabulary rows. Without it nothing of that runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from tachyon.config import ModelConfig
from tachyon.layers.activation import silu_and_mul_ref
from tachyon.layers.attention import AttentionMetadata
from tachyon.layers.linear import Int8Linear, QuantLinear, ScaledLinear, copy_checked, make_linear
from tachyon.layers.norm import RMSNorm
from tachyon.layers.parallel import ParallelLMHead, TensorParallel, VocabParallelEmbedding
from tachyon.layers.rotary import RotaryEmbedding
from tachyon.models.sharding import plan_shards


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TensorParallel | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.tp = tp
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        # an fp8 KV cache's scales (layers.attention says how they apply); the runner calibrates them
        self.k_scale = self.v_scale = 1.0
        quant = cfg.quantization
        self.qkv_proj = make_linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.qkv_bias, quant)
        self.o_proj = make_linear(self.q_size, cfg.hidden_size, False, quant)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, positions, hidden, kv_cache, meta: AttentionMetadata, backend, rotary):
        qkv = self.qkv_proj(hidden)  # hidden: a tensor, or QuantizedRows for an fp8/w8a8 qkv_proj on a GPU
        T = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q.contiguous())
            k = self.k_norm(k.contiguous())
        if rotary.fused is not None and hasattr(backend, "forward_rotary"):  # GPU: one kernel for both
            o = backend.forward_rotary(positions, rotary.cos_sin_cache, q, k, v, kv_cache[0], kv_cache[1], meta,
                                       self.scale, self.k_scale, self.v_scale)
        else:
            q, k = rotary(positions, q, k)
            o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.k_scale, self.v_scale)
        out = self.o_proj(o.reshape(T, self.q_size))
        return out if self.tp is None else self.tp.all_reduce(out)


class MLP(nn.Module):
    QUANT_FEEDS = (("act", "down_proj"),)  # layers/triton_backend.install_fused_ops

    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None):
        super().__init__()
        self.tp = tp
        quant = cfg.quantization
        self.gate_up_proj = make_linear(cfg.hidden_size, 2 * cfg.intermediate_size, False, quant)
        self.down_proj = make_linear(cfg.intermediate_size, cfg.hidden_size, False, quant)
        self.act = silu_and_mul_ref  # the GPU runner swaps in the fused kernel

    def forward(self, x):
        out = self.down_proj(self.act(self.gate_up_proj(x)))
        return out if self.tp is None else self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    QUANT_FEEDS = (("input_layernorm", "self_attn.qkv_proj"), ("post_attention_layernorm", "mlp.gate_up_proj"))

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TensorParallel | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, positions, hidden, residual, kv_cache, meta, backend, rotary):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta, backend, rotary)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    # checkpoint name -> (our fused parameter, shard id)
    stacked_params = [
        ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
    ]

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None, tp: TensorParallel | None = None):
        super().__init__()
        self.tp = tp
        self.shard = None  # tachyon.models.sharding.ShardPlan under tensor parallelism
        if tp is None:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        else:
            self.shard = plan_shards(cfg, tp.rank, tp.size)
            self.full_cfg = cfg
            cfg = self.shard.local_config(cfg)
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp)
        self.cfg = cfg  # this rank's slice of the model (all of it without tensor parallelism)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if self.shard is not None:
            q0, i0 = self.shard.q_heads[0] * cfg.head_dim, self.shard.intermediate[0]
            for layer in self.layers:  # an int8 row shard quantizes whole rows, then keeps its columns
                for proj, a, n in ((layer.self_attn.o_proj, q0, layer.self_attn.q_size),
                                   (layer.mlp.down_proj, i0, cfg.intermediate_size)):
                    if isinstance(proj, (Int8Linear, ScaledLinear)):
                        proj.in_range = (a, a + n)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions or cfg.max_position_embeddings,
                                      cfg.rope_theta, cfg.rope_scaling)

    def finish_init(self, device) -> None:
        """After building on the meta device: real rotary tables (fp32) and the embedding tie."""
        c = self.cfg
        self.rotary = RotaryEmbedding(c.head_dim, self.rotary.cos_sin_cache.shape[0], c.rope_theta,
                                      c.rope_scaling).to(device)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, backend) -> torch.Tensor:
        """Returns the final hidden states [T, hidden]; `compute_logits` turns selected rows into logits."""
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv, meta, backend, self.rotary)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] fp32 logits (under tensor parallelism: on rank 0; the others get their shard's)."""
        return self.lm_head(hidden).float()

    @property
    def logits_size(self) -> int:
        """The width of what compute_logits returns on this rank."""
        return self.cfg.vocab_size if self.tp is None else self.lm_head.logits_size

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names) into the fused parameters; complain about anything missing.
        A quantized layer takes its packed tensors through its own `load` (layers/linear.py). Under tensor
        parallelism a tensor may be a safetensors slice: only this rank's part of it is read."""
        params = dict(self.named_parameters())
        quant_layers = {n: m for n, m in self.named_modules() if isinstance(m, QuantLinear)}
        loaded: set[str] = set()
        c = self.cfg
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        qkv_offsets = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
        inter = c.intermediate_size
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            if name.endswith(("self_attn.k_scale", "self_attn.v_scale")):
                continue  # an fp8 checkpoint's KV-cache scales: --kv-cache-dtype fp8 calibrates its own (kv_scales)
            if name == "lm_head.weight" and c.tie_word_embeddings:
                continue
            if self.shard is not None:
                quant = c.quantization
                tensor = self.shard.read(name, tensor, self.full_cfg, int8_whole_rows=quant is not None
                                         and quant.method in ("int8", "fp8", "w8a8") and quant.checkpoint_format == "dense")
            start = size = shard = None
            target = name
            for fused, part, sh in self.stacked_params:
                if f".{part}." in name:
                    target, shard = name.replace(part, fused), sh
                    start, size = qkv_offsets[sh] if fused == "qkv_proj" else (sh * inter, inter)
                    break
            layer_name, _, kind = target.rpartition(".")
            layer = quant_layers.get(layer_name)
            if layer is not None:
                layer.load(kind, tensor, start or 0, size, name)
                continue
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name} has no place in {c.architecture}"
                                 + (f" ({c.quantization.method}-quantized)" if c.quantization else ""))
            if shard is None:
                copy_checked(param.data, tensor, name)
                loaded.add(name)
            else:
                copy_checked(param.data[start:start + size], tensor, name)
                loaded.add(f"{target}:{shard}")
        expected = set()
        for pname in params:
            if pname.rpartition(".")[0] in quant_layers:
                continue
            if ".qkv_proj." in pname:
                expected |= {f"{pname}:{s}" for s in "qkv"}
            elif ".gate_up_proj." in pname:
                expected |= {f"{pname}:{s}" for s in (0, 1)}
            elif pname == "lm_head.weight" and c.tie_word_embeddings:
                continue
            else:
                expected.add(pname)
        missing = sorted(expected - loaded)
        parts = {"qkv_proj": 3, "gate_up_proj": 2}
        for lname, layer in quant_layers.items():
            gaps = layer.missing()
            n = parts.get(lname.rpartition(".")[2], 1)
            if layer.num_parts < n:
                gaps.append(f"{n - layer.num_parts} of its {n} parts")
            missing += [f"{lname}:{g}" for g in gaps]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}: is it complete?")
