"""Incremental detokenization emits valid UTF-8 only; stop strings cut the text."""

from __future__ import annotations

from tachyon import SamplingParams
from tachyon.engine.detokenizer import IncrementalDetokenizer


def test_incremental_text_equals_full_decode_and_never_splits_characters(llm):
    tok = llm.get_tokenizer()
    text = "Grüße aus Köln! 日本語のテキスト 🚀🔥 naïve café — «quotes»"
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, [1, 2, 3])
    pieces = [d.add_token(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)
    # multi-byte emoji span several byte-level tokens: some steps must emit nothing
    assert any(p == "" for p in pieces)


def test_stop_string_cuts_text(llm):
    base = llm.generate("Count: 1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    text = base.outputs[0].text
    assert " 7" in text, text
    stop = " 7"
    out = llm.generate("Count: 1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=24, stop=stop,
                                                            ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    kept = llm.generate("Count: 1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=24, stop=[stop, "zzz"],
                                                             include_stop_str_in_output=True, ignore_eos=True))[0]
    assert kept.outputs[0].text == text[: text.index(stop) + len(stop)]


def test_stop_token_ids(llm):
    base = llm.generate("Count: 1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    ids = base.outputs[0].token_ids
    out = llm.generate("Count: 1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[ids[3]],
                                                            ignore_eos=True))[0].outputs[0]
    first = ids.index(ids[3])
    assert out.token_ids == ids[: first + 1] and out.finish_reason == "stop" and out.stop_reason == ids[3]


def test_streamed_text_holds_back_partial_stop_strings():
    class Tok:
        def decode(self, ids, **kw):
            return "".join(chr(96 + i) for i in ids)

    d = IncrementalDetokenizer(Tok(), [], stop=["xyz"])
    for t in [1, 2, 24]:  # a b x
        d.add_token(t)
    assert d.safe_text(finished=False) == "a"  # "bx" could still grow into a stop string? only 2 chars held
    assert d.safe_text(finished=True) == "abx"
