"""The newcomer's commands: `tachyon generate` and `tachyon chat` on the embedded model."""

from __future__ import annotations

import io
import subprocess
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


def test_gateway_starts_without_the_engine(tmp_path):
    """`tachyon gateway` runs no model: parsing its flags and building its app import neither torch nor the
    engine, so a gateway host needs neither (and starts in a fraction of the time)."""
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text('{"pools": {"p": {"backends": [{"url": "http://127.0.0.1:9"}]}}, "routes": [{"model": "m", "pool": "p"}]}')
    code = (
        "import sys\n"
        "from tachyon.cli import _gateway_parser\n"
        "from tachyon.gateway.app import create_gateway_app\n"
        "from tachyon.gateway.config import load_config\n"
        f"args = _gateway_parser().parse_args(['--config', {str(cfg)!r}, '--port', '0'])\n"
        "create_gateway_app(load_config(args.config))\n"
        "print(sorted(m for m in ('torch', 'tachyon.llm', 'tachyon.engine_args') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    from tachyon import LLM  # the package's names still load on first use
    assert LLM.__name__ == "LLM"
