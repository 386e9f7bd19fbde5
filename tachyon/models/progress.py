"""Progress bars for the slow parts of a start (converting a GGUF file once, reading the weights), as vLLM shows
them: on stderr, through tqdm when it is installed (it comes with huggingface_hub), else nothing."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], total: int, desc: str, unit: str = "it") -> Iterator[T]:
    try:
        from tqdm import tqdm
    except ImportError:
        yield from items
        return
    with tqdm(items, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True) as bar:
        yield from bar
