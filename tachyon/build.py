"""build_engine: EngineArgs in, a ready LLMEngine out.

The one module that knows both the engine and the worker: it sits above them, so neither imports the other to be
put together. Order: configs, tokenizer, model runner (weights), KV pool sized, warm-up, engine.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import time

import torch

from tachyon import envs
from tachyon.config import EngineConfig, SpeculativeConfig, num_kv_blocks_for_budget
from tachyon.engine.engine import LLMEngine
from tachyon.engine.ngram_proposer import NgramProposer
from tachyon.engine.tokenizer import load_tokenizer
from tachyon.engine_args import EngineArgs
from tachyon.interface import Proposer
from tachyon.models.loader import load_config, resolve_model_path
from tachyon.worker.model_runner import ModelRunner

logger = logging.getLogger("tachyon")


def build_engine(args: EngineArgs) -> LLMEngine:
    t0 = time.perf_counter()
    draft = load_draft(args)
    config, runner, num_blocks, num_cpu_blocks = build_runner(args, draft=draft)
    tokenizer = front_end_tokenizer(args)
    engine = LLMEngine(config, tokenizer, runner, num_blocks, num_cpu_blocks,
                       build_proposer(args, config, num_blocks, draft))
    engine.startup_time_s = time.perf_counter() - t0
    logger.info("engine ready in %.1fs: %d KV blocks of %d tokens", engine.startup_time_s, num_blocks,
                args.block_size)
    return engine


def build_runner(args: EngineArgs, group: tuple | None = None, draft: ModelRunner | None = None
                 ) -> tuple[EngineConfig, ModelRunner, int, int]:
    """The config, a ready runner (weights, KV pool, swap space, graphs), and its (device, CPU) block counts.
    draft: a draft model's runner (weights loaded, no KV yet, see load_draft) whose paged KV shares the pool's
    budget: the block count is what both pools together fit.

    With tensor_parallel_size > 1 this process joins the group (tachyon.distributed; `group` is the joined
    (TensorParallel, Workers) of a spawned rank): rank 0's runner is returned, the other ranks serve its steps
    here and exit when it stops."""
    envs.check()
    path = model_path(args)
    tp = workers = None
    config = args.create_engine_config(load_config(path), args.resolve_device())
    if args.tensor_parallel_size > 1:
        from tachyon.distributed import join_group
        from tachyon.models.sharding import plan_shards

        for rank in range(args.tensor_parallel_size):  # a size the model cannot split fails before any process starts
            plan_shards(config.model, rank, args.tensor_parallel_size)
        tp, workers = group if group is not None else join_group(args)
        if config.device.type == "cuda":
            config = dataclasses.replace(config, device=torch.device("cuda", tp.local_rank))
    bare_config = path.endswith(".json")  # a bare config.json: random weights
    runner = ModelRunner(config, None if args.load_format == "dummy" and bare_config else path, args.load_format, tp)
    blocks = prepare_runner(config, runner, draft.kv_bytes_per_block() if draft is not None else 0)
    if tp is not None and not tp.is_driver:
        try:
            runner.serve_steps()
        except Exception as e:  # rank 0 is gone without saying stop
            logger.error("tensor-parallel rank %d: rank 0 is gone (%s); exiting", tp.rank, e)
            raise SystemExit(1) from None
        tp.destroy()
        raise SystemExit(0)
    if tp is not None:
        runner.workers, runner.serving = workers, True
        atexit.register(runner.shutdown)  # the ranks leave with this process, also when nobody shut it down
    return (config, runner, *blocks)


def load_draft(args: EngineArgs) -> ModelRunner | None:
    """Speculative decoding's draft model, if configured: its runner with the weights loaded and no KV pool yet.
    Loaded before the target sizes its pool, so a GPU's free memory is measured with both models in it."""
    spec = SpeculativeConfig.parse(args.speculative_config)
    if spec is None or spec.method != "draft_model":
        return None
    if args.tensor_parallel_size > 1:
        raise ValueError("a draft model with tensor_parallel_size > 1 is not supported: use the ngram method, "
                         "or tensor_parallel_size=1")
    # the draft's quantization is its checkpoint's or the speculative config's, never the target's --quantization
    draft_args = dataclasses.replace(args, model=spec.model, speculative_config=None, num_kv_blocks=None,
                                     swap_space=0, num_scheduler_steps=1, tokenizer=None,
                                     quantization=spec.quantization)
    path = model_path(draft_args)
    config = draft_args.create_engine_config(load_config(path), draft_args.resolve_device())
    return ModelRunner(config, None if draft_args.load_format == "dummy" and path.endswith(".json") else path,
                       draft_args.load_format)


def build_proposer(args: EngineArgs, config: EngineConfig, num_blocks: int,
                   draft: ModelRunner | None = None) -> Proposer | None:
    """Speculative decoding's proposer, if configured: n-gram lookup, or the draft model (load_draft's runner), its
    paged KV given the target's block count and block size (the same block tables address both)."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    from tachyon.worker.draft_proposer import DraftProposer

    if draft.model.cfg.vocab_size > config.model.vocab_size:
        raise ValueError(f"the draft model {spec.model} has a vocabulary of {draft.model.cfg.vocab_size} tokens, "
                         f"the target {config.model.vocab_size}: a draft needs the target's tokenizer")
    draft.allocate_kv_cache(num_blocks)
    draft.allocate_swap_space(0)
    draft.warm_up()
    return DraftProposer(draft)


def front_end_tokenizer(args: EngineArgs):
    """The model's tokenizer (none beside a bare config.json)."""
    path = model_path(args)
    if args.tokenizer is not None:
        path = resolve_model_path(args.tokenizer, args.revision, args.download_dir)
    return load_tokenizer(None if path.endswith(".json") else path, args.trust_remote_code)


def prepare_runner(config: EngineConfig, runner: ModelRunner, shared_bytes_per_block: int = 0) -> tuple[int, int]:
    """Size and allocate the KV pool and the CPU swap space, warm up (CUDA graphs); (device, CPU) blocks.
    shared_bytes_per_block: what each block also costs elsewhere (a draft model's KV), out of the same budget."""
    num_blocks = runner.agree_num_blocks(num_kv_blocks(config, runner, shared_bytes_per_block))
    runner.allocate_kv_cache(num_blocks)
    num_cpu_blocks = min(int(config.cache.swap_space_gib * (1 << 30) // runner.kv_bytes_per_block()), 1 << 20)
    runner.allocate_swap_space(num_cpu_blocks)
    runner.warm_up()
    return num_blocks, num_cpu_blocks


def build_core(args: EngineArgs):
    """In the engine-core process: the core alone (the front end detokenizes; the tokenizer loads only for a
    grammar), and what the front end needs to know of it."""
    from tachyon.engine.core import EngineCore
    from tachyon.engine.structured_output import GrammarCompiler

    t0 = time.perf_counter()
    draft = load_draft(args)
    config, runner, num_blocks, num_cpu_blocks = build_runner(args, draft=draft)
    # the tokenizer (for xgrammar's vocabulary) loads when the first constrained request arrives
    grammars = GrammarCompiler(None, config.model.vocab_size, config.model.eos_token_ids,
                               load_tokenizer=lambda: front_end_tokenizer(args))
    core = EngineCore(config, runner, num_blocks, num_cpu_blocks, build_proposer(args, config, num_blocks, draft),
                      grammars)
    info = {"config": config, "num_kv_blocks": core.kv.num_blocks, "startup_time_s": time.perf_counter() - t0,
            "timings": dict(runner.timings), "worker_pids": runner.workers.pids if runner.workers else []}
    logger.info("engine core ready in %.1fs: %d KV blocks of %d tokens", info["startup_time_s"], num_blocks,
                args.block_size)
    return core, info


def build_engine_client(args: EngineArgs):
    """`tachyon serve`: the engine core in its own process, and the client this process talks to it with."""
    from tachyon.engine.core_client import MPEngineClient

    return MPEngineClient(build_core, args, front_end_tokenizer(args))


def model_path(args: EngineArgs) -> str:
    """Where the model's config.json (and weights) are: a checkpoint directory, or a bare config.json."""
    if args.load_format == "dummy" and args.model is not None and args.model.endswith(".json"):
        return args.model  # random weights made where the model runs
    path = resolve_model_path(args.model, args.revision, args.download_dir)
    if path.endswith(".gguf"):
        from tachyon.models.gguf_loader import converted_dir

        path = converted_dir(path)
    return path


def num_kv_blocks(config: EngineConfig, runner: ModelRunner, shared_bytes_per_block: int = 0) -> int:
    """The KV pool's size: as given, else measured on a GPU, else from the CPU byte budget; with a draft model
    (shared_bytes_per_block, its KV per block) the blocks both pools together fit in that memory."""
    if config.cache.num_kv_blocks:
        return config.cache.num_kv_blocks
    own = runner.kv_bytes_per_block()
    if config.device.type == "cuda":
        return runner.profile_num_blocks() * own // (own + shared_bytes_per_block)
    # runner.model.cfg: this rank's heads under tensor parallelism (the budget is each rank's)
    blocks = num_kv_blocks_for_budget(runner.model.cfg, config.cache.dtype, config.cache.block_size,
                                      config.cache.kv_cache_bytes)
    return blocks * own // (own + shared_bytes_per_block)


def default_sampling_values(args: EngineArgs) -> dict:
    """The sampling values a request that does not set them gets (--generation-config)."""
    from tachyon.models.generation_config import default_sampling_values as from_checkpoint

    path = model_path(args)
    return from_checkpoint(args.generation_config, None if path.endswith(".json") else path)
