"""transformers `generate` with static, left-padded batches: the "PyTorch native" baseline.

A batch runs to its longest output (EOS suppressed with min_new_tokens = max_new_tokens), so shorter
requests ride along as padding; only the tokens each request asked for are counted. Requests beyond
`--hf-batch-size` wait for the next batch. A request's E2EL ends when its batch's `generate` returns,
because that is when a caller of `generate` gets it; its token times come from a streamer.
"""

from __future__ import annotations

import os

from tachyon.bench.backends.base import Backend, RunResult, now
from tachyon.bench.metrics import RequestResult
from tachyon.bench.workloads import BenchRequest


class _TimingStreamer:
    """transformers calls put() once with the prompt, then once per generated step."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(now())

    def end(self) -> None:
        pass


def resolve_device(device: str | None):
    import torch

    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device):
    import torch

    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {sorted(names)}")
    return names[dtype]


class HFBackend(Backend):
    name = "hf"

    def __init__(self, args, dtype: str | None = None, attn: str | None = None, compile: bool | None = None):
        self.model_arg = getattr(args, "model", None)
        self.load_format = getattr(args, "load_format", "auto")
        self.tokenizer_arg = getattr(args, "tokenizer", None)
        self.device = resolve_device(getattr(args, "device", "auto"))
        self.dtype = resolve_dtype(dtype or getattr(args, "hf_dtype", None) or getattr(args, "dtype", "auto"),
                                   self.device)
        self.attn = attn or getattr(args, "hf_attn", None) or "sdpa"
        self.compile = bool(compile if compile is not None else getattr(args, "hf_compile", False))
        self.batch_size = getattr(args, "hf_batch_size", None)
        self.seed = getattr(args, "seed", 0) or 0
        self.model = None
        self._tok = None
        self.startup_s = None
        self.path = None

    def load(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        t = now()
        torch.manual_seed(self.seed)
        path = self.model_arg
        if path is None:
            from tachyon.models.embedded import embedded_model_dir

            path = embedded_model_dir()
        elif path.endswith(".gguf"):
            from tachyon.models.gguf_loader import converted_dir

            path = converted_dir(path)
        self.path = path
        kw = {"dtype": self.dtype, "attn_implementation": self.attn}
        if path.endswith(".json") or self.load_format == "dummy":
            cfg = AutoConfig.from_pretrained(path)
            with torch.device(self.device):
                self.model = AutoModelForCausalLM.from_config(cfg, **kw)
        else:
            if not os.path.exists(path):
                raise FileNotFoundError(f"model {path} does not exist")
            self.model = AutoModelForCausalLM.from_pretrained(path, **kw).to(self.device)
        self.model.eval()
        if self.compile:
            self.model.forward = torch.compile(self.model.forward, mode="reduce-overhead")
        tok_path = self.tokenizer_arg or (None if path.endswith(".json") else path)
        if tok_path and os.path.isdir(tok_path) and any(f.startswith("tokenizer") for f in os.listdir(tok_path)):
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(tok_path)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.startup_s = now() - t

    @property
    def vocab_size(self) -> int:
        return self.model.config.get_text_config().vocab_size

    @property
    def tokenizer(self):
        return self._tok

    def _pad_id(self) -> int:
        for v in (getattr(self._tok, "pad_token_id", None), self.model.generation_config.pad_token_id,
                  self.model.config.get_text_config().eos_token_id):
            if isinstance(v, list):
                v = v[0] if v else None
            if v is not None:
                return int(v)
        return 0

    def generate_batch(self, batch: list[BenchRequest]) -> tuple[list[float], float]:
        """One static batch; returns the per-step token times and the time generate returned."""
        import torch

        pad = self._pad_id()
        width = max(r.prompt_len for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for j, r in enumerate(batch):  # left padding: every prompt ends where generation starts
            ids[j, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
            mask[j, width - r.prompt_len:] = 1
        steps = max(r.output_len for r in batch)
        streamer = _TimingStreamer()
        kw = {"cache_implementation": "static"} if self.compile else {}
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                      pad_token_id=pad, streamer=streamer, **kw)
        end = now()
        if out.shape[1] - width != steps:
            raise RuntimeError(f"hf generate made {out.shape[1] - width} tokens, not {steps}")
        return streamer.times[1:], end

    def run(self, reqs: list[BenchRequest], progress=None) -> RunResult:
        results = [RequestResult(r.prompt_len, r.output_len) for r in reqs]
        bs = self.batch_size or len(reqs)
        t0 = now()
        for r in results:
            r.start = t0
        interrupted = False
        i = 0
        try:
            for i in range(0, len(reqs), bs):
                times, end = self.generate_batch(reqs[i:i + bs])
                for j in range(i, min(i + bs, len(reqs))):
                    res = results[j]
                    res.token_times = times[:res.output_len]
                    res.output_tokens = res.output_len
                    res.end = end
                    res.success = True
                    if progress is not None:
                        progress.update(1)
        except KeyboardInterrupt:
            interrupted = True
            for r in results:
                if not r.success:
                    r.error = "interrupted"
        return RunResult(results, now() - t0, t0, interrupted)

    def config(self) -> dict:
        import transformers

        return {"model": self.path, "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "attn_implementation": self.attn, "torch_compile": self.compile,
                "batch_size": self.batch_size or "all requests in one batch", "padding": "left, static",
                "transformers": transformers.__version__, "startup_s": self.startup_s}

    def close(self) -> None:
        self.model = None
