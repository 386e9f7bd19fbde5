"""Linear layers: dense (nn.Linear), weight-quantized (int8 per output channel, AWQ-style int4 in groups), or
8-bit weights and activations (fp8 E4M3 and SmoothQuant-style int8: `ScaledLinear`).

`make_linear` picks the layer from the model's QuantConfig. A quantized layer keeps its packed weights as
integer parameters (see `print(model)`), loads each checkpoint tensor into its slice of a fused projection
(`load`: qkv_proj and gate_up_proj hold several checkpoint layers side by side along the output features),
and computes with the Triton kernels on a GPU (`kernels/quant_linear.py`), the torch reference elsewhere
(`kernels/quant_ref.py`, which also holds the layouts).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from tachyon import envs
from tachyon.config import QuantConfig
from tachyon.kernels.quant_ref import (
    KMAJOR_TILE,
    awq_kmajor_ref,
    awq_linear_ref,
    awq_to_natural,
    int8_linear_ref,
    pack_int4,
    scaled_linear_ref,
    unpack_int4,
)


class QuantizedRows(NamedTuple):
    """A layer's input x [M, K] with its rows already quantized for the `ScaledLinear` that reads it: q [M, K]
    (float8_e4m3fn or int8) and fp32 scales [M], as `kernels.scaled_linear.quantize_rows` makes them. The fused
    RMSNorm and SiLU-and-mul write both on a GPU (`layers/triton_backend.install_fused_ops`), so the linear's
    kernels that quantize first skip that launch; its other kernels read x."""

    x: torch.Tensor
    q: torch.Tensor
    scale: torch.Tensor


def awq_kmajor_wanted(capability: tuple[int, int]) -> bool:
    """Whether the engine repacks AWQ layers K-major for a GPU of this compute capability. Default on Hopper
    (sm_90): there the K-major kernels beat the natural layout's at 1-64 rows (a 70B layer 1.6-2.8x at 16 rows,
    1.04-1.6x at one row with the 2-warp configs; 70B AWQ `single` 65.5 against 60.0 on the H200).
    TACHYON_AWQ_MMA=0 keeps the natural layout, =1 repacks on any card from sm_90 on (tachyon/envs.py)."""
    wanted = envs.flag("TACHYON_AWQ_MMA")
    if wanted is False or capability[0] < 9:
        return False
    return wanted is True or tuple(capability) == (9, 0)


def repack_awq_kmajor(model: nn.Module) -> int:
    """Repack every AWQ layer whose K allows it K-major for kernels/awq_mma.py (`AWQLinear.use_kmajor`); how many."""
    return sum(m.use_kmajor() for m in model.modules() if isinstance(m, AWQLinear))


def make_linear(in_features: int, out_features: int, bias: bool, quant: QuantConfig | None) -> nn.Module:
    if quant is None:
        return nn.Linear(in_features, out_features, bias=bias)
    if quant.method == "int8":
        return Int8Linear(in_features, out_features, bias, quant)
    if quant.method == "fp8":
        return Fp8Linear(in_features, out_features, bias, quant)
    if quant.method == "w8a8":
        return W8A8Linear(in_features, out_features, bias, quant)
    return AWQLinear(in_features, out_features, bias, quant)


# Where a checkpoint tensor's output and input features lie, per format and tensor kind: (output dim, features
# per index along it, input dim, features per index), None where the tensor has no such dim (tensor parallelism
# cuts column-parallel layers along the output features, row-parallel ones along the input features). "G": the
# AWQ group size.
_SHARD_DIMS = {
    "dense": {"weight": (0, 1, 1, 1), "bias": (0, 1, None, 1)},
    "int8": {"qweight": (0, 1, 1, 1), "scales": (0, 1, None, 1), "bias": (0, 1, None, 1)},
    "awq": {"qweight": (1, 8, 0, 1), "qzeros": (1, 8, 0, "G"), "scales": (1, 1, 0, "G"), "bias": (0, 1, None, 1)},
    "compressed-tensors": {"weight_packed": (0, 1, 1, 8), "weight_scale": (0, 1, 1, "G"),
                           "weight_zero_point": (0, 8, 1, "G"), "bias": (0, 1, None, 1)},
    # 8-bit weights (compressed-tensors float-/int-quantized, HF fp8): weight [N, K], weight_scale [N, 1]
    "scaled": {"weight": (0, 1, 1, 1), "weight_scale": (0, 1, None, 1), "input_scale": (None, 1, None, 1),
               "bias": (0, 1, None, 1)},
}


def shard_dims(checkpoint_format: str, kind: str, group_size: int) -> tuple[int | None, int, int | None, int]:
    """(output dim, its features per index, input dim, its features per index) of a checkpoint tensor."""
    dims = _SHARD_DIMS["scaled" if checkpoint_format in SCALED_FORMATS else checkpoint_format].get(kind)
    if dims is None:
        raise ValueError(f"a {checkpoint_format}-format checkpoint tensor {kind!r} cannot be sharded")
    return tuple(group_size if d == "G" else d for d in dims)


SCALED_FORMATS = ("float-quantized", "int-quantized", "fp8")  # QuantConfig.checkpoint_format of 8-bit weights


def _int_param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense [N, K] weight -> (int8 [N, K], fp32 scales [N]): symmetric, absmax / 127 per output feature."""
    w = w.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


FP8_MAX = 448.0  # E4M3's largest finite value


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense [N, K] weight -> (float8_e4m3fn [N, K], fp32 scales [N]): absmax / 448 per output feature."""
    w = w.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    return (w / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scales


class QuantLinear(nn.Module):
    """What both quantized layers share: the part bookkeeping of `load`, bias, and the reshape of forward."""

    TENSORS: dict[str, tuple[str, ...]]  # checkpoint format -> the tensors one part needs

    def __init__(self, in_features: int, out_features: int, bias: bool, quant: QuantConfig):
        super().__init__()
        self.in_features, self.out_features, self.quant = in_features, out_features, quant
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._loaded: set[tuple[int, str]] = set()
        self._parts: set[tuple[int, int]] = set()

    def load(self, kind: str, tensor: torch.Tensor, start: int = 0, size: int | None = None,
             name: str = "") -> None:
        """Put checkpoint tensor `kind` (qweight, scales, weight_packed, weight, bias, ...) of the part covering
        output features [start, start + size) in place. `name` is the checkpoint name, for error messages."""
        size = self.out_features if size is None else size
        if kind == "bias":
            if self.bias is None:
                raise ValueError(f"checkpoint tensor {name} is a bias this layer does not have")
            copy_checked(self.bias.data[start:start + size], tensor, name)
        else:
            fmt = self.quant.checkpoint_format
            if kind not in self.TENSORS[fmt]:
                raise ValueError(f"checkpoint tensor {name}: the layers of a {fmt}-format {self.quant.method} "
                                 f"checkpoint hold {', '.join(self.TENSORS[fmt])}, not {kind!r}")
            self._load(kind, tensor, start, size, name)
        self._loaded.add((start, kind))
        self._parts.add((start, size))

    @property
    def num_parts(self) -> int:
        """Checkpoint layers loaded into this one so far (3 for a complete qkv_proj)."""
        return len(self._parts)

    def missing(self) -> list[str]:
        """What the checkpoint did not give, per part (empty once complete)."""
        need = self.TENSORS[self.quant.checkpoint_format] + (("bias",) if self.bias is not None else ())
        starts = sorted({s for s, _ in self._parts}) or [0]
        return [f"{kind}@{s}" for s in starts for kind in need if (s, kind) not in self._loaded]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        y = self._matmul(x2)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{self.quant.method}" + (f", group_size={self.quant.group_size}" if self.quant.method == "awq" else "")
                + (", static input scale" if self.quant.static_input else ""))


class Int8Linear(QuantLinear):
    """y = x @ (qweight * scales[:, None]).T + bias; qweight int8 [N, K], scales [N] in the model dtype."""

    TENSORS = {"int8": ("qweight", "scales"), "dense": ("weight",)}

    def __init__(self, in_features: int, out_features: int, bias: bool, quant: QuantConfig):
        super().__init__(in_features, out_features, bias, quant)
        self.qweight = _int_param(out_features, in_features, dtype=torch.int8)
        self.scales = nn.Parameter(torch.empty(out_features), requires_grad=False)
        # a row-parallel shard (tensor parallelism): the input features [a, b) of the whole layer it holds
        self.in_range: tuple[int, int] | None = None

    def _load(self, kind, tensor, start, size, name):
        if kind == "weight" and self.in_range is not None and tensor.shape[-1] != self.in_features:
            q, s = quantize_int8(tensor)  # the whole rows: each scale is its row's, as unsharded
            a, b = self.in_range
            copy_checked(self.qweight.data[start:start + size], q[:, a:b], name)
            self.scales.data[start:start + size].copy_(s)
            self._loaded.update({(start, "qweight"), (start, "scales")})
        elif kind == "weight":  # a dense checkpoint, quantized here
            if tuple(tensor.shape) != (size, self.in_features):
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, the config expects "
                                 f"{(size, self.in_features)}")
            q, s = quantize_int8(tensor)
            self.qweight.data[start:start + size].copy_(q)
            self.scales.data[start:start + size].copy_(s)
            self._loaded.update({(start, "qweight"), (start, "scales")})
        elif kind == "qweight":
            copy_checked(self.qweight.data[start:start + size], tensor, name)
        else:
            copy_checked(self.scales.data[start:start + size], tensor.reshape(-1), name)

    def random_(self, gen: torch.Generator) -> None:
        self.qweight.data.copy_(torch.randint(-127, 128, self.qweight.shape, generator=gen,
                                              device=self.qweight.device, dtype=torch.int32))
        self.scales.data.fill_(0.02 / 127)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from tachyon.kernels.quant_linear import int8_linear

            return int8_linear(x, self.qweight, self.scales, self.bias)
        return int8_linear_ref(x, self.qweight, self.scales, self.bias)


class AWQLinear(QuantLinear):
    """W4A16 in groups of G input features: qweight int32 [K, N // 8], qzeros int32 [K // G, N // 8] (natural
    nibble order, `kernels/quant_ref.py`), scales [K // G, N] in the model dtype. After loading, `use_kmajor`
    may repack qweight K-major ([K // 8, N]) for the tensor-core kernels (`kernels/awq_mma.py`)."""

    kmajor = False

    TENSORS = {"awq": ("qweight", "qzeros", "scales"),
               "compressed-tensors": ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"),
               "dense": ("weight",)}

    def __init__(self, in_features: int, out_features: int, bias: bool, quant: QuantConfig):
        super().__init__(in_features, out_features, bias, quant)
        G = quant.group_size
        if in_features % G or out_features % 8:
            raise ValueError(f"a {in_features} -> {out_features} linear cannot be AWQ-quantized with group size {G}: "
                             f"in_features must be a multiple of it and out_features of 8")
        if quant.checkpoint_format == "compressed-tensors" and quant.symmetric:
            self.TENSORS = {"compressed-tensors": ("weight_packed", "weight_scale", "weight_shape")}
        self.qweight = _int_param(in_features, out_features // 8, dtype=torch.int32)
        self.qzeros = _int_param(in_features // G, out_features // 8, dtype=torch.int32)
        self.scales = nn.Parameter(torch.empty(in_features // G, out_features), requires_grad=False)

    def _load(self, kind, tensor, start, size, name):
        if self.kmajor:
            raise RuntimeError(f"checkpoint tensor {name}: this layer's qweight was repacked K-major; load before "
                               f"use_kmajor")
        if start % 8 or size % 8:
            raise ValueError(f"checkpoint tensor {name}: a part of {size} output features at {start} does not "
                             f"fall on the 8-feature words of an int4 layer")
        p0, p1 = start // 8, (start + size) // 8
        if kind == "weight":
            raise ValueError(f"checkpoint tensor {name} is dense: --quantization awq needs an AWQ checkpoint (make "
                             f"one with `tachyon quantize --method awq`), or run it with --quantization int8")
        if kind == "qweight":  # AutoAWQ: [K, N/8] interleaved
            copy_checked(self.qweight.data[:, p0:p1], awq_to_natural(tensor.to(torch.int32)), name)
        elif kind == "qzeros":
            copy_checked(self.qzeros.data[:, p0:p1], awq_to_natural(tensor.to(torch.int32)), name)
        elif kind == "scales":
            copy_checked(self.scales.data[:, start:start + size], tensor, name)
        elif kind == "weight_packed":  # compressed-tensors: [N, K/8] packed along K, values + 8
            copy_checked(self.qweight.data[:, p0:p1], pack_int4(unpack_int4(tensor.to(torch.int32)).T.contiguous()), name)
            if self.quant.symmetric:  # no zero points stored: the + 8 offset is the zero
                self.qzeros.data[:, p0:p1] = pack_int4(torch.full((self.qzeros.shape[0], size), 8, dtype=torch.int32))
        elif kind == "weight_scale":  # [N, K/G]
            copy_checked(self.scales.data[:, start:start + size], tensor.T, name)
        elif kind == "weight_zero_point":  # [N/8, K/G] packed along N: transposed, our layout
            copy_checked(self.qzeros.data[:, p0:p1], tensor.to(torch.int32).T, name)
        elif kind == "weight_shape":
            if [int(v) for v in tensor.reshape(-1)] != [size, self.in_features]:
                raise ValueError(f"checkpoint tensor {name} says {tensor.tolist()}, the config expects "
                                 f"{[size, self.in_features]}")

    def random_(self, gen: torch.Generator) -> None:
        dev = self.qweight.device
        self.qweight.data.copy_(torch.randint(-2 ** 31, 2 ** 31 - 1, self.qweight.shape, generator=gen, device=dev,
                                              dtype=torch.int64).to(torch.int32))
        self.qzeros.data.copy_(pack_int4(torch.full((self.qzeros.shape[0], self.out_features), 8, dtype=torch.int32,
                                                    device=dev)))
        self.scales.data.fill_(0.02 / 8)

    def use_kmajor(self) -> bool:
        """Repack qweight K-major (same bytes) so that forward runs kernels/awq_mma.py; False (nothing done) where K
        is not a multiple of 128."""
        if not self.kmajor and self.in_features % KMAJOR_TILE == 0:
            from tachyon.kernels.quant_ref import pack_int4_kmajor

            self.qweight = nn.Parameter(pack_int4_kmajor(self.qweight.data), requires_grad=False)
            self.kmajor = True
        return self.kmajor

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        G = self.quant.group_size
        if self.kmajor:
            if x.is_cuda:
                from tachyon.kernels.quant_linear import awq_kmajor_linear

                return awq_kmajor_linear(x, self.qweight, self.qzeros, self.scales, G, self.bias)
            return awq_kmajor_ref(x, self.qweight, self.qzeros, self.scales, G, self.bias)
        if x.is_cuda:
            from tachyon.kernels.quant_linear import awq_linear

            return awq_linear(x, self.qweight, self.qzeros, self.scales, G, self.bias)
        return awq_linear_ref(x, self.qweight, self.qzeros, self.scales, G, self.bias)


class ScaledLinear(QuantLinear):
    """8-bit weights and activations: weight [N, K] (float8_e4m3fn or int8), weight_scale float32 [N]; every row
    of x quantized with its own scale, or with the checkpoint's static input_scale (`kernels/quant_ref.py` has the
    math). On a GPU `kernels/scaled_linear.py` runs it (a row walk for decode, cuBLAS on tensor cores above).

    A checkpoint's per-tensor scales become per-output-feature ones (the same values repeated), so the parts of a
    fused qkv_proj or gate_up_proj keep their own; their static input scales, which quantize one shared input,
    merge into the largest (what every part's range covers). The scales and the 8-bit weight keep their dtypes
    when the model is cast to its dtype."""

    QTYPE: torch.dtype
    TENSORS = {"float-quantized": ("weight", "weight_scale"), "int-quantized": ("weight", "weight_scale"),
               "fp8": ("weight", "weight_scale"), "dense": ("weight",)}

    def __init__(self, in_features: int, out_features: int, bias: bool, quant: QuantConfig):
        super().__init__(in_features, out_features, bias, quant)
        if quant.static_input:
            self.TENSORS = {fmt: kinds + ("input_scale",) for fmt, kinds in self.TENSORS.items() if fmt != "dense"}
        self.weight = _int_param(out_features, in_features, dtype=self.QTYPE)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
        self.input_scale = (nn.Parameter(torch.zeros(1, dtype=torch.float32), requires_grad=False)
                            if quant.static_input else None)
        self.in_range: tuple[int, int] | None = None  # a row-parallel shard: as Int8Linear's

    def _apply(self, fn, recurse=True):
        kept = {name: p.dtype for name, p in self.named_parameters(recurse=False) if name != "bias"}
        super()._apply(fn, recurse)
        for name, dtype in kept.items():  # .to(model dtype) must not touch the 8-bit weight and fp32 scales
            p = getattr(self, name)
            if p.dtype != dtype:
                p.data = p.data.to(dtype)
        return self

    def _load(self, kind, tensor, start, size, name):
        rows = slice(start, start + size)
        if kind == "weight" and (tensor.is_floating_point() and tensor.dtype != torch.float8_e4m3fn):
            # a dense checkpoint, quantized here (a row-parallel shard quantizes whole rows, as unsharded)
            whole_rows = self.in_range is not None and tensor.shape[-1] != self.in_features
            if not whole_rows and tuple(tensor.shape) != (size, self.in_features):
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, the config expects "
                                 f"{(size, self.in_features)}")
            q, s = (quantize_fp8 if self.QTYPE == torch.float8_e4m3fn else quantize_int8)(tensor)
            if whole_rows:
                q = q[:, self.in_range[0]:self.in_range[1]]
            copy_checked(self.weight.data[rows], q, name)
            self.weight_scale.data[rows] = s
            self._loaded.update({(start, "weight"), (start, "weight_scale")})
        elif kind == "weight":
            if tensor.dtype != self.QTYPE:
                raise ValueError(f"checkpoint tensor {name} is {tensor.dtype}: a {self.quant.method} layer takes "
                                 f"{self.QTYPE} weights")
            copy_checked(self.weight.data[rows], tensor, name)
        elif kind == "weight_scale":
            if tensor.numel() == 1:  # per tensor
                self.weight_scale.data[rows] = tensor.float().reshape(())
            else:
                copy_checked(self.weight_scale.data[rows], tensor.float().reshape(-1), name)
        else:  # input_scale
            if tensor.numel() != 1:
                raise ValueError(f"checkpoint tensor {name} has {tensor.numel()} values: a static input scale is "
                                 f"one (per tensor)")
            v = tensor.float().reshape(1)
            first = not any(k == "input_scale" for _, k in self._loaded)  # the parameter holds no value before
            self.input_scale.data.copy_(v if first else torch.maximum(self.input_scale.data, v))

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        if not isinstance(x, QuantizedRows):
            return super().forward(x)
        y = self._matmul(x.x.reshape(-1, self.in_features), (x.q, x.scale))
        return y.reshape(*x.x.shape[:-1], self.out_features)

    def _matmul(self, x: torch.Tensor, pre: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if x.is_cuda:
            from tachyon.kernels.scaled_linear import scaled_linear

            return scaled_linear(x, self.weight, self.weight_scale, self.bias, self.input_scale, pre=pre)
        return scaled_linear_ref(x, self.weight, self.weight_scale, self.bias, self.input_scale)

    def input_quantization(self) -> tuple[torch.dtype, torch.Tensor | None]:
        """How this layer quantizes its input rows: (8-bit dtype, the static input scale or None), what a
        producer that writes `QuantizedRows` for it must use."""
        return self.weight.dtype, self.input_scale


class Fp8Linear(ScaledLinear):
    """fp8: E4M3 weights and activations (Hopper's tensor cores), a float32 scale per output feature."""

    QTYPE = torch.float8_e4m3fn

    def random_(self, gen: torch.Generator) -> None:
        dev = self.weight.device
        self.weight.data.copy_((torch.rand(self.weight.shape, generator=gen, device=dev) * 2 - 1) * 448)
        self.weight_scale.data.fill_(0.02 / 448)
        if self.input_scale is not None:
            self.input_scale.data.fill_(1.0 / 448)


class W8A8Linear(ScaledLinear):
    """w8a8: int8 weights and activations (SmoothQuant: the smoothing lives in the checkpoint's norms)."""

    QTYPE = torch.int8

    def random_(self, gen: torch.Generator) -> None:
        self.weight.data.copy_(torch.randint(-127, 128, self.weight.shape, generator=gen, device=self.weight.device,
                                             dtype=torch.int32))
        self.weight_scale.data.fill_(0.02 / 127)
        if self.input_scale is not None:
            self.input_scale.data.fill_(1.0 / 127)


def copy_checked(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"checkpoint tensor {name} has shape {tuple(src.shape)}, the config expects {tuple(dst.shape)}")
    dst.copy_(src)
