"""The model's own tokenizer (and chat template), loaded through transformers."""

from __future__ import annotations

import os


def load_tokenizer(path: str | None, trust_remote_code: bool = False):
    """The tokenizer in checkpoint directory `path`; None if there is no path or the directory has none."""
    if path is None:
        return None
    if not (os.path.isdir(path) and any(f.startswith("tokenizer") for f in os.listdir(path))):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
