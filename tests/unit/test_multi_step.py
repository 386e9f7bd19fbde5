"""Decode runs (num_scheduler_steps > 1): forwards queued on the device ahead of the host give exactly the
tokens of one-at-a-time steps, one token per step to the streams, stop where a stop condition says, and leave
no blocks behind."""

from __future__ import annotations

import random

import pytest

from tachyon import LLM, SamplingParams
from tests.conftest import hf_greedy, make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_multi")
    hf = make_tiny_checkpoint("llama", str(path), seed=3)
    return str(path), hf


def _spy_runs(llm: LLM) -> list:
    """Every decode run the engine starts; each records the most steps it ever had in flight."""
    runs: list = []
    runner = llm.engine.runner
    real = runner.start_decode_run

    def spy(sched):
        run = real(sched)
        run.max_in_flight = 0
        launch = run.launch

        def counted(live):
            launch(live)
            run.max_in_flight = max(run.max_in_flight, run.in_flight)

        run.launch = counted
        runs.append(run)
        return run

    runner.start_decode_run = spy
    return runs


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 500) for _ in range(rng.choice([5, 19, 33, 70]))] for _ in range(n)]


def test_decode_runs_match_transformers(tiny):
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=200, block_size=8, swap_space=0, num_scheduler_steps=4, dtype="float32")
    runs = _spy_runs(llm)
    prompts = _prompts(6, seed=0)
    max_tokens = [1, 2, 7, 10, 13, 21]  # rows die at many different steps of a run
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens])
    assert runs and max(r.max_in_flight for r in runs) == 4
    assert sum(r.launched for r in runs) > 2 * len(runs), "runs should outlive their queue depth"
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, m)
        assert o.outputs[0].finish_reason == "length"
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks, "blocks leaked"


def test_run_stops_on_stop_token_with_steps_in_flight(tiny):
    path, hf = tiny
    prompt = _prompts(1, seed=5)[0]
    ref = hf_greedy(hf, prompt, 24)
    stop_at = next(i for i in range(5, 24) if ref[i] not in ref[:i])  # first occurrence, mid-way through a run
    llm = LLM(model=path, num_kv_blocks=64, block_size=8, swap_space=0, num_scheduler_steps=8, dtype="float32")
    runs = _spy_runs(llm)
    (out,) = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[ref[stop_at]]))
    assert runs and runs[0].launched > stop_at, "steps past the stop were already queued"
    assert out.outputs[0].token_ids == ref[: stop_at + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == ref[stop_at]
    assert llm.engine._run is None
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_runs_same_as_single_steps_for_seeded_sampling_and_stop_strings(llm):
    prompts = ["Tell me a story about a dragon.", "List three fruits:"]
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=30),
              SamplingParams(temperature=0, max_tokens=40, stop=["\n\n", "4."])]
    one = [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason)
           for o in llm.generate(prompts, params)]
    multi = LLM(swap_space=0, num_scheduler_steps=5)
    runs = _spy_runs(multi)
    many = [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason)
            for o in multi.generate(prompts, params)]
    assert runs
    assert many == one
    assert multi.engine.kv.num_free_blocks == multi.engine.kv.num_blocks


def test_streams_get_one_token_per_step_during_a_run(tiny):
    """A run hands every token out at its own step (no chunks), while later steps are already queued."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=64, block_size=8, swap_space=0, num_scheduler_steps=3, dtype="float32")
    runs = _spy_runs(llm)
    eng = llm.engine
    prompt = _prompts(1, seed=2)[0]
    eng.add_request("s", None, prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    lengths = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            lengths.append(len(o.outputs[0].token_ids))
    assert runs and runs[0].max_in_flight == 3
    assert lengths == list(range(1, 13))
    assert o.outputs[0].token_ids == hf_greedy(hf, prompt, 12)


def test_run_stops_queueing_when_someone_can_be_admitted(tiny):
    """A waiting request that fits ends the run: no step is queued after it arrives; the ones in flight
    land, then an ordinary step admits it."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=200, block_size=8, swap_space=0, num_scheduler_steps=4, max_num_seqs=1,
              dtype="float32")
    runs = _spy_runs(llm)
    eng = llm.engine
    eng.add_request("a", None, [5, 6, 7], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    eng.step()  # prefill
    eng.step()  # max_num_seqs reached: nobody can be admitted, so a run starts
    assert len(runs) == 1 and runs[0].in_flight == 4
    eng.add_request("b", None, [8, 9], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    eng.step()
    assert runs[0].in_flight == 4, "max_num_seqs = 1: b cannot be admitted, the run goes on"
    eng.config.scheduler.max_num_seqs = 2
    launched = runs[0].launched
    got_b = None
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id == "b" and got_b is None:
                got_b = runs[0].launched
    assert runs[0].stopped and got_b == launched, "b's first token came after the in-flight steps, none more"
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_rows_ride_along_after_their_sequence_ends(tiny):
    """Sequences that end mid-run stay in the batch as dead rows until it thins out; the others' tokens
    are unaffected (the dead rows write no KV into blocks that other sequences may get)."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=400, block_size=8, swap_space=0, num_scheduler_steps=6, dtype="float32")
    runs = _spy_runs(llm)
    prompts = _prompts(20, seed=9)
    # 3..21, finishing at many different steps; two sequences end first, and the batch then stays as large
    # as it runs (a CUDA graph of 32 rows; on the CPU, 7/8 of the rows alive)
    max_tokens = [3 + (i * 7) % 19 for i in range(20)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens])
    first = runs[0]
    assert first.size == 20 and first.launched > min(first.remaining), "the run went past the first finish"
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert len(o.outputs[0].token_ids) == m
        assert o.outputs[0].token_ids == hf_greedy(hf, p, m)
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_run_ends_when_the_pool_has_no_block_and_preemption_takes_over(tiny):
    """Blocks for queued steps are taken one block at a time; when none is left the run ends and the
    scheduler preempts as usual. Tokens stay exact."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=14, block_size=4, swap_space=0, num_scheduler_steps=4, dtype="float32")
    runs = _spy_runs(llm)
    prompts = _prompts(3, seed=4)
    prompts = [p[:9] for p in prompts]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=14, ignore_eos=True))
    assert runs and llm.engine.scheduler.num_preemptions > 0
    for p, o in zip(prompts, outs, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 14)
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_runs_with_n_greater_than_one_and_abort(tiny):
    """n > 1 siblings (forked after the prompt) give the same tokens with and without runs; an abort while
    steps are in flight frees everything at once."""
    path, _ = tiny
    prompt = _prompts(1, seed=21)[0]
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=14, ignore_eos=True)
    results = []
    for steps in (1, 4):
        llm = LLM(model=path, num_kv_blocks=120, block_size=8, swap_space=0, num_scheduler_steps=steps,
                  dtype="float32")
        runs = _spy_runs(llm)
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
        assert (steps > 1) == bool(runs)
        results.append([c.token_ids for c in out.outputs])
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    assert results[0] == results[1]
    assert all(len(t) == 14 for t in results[1])

    eng = llm.engine
    eng.add_request("x", None, prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng._run is not None and eng._run.in_flight == 4 and eng.kv.num_free_blocks < eng.kv.num_blocks
    eng.abort_request("x")
    (out,) = eng.step()
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert 0 < len(out.outputs[0].token_ids) < 40
    assert not eng.has_unfinished_requests() and eng.kv.num_free_blocks == eng.kv.num_blocks
    assert eng._run is None, "a run of dead rows only is dropped"


def test_request_arriving_while_a_run_starts(tiny):
    """add_request runs on the server's threads: a request that lands between the decision to start a run
    and its first step must neither leave the run empty (the engine once died here: 'pop from an empty
    deque') nor wait longer than the run's first step."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=200, block_size=8, swap_space=0, num_scheduler_steps=4, dtype="float32")
    eng = llm.engine
    runner = eng.runner
    real = runner.start_decode_run
    late = [5, 9, 14, 2]

    runs = []

    def start_and_race(sched):
        run = real(sched)
        runs.append(run)
        if "late" not in eng.groups:  # another thread's add_request, right after the run was decided
            eng.add_request("late", None, late, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        return run

    runner.start_decode_run = start_and_race
    eng.add_request("a", None, [7, 8, 9], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    eng.step()  # prefill
    eng.step()  # a run starts; "late" arrives during it
    assert runs[0].launched == 1 and runs[0].stopped and eng._run is None  # one step, then "late" is admitted
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o.outputs[0].token_ids
    assert outs["late"] == hf_greedy(hf, late, 5)
    assert outs["a"] == hf_greedy(hf, [7, 8, 9], 9)
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_run_stops_at_the_context_limit(tiny):
    """A run never queues a step past max_model_len: the sequence ends with 'length' exactly at the limit."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=64, block_size=8, swap_space=0, num_scheduler_steps=4, dtype="float32",
              max_model_len=40)
    runs = _spy_runs(llm)
    prompt = [10 + (7 * i) % 400 for i in range(29)]
    (out,) = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0, ignore_eos=True, max_tokens=None))  # up to the context
    assert runs and sum(r.launched for r in runs) <= 40 - 29
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 40 - 29)
    assert out.outputs[0].finish_reason == "length"
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_a_thinned_batch_is_rescheduled_at_the_next_graph_size():
    """worth_running: small batches run to the end; larger ones stop once the live rows fit a smaller CUDA
    graph (or, without graphs, once an eighth of the rows is dead)."""
    from tachyon.worker.cuda_graphs import CudaGraphs, capture_sizes
    from tachyon.worker.decode_run import DecodeRun

    graphs = object.__new__(CudaGraphs)
    graphs.sizes = capture_sizes(256)
    run = object.__new__(DecodeRun)
    run.graphs, run.size = graphs, 16
    assert run.worth_running(1)
    run.size = 200  # runs at 208 rows
    assert run.worth_running(193) and not run.worth_running(192)
    run.graphs, run.size = None, 64
    assert run.worth_running(56) and not run.worth_running(55)
