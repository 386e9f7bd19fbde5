"""The GGUF conversion cache when two processes convert the same file at once (two servers' first starts, the
test suite's parallel workers): the directory that landed first stays, in use, and the later one is dropped.
The conversion's own steps are stand-ins here; the real conversion is covered by every test of the embedded model."""

from __future__ import annotations

import os

import pytest

from tachyon.models import gguf_loader


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("TACHYON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_loader, "_reader", lambda path: type("R", (), {"tensors": [1]})())
    monkeypatch.setattr(gguf_loader, "gguf_config", lambda path, reader: {"model_type": "llama"})
    monkeypatch.setattr(gguf_loader, "iter_gguf_tensors", lambda path, reader: iter([]))

    class Tok:
        def save_pretrained(self, d):
            open(os.path.join(d, "tokenizer.json"), "w").close()

    import transformers
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tok())
    return str(gguf)


def test_a_conversion_that_lands_second_keeps_the_first(fake_conversion, monkeypatch):
    real_mkdtemp = gguf_loader.tempfile.mkdtemp
    winner = {}

    def mkdtemp_then_other_process_finishes(**kw):
        tmp = real_mkdtemp(**kw)
        # the other process: its whole conversion lands while ours runs
        monkeypatch.setattr(gguf_loader.tempfile, "mkdtemp", real_mkdtemp)
        out = gguf_loader.converted_dir(fake_conversion)
        open(os.path.join(out, "IN-USE"), "w").close()
        winner["out"] = out
        return tmp

    monkeypatch.setattr(gguf_loader.tempfile, "mkdtemp", mkdtemp_then_other_process_finishes)
    out = gguf_loader.converted_dir(fake_conversion)
    assert out == winner["out"]
    assert sorted(os.listdir(out)) == ["DONE", "IN-USE", "SOURCE", "config.json", "model.safetensors",
                                       "tokenizer.json"]
    assert [n for n in os.listdir(os.path.dirname(out)) if n.startswith(".convert-")] == []


def test_a_leftover_without_done_is_replaced(fake_conversion):
    first = gguf_loader.converted_dir(fake_conversion)
    os.remove(os.path.join(first, "DONE"))  # a conversion killed before it finished (or an old layout)
    open(os.path.join(first, "STALE"), "w").close()
    again = gguf_loader.converted_dir(fake_conversion)
    assert again == first
    assert "STALE" not in os.listdir(again) and "DONE" in os.listdir(again)
