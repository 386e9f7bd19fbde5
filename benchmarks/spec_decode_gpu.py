"""Issue 16 on a GPU: what speculative decoding's machinery costs and gives, with proposers of known acceptance.

llama3-8b with random weights (--load-format dummy), greedy. One engine, built with speculation configured, runs
every case, so plain decoding (the proposer switched off: CUDA-graph decode steps, steps queued ahead) and
speculative decoding share the weights, the KV pool and the graphs:

  * replay: proposes the target's own greedy continuation (recorded by a plain run first), each proposal
    replaced by a random token with probability 1 - `fidelity`: fidelity 1 is acceptance ~1 (the machinery's
    ceiling), lower values trace acceptance down to the break-even point;
  * random: k random tokens (acceptance ~0: the overhead of verifying and rolling back).

Verification steps have 1 + k tokens per sequence: they replay the piecewise CUDA graphs (any token count, attention
eager between the pieces), not the per-batch-size decode graphs; a speculating step is collected before the next
one is scheduled (its proposals need the tokens on the host).

    PYTHONPATH=. python benchmarks/spec_decode_gpu.py --out $OUT/spec_decode.json
    PYTHONPATH=. python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1,0.9,0.8,0.6,0.4 --out ...
    # the seeds' pairing: 70B AWQ target, an 8B draft's forwards paying for replayed proposals
    PYTHONPATH=. python benchmarks/spec_decode_gpu.py --model benchmarks/models/llama3-70b.json --quantization awq \
        --draft benchmarks/models/llama3-8b.json --num-kv-blocks 4000 --batches 1 --fidelity 0.9,0.8 --out ...
    # (--draft-quantization awq: a 4-bit draft; the runs before 2026-12-07 had one without asking, as the draft
    # inherited the target's --quantization then)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon import LLM, SamplingParams  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA8B = os.path.join(HERE, "models", "llama3-8b.json")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


class ReplayProposer:
    """Proposes each sequence's recorded greedy continuation; each token swapped for a random one with
    probability 1 - fidelity."""

    needs_slots = False

    def __init__(self, refs: dict[tuple, list[int]], fidelity: float, vocab: int, seed: int = 0):
        self.refs, self.fidelity, self.vocab = refs, fidelity, vocab
        self.rng = random.Random(seed)

    def propose(self, seqs, max_tokens):
        out = []
        for s, k in zip(seqs, max_tokens, strict=True):
            ref = self.refs[tuple(s.prompt_token_ids)]
            m = s.num_output_tokens
            out.append([t if self.rng.random() < self.fidelity else self.rng.randrange(self.vocab)
                        for t in ref[m:m + k]])
        return out


class PaidReplay:
    """The replay proposer's tokens at the cost of a real draft model: the draft proposes (its forwards and
    its KV run as in `draft_model` speculation), then its tokens are replaced by the replayed ones, so a random-
    weight pair runs at the acceptance you choose."""

    needs_slots = True

    def __init__(self, draft, replay: ReplayProposer):
        self.draft, self.replay = draft, replay

    def propose(self, seqs, max_tokens):
        self.draft.propose(seqs, max_tokens)
        return self.replay.propose(seqs, max_tokens)


class RandomProposer:
    needs_slots = False

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab, self.rng = vocab, random.Random(seed)

    def propose(self, seqs, max_tokens):
        return [[self.rng.randrange(self.vocab) for _ in range(k)] for k in max_tokens]


def set_proposer(llm: LLM, proposer, k: int, backoff_max_steps: int = 0) -> None:
    """Switch the engine's proposer (None: plain decoding) and its back-off (0: verify every step, the
    machinery's own cost). The scheduler reads them every step."""
    llm.engine.scheduler.set_speculation(proposer, k, backoff_max_steps)


def trust_replay(refs: dict[tuple, list[int]]) -> None:
    """--trust-replay: random weights leave the target's logits nearly tied, so its greedy token differs between
    the decode graphs (the plain run the replay recorded) and the verification path at almost every step
    (measured on the H200: acceptance 0.014 at fidelity 1). The real verification still runs (its cost is
    timed); then its result is replaced by the replay's: the leading proposals that are the recorded tokens are
    accepted and the next recorded token is emitted, so the acceptance is the proposer's fidelity."""
    import tachyon.worker.model_runner as mr
    from tachyon.worker.spec_decode import verify

    def verify_replayed(sampler, logits, reqs, drafts, num_outputs):
        tokens, accepted = verify(sampler, logits, reqs, drafts, num_outputs)
        toks, acc = [], []
        for r, d, m in zip(reqs, drafts, num_outputs, strict=True):
            ref = refs[tuple(r.prompt_token_ids)]
            n = 0
            while n < len(d) and m + n < len(ref) and d[n] == ref[m + n]:
                n += 1
            acc.append(n)
            toks.append(ref[min(m + n, len(ref) - 1)])
        return (torch.tensor(toks, dtype=tokens.dtype).to(tokens.device, non_blocking=True),
                torch.tensor(acc, dtype=accepted.dtype).to(accepted.device, non_blocking=True))

    mr.verify = verify_replayed


def run(llm: LLM, prompts: list[list[int]], out_len: int) -> dict:
    before = llm.engine.stats()
    t0 = time.monotonic()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    st = llm.engine.stats()
    dur = max(o.metrics.finished_time for o in outs) - t0
    per_req = [(len(o.outputs[0].token_ids) - 1) / (o.metrics.finished_time - o.metrics.first_token_time)
               for o in outs]
    # decode phase of the batch: from the last request's first token to the first request's finish
    start = max(o.metrics.first_token_time for o in outs)
    end = min(o.metrics.finished_time for o in outs)
    drafted = st.spec_num_draft_tokens - before.spec_num_draft_tokens
    return {"tokens": [o.outputs[0].token_ids for o in outs], "duration_s": dur,
            "output_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / dur,
            "median_decode_tok_s_per_request": statistics.median(per_req),
            "batch_decode_tok_s": len(outs) * (out_len - 1) / (end - start) if end > start else None,
            "steps": st.num_steps - before.num_steps, "draft_tokens": drafted,
            "acceptance_rate": (st.spec_num_accepted_tokens - before.spec_num_accepted_tokens) / drafted
            if drafted else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=LLAMA8B)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--fidelity", default="1,0.9,0.8,0.7,0.6,0.5,0.4")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--quantization", default=None, help="the target's (awq: random 4-bit weights)")
    ap.add_argument("--draft", default=None, help="a draft model's config.json (random weights): replay proposals "
                    "paid for by its forwards (the issue's 70B AWQ + 8B pairing)")
    ap.add_argument("--draft-quantization", default=None, help="the draft's (speculative_config \"quantization\"; "
                    "default: dense bf16)")
    ap.add_argument("--num-kv-blocks", type=int, default=None, help="the KV pool (needed with --draft: the pool is "
                    "sized before the draft loads, so leave it room)")
    ap.add_argument("--trust-replay", action="store_true", help="accept the replayed proposals whatever the "
                    "random-weight target's nearly tied logits say (its verification still runs): see trust_replay")
    ap.add_argument("--verify-graphs", choices=("on", "off", "both"), default="on",
                    help="verification steps as whole-step CUDA graphs (on), or piecewise graphs / eager (off), or "
                    "each case both ways (an A/B on the same engine)")
    ap.add_argument("--backoff", default="0", help="backoff_max_steps values to run each case with (0: verify "
                    "every step, the machinery's own cost; 32: the default, sequences whose proposals keep being "
                    "rejected decode plainly in between); fidelity 1 runs with the first only (nothing is rejected)")
    args = ap.parse_args()
    k = args.k
    spec = ({"method": "draft_model", "model": args.draft, "num_speculative_tokens": k,
             "quantization": args.draft_quantization} if args.draft
            else {"method": "ngram", "num_speculative_tokens": k})
    t_start = time.monotonic()
    llm = LLM(model=args.model, load_format="dummy", max_model_len=args.max_model_len, swap_space=0,
              quantization=args.quantization, num_kv_blocks=args.num_kv_blocks, speculative_config=spec)
    draft = llm.engine.scheduler.proposer if args.draft else None
    verify_graphs = llm.engine.runner.verify_graphs
    vocab = llm.engine.config.model.vocab_size
    device = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else "cpu"
    result = {"command": "PYTHONPATH=. python " + " ".join(sys.argv), "device": device, "torch": torch.__version__,
              "model": os.path.basename(args.model) + " (random weights, bf16)", "k": k,
              "input_len": args.input_len, "output_len": args.output_len,
              "verification_steps": "verify_graphs on: whole-step CUDA graphs (1 + k tokens per sequence); off: "
              + ("piecewise CUDA graphs" if llm.engine.runner.piecewise_graphs is not None else "eager"),
              "trust_replay": args.trust_replay, "startup_s": time.monotonic() - t_start,
              "num_kv_blocks": llm.engine.kv.num_blocks, "cases": []}
    rng = random.Random(0)
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = [[rng.randrange(vocab // 8, vocab - vocab // 8) for _ in range(args.input_len)] for _ in range(batch)]
        set_proposer(llm, None, k)
        run(llm, prompts[:1], 8)  # warm-up
        plain = run(llm, prompts, args.output_len)
        refs = {tuple(pr): toks for pr, toks in zip(prompts, plain["tokens"], strict=True)}
        if args.trust_replay:
            trust_replay(refs)
        base = plain["batch_decode_tok_s"]
        log(f"batch {batch} plain: {base:.1f} tok/s decode, {plain['output_tok_s']:.1f} tok/s output")
        result["cases"].append({"batch": batch, "proposer": "none", **{k_: v for k_, v in plain.items()
                                                                        if k_ != "tokens"}})
        cases = [(f"replay fidelity={f}", ReplayProposer(refs, float(f), vocab)) for f in args.fidelity.split(",")]
        if draft is not None:
            cases = [(name + " + draft forwards", PaidReplay(draft, prop)) for name, prop in cases]
        cases.append(("random", RandomProposer(vocab)))
        modes = ("on", "off") if args.verify_graphs == "both" else (args.verify_graphs,)
        backoffs = [int(b) for b in args.backoff.split(",")]
        for (name, prop), mode, backoff in [(c, m, b) for c in cases for m in modes for b in backoffs]:
            replay = prop.replay if isinstance(prop, PaidReplay) else prop
            if getattr(replay, "fidelity", None) == 1.0 and backoff != backoffs[0]:
                continue  # nothing is rejected: the back-off never starts
            set_proposer(llm, prop, k, backoff)
            llm.engine.runner.verify_graphs = verify_graphs if mode == "on" else None
            r = run(llm, prompts, args.output_len)
            same = sum(a == b for a, b in zip(r.pop("tokens"), plain["tokens"], strict=True))
            r.update(batch=batch, proposer=name, verify_graphs=mode, backoff_max_steps=backoff,
                     speedup_vs_plain=r["batch_decode_tok_s"] / base,
                     outputs_identical_to_plain=f"{same}/{batch}")
            result["cases"].append(r)
            acc = "n/a" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
            log(f"batch {batch} {name} (verify graphs {mode}, backoff {backoff}): acceptance {acc}, "
                f"{r['batch_decode_tok_s']:.1f} tok/s decode (x{r['speedup_vs_plain']:.2f}), identical {same}/{batch}")
            with open(args.out, "w") as f:  # after every case: a run cut short keeps what it measured
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
