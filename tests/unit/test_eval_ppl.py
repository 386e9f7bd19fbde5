"""`tachyon eval ppl`: the held-out text, the packed-prefill metadata, and perplexity against transformers' own
loss on a tiny random Llama (which carries the embedded model's tokenizer, so text works end to end)."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from tachyon.cli import main
from tachyon.engine_args import EngineArgs
from tachyon.eval.ppl import (
    HELDOUT_EVERY,
    heldout_text,
    load_model,
    perplexity,
    prefill_metadata,
    text_split,
    topics_text,
)


def make_tiny_with_tokenizer(path: str, tokenizer_dir: str, num_kv_heads: int = 2, seed: int = 0):
    """A 2-layer random Llama with the embedded model's vocabulary and tokenizer; hidden 128 (two groups of 64
    input features, one of 128). Returns the transformers model."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=num_kv_heads,
                                   max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=2,
                                   bos_token_id=1, initializer_range=0.05)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    for f in os.listdir(tokenizer_dir):
        if f.startswith(("tokenizer", "chat_template")):
            shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(path, f))
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, embedded_dir):
    path = str(tmp_path_factory.mktemp("tiny_llama"))
    return path, make_tiny_with_tokenizer(path, embedded_dir)


def test_calibration_and_heldout_topics_are_disjoint():
    from pydoc_data.topics import topics

    cal, held = text_split()
    assert cal and held and not set(cal) & set(held)
    assert sorted(cal + held) == sorted(topics)
    assert len(held) == len(topics) // HELDOUT_EVERY
    assert heldout_text() == topics_text(held)


def test_prefill_metadata_lays_sequences_end_to_end_in_their_own_blocks():
    meta, nblocks = prefill_metadata([5, 20], block_size=16, device="cpu")
    assert nblocks == 3
    assert meta.slot_mapping.tolist() == list(range(5)) + list(range(16, 36))
    assert meta.block_tables.tolist() == [[0, 0], [1, 2]]
    assert meta.query_start_loc.tolist() == [0, 5, 25] and meta.seq_lens.tolist() == [5, 20]
    assert meta.num_decodes == 0 and meta.max_query_len == meta.max_seq_len == 20


def test_perplexity_matches_transformers_loss(tiny):
    path, hf = tiny
    lm = load_model(EngineArgs(model=path, dtype="float32"))
    ids = lm.tokenizer.encode(heldout_text(), add_special_tokens=False)[:700]
    r = perplexity(lm, ids, seq_len=256)
    assert (r.num_windows, r.num_tokens) == (3, 255 + 255 + 187)
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(ids), 256):
            w = torch.tensor([ids[i:i + 256]])
            total += hf(w, labels=w).loss.item() * (w.shape[1] - 1)  # HF's loss: mean over the shifted tokens
    assert r.ppl == pytest.approx(math.exp(total / r.num_tokens), rel=1e-4)


def test_last_window_of_one_token_is_not_scored(tiny):
    path, _ = tiny
    lm = load_model(EngineArgs(model=path, dtype="float32"))
    r = perplexity(lm, list(range(100, 100 + 65)), seq_len=32)
    assert (r.num_windows, r.num_tokens) == (2, 62)
    with pytest.raises(ValueError, match="at least 2"):
        perplexity(lm, [5], seq_len=32)


def test_int8_is_within_one_percent_and_quantized_ppl_is_finite(tiny, tmp_path):
    path, _ = tiny
    dense_lm = load_model(EngineArgs(model=path, dtype="float32"))
    ids = dense_lm.tokenizer.encode(heldout_text(), add_special_tokens=False)[:1024]
    dense = perplexity(dense_lm, ids, 512)
    int8 = perplexity(load_model(EngineArgs(model=path, dtype="float32", quantization="int8")), ids, 512)
    out = str(tmp_path / "awq")
    assert main(["quantize", "--model", path, "--method", "awq", "--group-size", "64", "--no-search", "--out", out,
                 "--no-eval"]) == 0
    awq = perplexity(load_model(EngineArgs(model=out, dtype="float32")), ids, 512)
    assert all(math.isfinite(r.ppl) and r.ppl > 1 for r in (dense, int8, awq))
    assert abs(int8.ppl / dense.ppl - 1) < 0.01
    assert awq.ppl != dense.ppl  # the int4 layers ran


def test_eval_cli_prints_one_json_object(tiny, capsys):
    path, _ = tiny
    assert main(["eval", "ppl", "--model", path, "--max-tokens", "300", "--seq-len", "150", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["num_tokens"] == 298 and r["num_windows"] == 2 and math.isfinite(r["ppl"])
    assert "pydoc_data.topics" in r["text"]


def test_eval_cli_errors(tiny, capsys):
    path, _ = tiny
    assert main(["eval", "ppl", "--model", path, "--seq-len", "1"]) == 2
    assert "at least 2 tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["eval"])
    assert e.value.code == 2
