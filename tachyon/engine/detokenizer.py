"""Incremental detokenization that only ever emits valid UTF-8 text, and stop-string handling.

Token pieces can split a multi-byte character (the decoder then yields U+FFFD) or change how the previous
token renders (leading spaces). So each step decodes a short window ending at the new token and emits only
what extends the text already emitted, and only once it no longer ends in a replacement character.
"""

from __future__ import annotations

_WINDOW = 6  # tokens of context kept before the first undelivered token


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 stop: list[str] | None = None, include_stop: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.stop = stop or []
        self.include_stop = include_stop
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        # a fast (Rust) tokenizer decodes directly: transformers' wrapper costs 4x the decode itself, twice per
        # token per sequence, and does nothing more here (no clean-up of spaces)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:  # a model run without a tokenizer (random weights): token ids only
            return ""
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=self.skip_special)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special,
                                     clean_up_tokenization_spaces=False)

    def add_token(self, token_id: int) -> str:
        """Append one token; return the newly completed text (may be empty)."""
        if self.tokenizer is None:  # token ids only: there is no text to build
            return ""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            if self.prefix_offset > _WINDOW:  # keep the window short
                drop = self.prefix_offset - _WINDOW
                self.ids = self.ids[drop:]
                self.prefix_offset -= drop
                self.read_offset -= drop
            self.text += new
            return new
        return ""

    def find_stop(self, num_new_chars: int) -> str | None:
        """Check the tail of the text for a stop string; on a hit, cut the text and return the string."""
        if not self.stop or num_new_chars == 0:
            return None
        search_from = max(0, len(self.text) - num_new_chars - self.max_stop_len + 1)
        best = None
        for s in self.stop:
            i = self.text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
        return s

    def safe_text(self, finished: bool) -> str:
        """Text that can be streamed: while running, hold back what could be the start of a stop string."""
        if finished or self.max_stop_len <= 1 or self.include_stop:
            return self.text
        return self.text[: max(0, len(self.text) - (self.max_stop_len - 1))]
