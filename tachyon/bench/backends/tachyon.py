"""The Tachyon engine in this process, stepped directly so that every token gets its own timestamp."""

from __future__ import annotations

import time

from tachyon.bench.backends.base import Backend, RunResult, now
from tachyon.bench.metrics import RequestResult
from tachyon.bench.workloads import BenchRequest


class TachyonBackend(Backend):
    name = "tachyon"

    def __init__(self, args):
        from tachyon.engine_args import EngineArgs

        self.args = EngineArgs.from_cli_args(args)
        self.ignore_eos = getattr(args, "ignore_eos", True)
        self.engine = None
        self.startup_s = None
        self._n = 0

    def load(self) -> None:
        from tachyon.build import build_engine

        t = now()
        self.engine = build_engine(self.args)
        self.startup_s = now() - t

    @property
    def vocab_size(self) -> int:
        return self.engine.config.model.vocab_size

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def run(self, reqs: list[BenchRequest], progress=None) -> RunResult:
        import torch

        from tachyon.sampling_params import SamplingParams

        eng = self.engine
        results = [RequestResult(r.prompt_len, r.output_len) for r in reqs]
        for r in reqs:  # validate everything before anything is timed
            eng.validate(r.prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=r.output_len,
                                                            ignore_eos=self.ignore_eos))
        ids = {}
        before = eng.stats()
        t0 = now()
        arrival = time.monotonic()
        for i, r in enumerate(reqs):
            rid = f"bench-{self._n}"
            self._n += 1
            ids[rid] = i
            results[i].start = t0
            sp = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=self.ignore_eos)
            eng.add_request(rid, None, r.prompt_token_ids, sp, arrival_time=arrival)
        pending = set(ids)
        interrupted = False
        try:
            with torch.inference_mode():
                while pending:
                    outs = eng.step()
                    t = now()
                    for o in outs:
                        i = ids.get(o.request_id)
                        if i is None:
                            continue
                        res = results[i]
                        n = len(o.outputs[0].token_ids)
                        res.token_times.extend([t] * (n - len(res.token_times)))
                        if o.finished:
                            pending.discard(o.request_id)
                            res.end = t
                            res.output_tokens = n
                            res.success = o.outputs[0].finish_reason != "abort"
                            if progress is not None:
                                progress.update(1)
        except KeyboardInterrupt:
            interrupted = True
            for rid in pending:
                eng.abort_request(rid)
                results[ids[rid]].error = "interrupted"
            try:
                while eng.has_unfinished_requests():
                    eng.step()
            except Exception:
                pass
        return RunResult(results, now() - t0, t0, interrupted, spec_counters(before, eng.stats()))

    def config(self) -> dict:
        c = self.engine.config
        return {
            "engine_args": dict(vars(self.args)),
            "device": str(c.device), "dtype": str(c.dtype).removeprefix("torch."),
            "attention_backend": c.attention_backend, "num_kv_blocks": self.engine.num_kv_blocks,
            "block_size": c.cache.block_size, "max_num_batched_tokens": c.scheduler.max_num_batched_tokens,
            "max_num_seqs": c.scheduler.max_num_seqs, "max_model_len": c.scheduler.max_model_len,
            "startup_s": self.startup_s,
        }

    def close(self) -> None:
        self.engine = None


def spec_counters(before, after) -> dict:
    """Speculative decoding during one run (EngineStats before and after): drafts, proposed and accepted tokens,
    accepted per position; empty when nothing was proposed."""
    drafts = after.spec_num_drafts - before.spec_num_drafts
    if not drafts:
        return {}
    return {"spec_num_drafts": drafts,
            "spec_num_draft_tokens": after.spec_num_draft_tokens - before.spec_num_draft_tokens,
            "spec_num_accepted_tokens": after.spec_num_accepted_tokens - before.spec_num_accepted_tokens,
            "spec_accepted_per_pos": [a - b for a, b in zip(after.spec_accepted_per_pos, before.spec_accepted_per_pos,
                                                            strict=True)]}
