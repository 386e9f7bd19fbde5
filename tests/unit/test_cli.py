"""The newcomer's commands: `tachyon generate` and `tachyon chat` on the embedded model."""

from __future__ import annotations

import io
import sys

from tachyon.cli import main


def test_generate_streams_the_completion(capsys):
    assert main(["generate", "The capital of France is", "--max-tokens", "6", "--swap-space", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The capital of France is") and "Paris" in out


def test_chat_answers_and_exits(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the capital of France?\n/exit\n"))
    assert main(["chat", "--temperature", "0", "--max-tokens", "12", "--swap-space", "0"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_bad_model_path_is_a_clear_error(capsys):
    assert main(["generate", "hi", "--model", "/no/such/model"]) == 2
    assert "does not exist" in capsys.readouterr().err
