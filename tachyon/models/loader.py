"""Where weights come from: HF safetensors directories (one file or sharded), GGUF files, random ("dummy")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch

from tachyon.config import ModelConfig


def resolve_model_path(model: str | None, revision: str | None = None, download_dir: str | None = None) -> str:
    """None means the embedded default model (converted once from its GGUF and cached); `org/name` that is no
    local path is a Hugging Face Hub id, resolved through huggingface_hub's cache (`tachyon.models.hub`)."""
    if model is None:
        from tachyon.models.embedded import embedded_model_dir

        return embedded_model_dir()
    from tachyon.models.hub import is_hub_id, resolve_hub_model

    if is_hub_id(model):
        return resolve_hub_model(model, revision, download_dir)
    if not os.path.exists(model):
        raise FileNotFoundError(
            f"model path {model!r} does not exist: pass an HF checkpoint directory (config.json + *.safetensors), "
            f"a .gguf file, a Hugging Face Hub id (org/name), or no model for the embedded SmolLM2-135M-Instruct"
        )
    return model


def load_config(path: str) -> ModelConfig:
    if path.endswith(".gguf"):
        from tachyon.models.gguf_loader import gguf_config

        return ModelConfig.from_dict(gguf_config(path))
    if not (os.path.isdir(path) or path.endswith(".json")):
        raise ValueError(f"{path!r} is neither a checkpoint directory, a config.json nor a .gguf file")
    return ModelConfig.from_file(path)


def safetensors_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is malformed ({e!r}); it needs a 'weight_map'") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.exists(os.path.join(path, f))]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are not there: {missing}")
        return [os.path.join(path, f) for f in files]
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}: Tachyon loads safetensors checkpoints or .gguf files")
    return [os.path.join(path, f) for f in files]


def iter_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    yield from _iter_checkpoint(path, lazy=False)


def iter_weight_slices(path: str) -> Iterator[tuple[str, object]]:
    """Like iter_weights, but each safetensors tensor comes as a slice that reads only the part it is indexed by
    (tensor parallelism: a rank reads its shard); a GGUF file's tensors come whole."""
    yield from _iter_checkpoint(path, lazy=True)


def _iter_checkpoint(path: str, lazy: bool) -> Iterator[tuple[str, object]]:
    if path.endswith(".gguf"):
        from tachyon.models.gguf_loader import iter_gguf_tensors

        yield from iter_gguf_tensors(path)
        return
    from safetensors import safe_open

    from tachyon.models.progress import progress

    files = safetensors_files(path)
    for file in progress(files, len(files), "Loading safetensors checkpoint shards", unit="shard"):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_slice(name) if lazy else f.get_tensor(name)
        except Exception as e:  # SafetensorError, OSError on truncated headers
            raise ValueError(f"{file} is not a valid safetensors file ({e}); re-download or re-save it") from None


def random_weights_(model: torch.nn.Module, seed: int = 0) -> None:
    """--load-format dummy: fill every parameter with small random values where it lives (no checkpoint)."""
    from tachyon.layers.linear import QuantLinear

    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    quant = {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    with torch.no_grad():
        for n, m in model.named_modules():
            if n in quant:
                m.random_(gen)  # packed integers and scales that dequantize to the same small range
        for name, p in model.named_parameters():
            if name.rpartition(".")[0] in quant and not name.endswith(".bias"):
                continue
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.uniform_(-0.02, 0.02, generator=gen)
