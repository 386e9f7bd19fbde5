"""The environment switches (tachyon/envs.py): 0, 1 or unset, checked before an engine starts."""

from __future__ import annotations

import pytest

from tachyon import LLM, envs


def test_a_switch_reads_0_1_or_its_default(monkeypatch):
    monkeypatch.delenv("TACHYON_FINE_BUCKETS", raising=False)
    assert envs.flag("TACHYON_FINE_BUCKETS") is True
    monkeypatch.setenv("TACHYON_FINE_BUCKETS", "0")
    assert envs.flag("TACHYON_FINE_BUCKETS") is False
    monkeypatch.setenv("TACHYON_GEMV_SPLIT", "")
    assert envs.flag("TACHYON_GEMV_SPLIT") is False
    monkeypatch.setenv("TACHYON_GEMV_SPLIT", "1")
    assert envs.flag("TACHYON_GEMV_SPLIT") is True
    monkeypatch.delenv("TACHYON_AWQ_MMA", raising=False)
    assert envs.flag("TACHYON_AWQ_MMA") is None  # the hardware decides


def test_a_bad_value_stops_the_engine_start_with_the_names(monkeypatch, tmp_path):
    from tests.conftest import make_tiny_checkpoint

    make_tiny_checkpoint("llama", str(tmp_path))
    monkeypatch.setenv("TACHYON_SPLIT_FINISH", "yes")
    monkeypatch.setenv("TACHYON_FUSED_QUANT", "true")
    with pytest.raises(ValueError) as e:
        LLM(model=str(tmp_path), dtype="float32", num_kv_blocks=16, block_size=16, swap_space=0)
    assert str(e.value) == ("TACHYON_SPLIT_FINISH must be 0 or 1, got 'yes' (" + envs.FLAGS["TACHYON_SPLIT_FINISH"][1]
                            + "); TACHYON_FUSED_QUANT must be 0 or 1, got 'true' ("
                            + envs.FLAGS["TACHYON_FUSED_QUANT"][1] + ")")
    monkeypatch.setenv("TACHYON_SPLIT_FINISH", "1")
    monkeypatch.setenv("TACHYON_FUSED_QUANT", "0")
    envs.check()  # no error
