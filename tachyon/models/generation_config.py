"""A checkpoint's generation_config.json as default sampling values (vLLM's `--generation-config`).

Only the fields that mean the same in SamplingParams are taken; `max_new_tokens` becomes `max_tokens`. A request
(or an explicit SamplingParams) always wins over these defaults.
"""

from __future__ import annotations

import json
import os

# generation_config.json key -> SamplingParams field
_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def default_sampling_values(source: str, model_dir: str | None) -> dict:
    """`source`: "auto" (the file in `model_dir`), "vllm" (no defaults), or a directory holding the file."""
    if source == "vllm":
        return {}
    folder = model_dir if source == "auto" else source
    if source != "auto" and not os.path.isdir(source):
        raise FileNotFoundError(f"--generation-config {source!r}: pass auto, vllm or a directory that holds a "
                                f"generation_config.json")
    path = os.path.join(folder, "generation_config.json") if folder and os.path.isdir(folder) else None
    if path is None or not os.path.exists(path):
        if source != "auto":
            raise FileNotFoundError(f"--generation-config {source!r}: no generation_config.json in it")
        return {}
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    return {name: cfg[key] for key, name in _FIELDS.items() if cfg.get(key) is not None}
