"""Model names as vLLM takes them: a local path, or a Hugging Face Hub id (`org/name`) resolved through
huggingface_hub's cache.

A Hub id is downloaded once into the cache (`--download-dir`, else huggingface_hub's own: $HF_HOME/hub) at
`--revision`; later starts read the cache. With HF_HUB_OFFLINE=1 (huggingface_hub's own switch) nothing is
fetched: the cached snapshot is used, or the error says it is not cached.
"""

from __future__ import annotations

import functools
import os
import re

# What the engine reads of a checkpoint: config, weights, tokenizer, chat template, generation defaults.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(name: str) -> bool:
    """`org/name` that is not a path on this machine."""
    return bool(_HUB_ID.match(name)) and not os.path.exists(name)


@functools.lru_cache(maxsize=16)  # one look-up per start, though config, weights and tokenizer ask
def resolve_hub_model(name: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """The local snapshot directory of Hub model `name` (downloaded if it is not cached and the Hub is reachable)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return snapshot_download(name, revision=revision, cache_dir=download_dir, allow_patterns=CHECKPOINT_FILES)
    except LocalEntryNotFoundError:
        where = download_dir or constants.HF_HUB_CACHE
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
        raise FileNotFoundError(
            f"the Hub model {name!r} at revision {revision or 'main'} is not in the cache {where} and cannot be "
            f"downloaded{offline}: download it once while online, or pass a local checkpoint directory") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{name!r} is neither a local path nor a model on the Hugging Face Hub (or it "
                                f"is gated: log in with `hf auth login`)") from None
    except HfHubHTTPError as e:
        raise FileNotFoundError(f"the Hub model {name!r} could not be downloaded: {e}") from None
