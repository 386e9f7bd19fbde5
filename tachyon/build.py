"""build_engine: EngineArgs in, a ready LLMEngine out.

The one module that knows both the engine and the worker: it sits above them, so neither imports the other to be
put together. Order: configs, tokenizer, model runner (weights), KV pool sized, warm-up, engine.
"""

from __future__ import annotations

import logging
import time

from tachyon.config import EngineConfig, num_kv_blocks_for_budget
from tachyon.engine.engine import LLMEngine
from tachyon.engine.tokenizer import load_tokenizer
from tachyon.engine_args import EngineArgs
from tachyon.models.loader import load_config, resolve_model_path
from tachyon.worker.model_runner import ModelRunner

logger = logging.getLogger("tachyon")


def build_engine(args: EngineArgs) -> LLMEngine:
    t0 = time.perf_counter()
    device = args.resolve_device()
    path = model_path(args)
    config = args.create_engine_config(load_config(path), device)
    bare_config = path.endswith(".json")  # a bare config.json: no tokenizer beside it, random weights
    tokenizer = load_tokenizer(args.tokenizer or (None if bare_config else path))
    runner = ModelRunner(config, None if args.load_format == "dummy" and bare_config else path, args.load_format)
    num_blocks = num_kv_blocks(config, runner)
    runner.allocate_kv_cache(num_blocks)
    if hasattr(runner, "warm_up"):
        runner.warm_up()
    engine = LLMEngine(config, tokenizer, runner, num_blocks)
    engine.startup_time_s = time.perf_counter() - t0
    logger.info("engine ready in %.1fs: %d KV blocks of %d tokens", engine.startup_time_s, num_blocks,
                args.block_size)
    return engine


def model_path(args: EngineArgs) -> str:
    """Where the model's config.json (and weights) are: a checkpoint directory, or a bare config.json."""
    if args.load_format == "dummy" and args.model is not None and args.model.endswith(".json"):
        return args.model  # random weights made where the model runs
    path = resolve_model_path(args.model)
    if path.endswith(".gguf"):
        from tachyon.models.gguf_loader import converted_dir

        path = converted_dir(path)
    return path


def num_kv_blocks(config: EngineConfig, runner: ModelRunner) -> int:
    """The KV pool's size: as given, else measured on a GPU, else from the CPU byte budget."""
    if config.cache.num_kv_blocks:
        return config.cache.num_kv_blocks
    if config.device.type == "cuda":
        return runner.profile_num_blocks()
    return num_kv_blocks_for_budget(config.model, config.dtype, config.cache.block_size, config.cache.kv_cache_bytes)
