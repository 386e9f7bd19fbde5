"""EngineArgs is the one place an engine knob is written: every command's flags and the configs come from it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from tachyon.cli import build_parser
from tachyon.config import ModelConfig
from tachyon.engine_args import EngineArgs

ENGINE_COMMANDS = [["generate", "hi"], ["chat"], ["serve"]] + [
    ["bench", c] for c in ("latency", "throughput", "serve", "sweep", "ladder")]


def test_every_knob_has_help_text():
    for f in dataclasses.fields(EngineArgs):
        assert f.metadata.get("help"), f"EngineArgs.{f.name} has no help text"


@pytest.mark.parametrize("argv", ENGINE_COMMANDS, ids=" ".join)
def test_every_engine_command_has_every_knob_with_its_default(argv):
    got = EngineArgs.from_cli_args(build_parser().parse_args(argv))
    want = EngineArgs()
    if argv[0] == "bench":  # bench: the prefix cache follows the workload unless a flag says otherwise
        want.enable_prefix_caching = None
    assert got == want


def test_flags_parse_to_their_fields():
    args = EngineArgs.from_cli_args(build_parser().parse_args([
        "serve", "--enforce-eager", "--no-enable-prefix-caching", "--num-scheduler-steps", "4", "--swap-space", "0",
        "--num-kv-blocks", "64", "--load-format", "dummy", "--max-n", "2", "--dtype", "bf16"]))
    assert args == EngineArgs(enforce_eager=True, enable_prefix_caching=False, num_scheduler_steps=4, swap_space=0.0,
                              num_kv_blocks=64, load_format="dummy", max_n=2, dtype="bf16")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--attention-backend", "flash"])  # choices come from the field


def test_bad_values_are_refused_when_the_args_are_made():
    with pytest.raises(ValueError, match="max_n=0"):
        EngineArgs(max_n=0)
    with pytest.raises(ValueError, match="max_logprobs=-1"):
        EngineArgs(max_logprobs=-1)


MODEL = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "vocab_size": 128, "intermediate_size": 128,
                               "max_position_embeddings": 512})


def test_the_configs_resolve_every_auto_knob():
    model = MODEL
    cpu = EngineArgs().create_engine_config(model, torch.device("cpu"))
    assert (cpu.attention_backend, cpu.dtype, cpu.enable_pdl) == ("torch", torch.float32, False)
    assert (cpu.scheduler.max_num_batched_tokens, cpu.scheduler.num_scheduler_steps) == (2048, 1)
    assert cpu.scheduler.max_model_len == model.max_position_embeddings
    assert (cpu.cache.kv_cache_bytes, cpu.cache.swap_space_gib) == (1 << 30, 4.0)
    gpu = EngineArgs(max_model_len=64).create_engine_config(model, torch.device("cuda"))  # nothing runs on it
    assert (gpu.attention_backend, gpu.dtype, gpu.enable_pdl) == ("triton", torch.bfloat16, True)
    assert (gpu.scheduler.max_num_batched_tokens, gpu.scheduler.num_scheduler_steps) == (8192, 3)
    assert gpu.scheduler.max_model_len == 64
    eager = EngineArgs(enforce_eager=True).create_engine_config(model, torch.device("cuda"))
    assert eager.scheduler.num_scheduler_steps == 1


def test_help_works_without_the_server_dependencies():
    """`tachyon serve --help` (and the parser of every command) imports no fastapi, uvicorn or pydantic."""
    blocker = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('fastapi', 'uvicorn', 'pydantic', 'prometheus_client'):\n"
               "            raise ImportError(f'{name} is blocked')\n"
               "sys.meta_path.insert(0, Block())\n"
               "from tachyon.cli import main\n"
               "sys.exit(main(['serve', '--help']))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": root})
    assert p.returncode == 0, p.stderr
    assert "--num-scheduler-steps" in p.stdout and "--api-key" in p.stdout
