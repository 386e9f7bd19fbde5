"""N-gram prompt lookup: proposals for speculative decoding read from the sequence's own tokens, no model.

The longest suffix of the tokens (at most `max_n`, at least `min_n` long) that also occurs earlier in them
proposes the tokens that followed its latest earlier occurrence:

    tokens:   ... the cat sat on the mat . the cat | ?
    suffix "the cat" (n = 2) occurred earlier ─► propose "sat on the mat" (up to k tokens)

Copying work (quoting, rewriting, code edits) repeats long spans of the prompt, so the target accepts most of
them; free-form text rarely has a match of min_n tokens, and then nothing is proposed (a plain decode).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def ngram_lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens following the latest earlier occurrence of the longest matching suffix (none: [])."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        # windows starting at 0 .. L-n-1: each is followed by at least one token (the suffix itself is excluded)
        windows = sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[L - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer:
    """tachyon.interface.Proposer by prompt lookup on the host."""

    needs_slots = False  # writes no KV: the scheduler asks before allocating, so only proposed tokens get slots

    def __init__(self, min_n: int, max_n: int):
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, seqs: list, max_tokens: list[int]) -> list[list[int]]:
        return [ngram_lookup(np.asarray(s.token_ids, dtype=np.int64), self.min_n, self.max_n, k) if k > 0 else []
                for s, k in zip(seqs, max_tokens, strict=True)]
