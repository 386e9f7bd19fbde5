"""A vLLM user's command lines: `tachyon serve ORG/NAME ...` with vLLM's flags, the Hub id read offline from a
Hugging Face cache the test writes (a tiny random Llama with the embedded model's tokenizer), served to the
official `openai` client with the model's generation_config.json as default sampling values."""

from __future__ import annotations

import argparse
import json
import os
import shutil

import openai
import pytest

from tachyon.cli import all_parsers, build_parser, main
from tachyon.models.loader import resolve_model_path
from tests.integration.conftest import serve_in_thread

REPO = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, embedded_dir):
    """A huggingface_hub cache holding REPO at COMMIT (refs/main points at it), as a download would leave it."""
    import torch
    import transformers

    cache = tmp_path_factory.mktemp("hub")
    repo = cache / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(snapshot)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(embedded_dir, name), snapshot / name)
    (snapshot / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 5}))
    return cache, snapshot, model


@pytest.fixture(scope="module")
def vllm_llm(hub_cache):
    """LLM(...) as a vLLM script writes it (vLLM's common keyword arguments), on the Hub id, offline."""
    from huggingface_hub import constants

    from tachyon import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_OFFLINE", True)
        return LLM(model=REPO, download_dir=str(hub_cache[0]), tokenizer=REPO, revision="main",
                   tensor_parallel_size=1, dtype="auto", max_model_len=256, gpu_memory_utilization=0.9,
                   trust_remote_code=True, seed=0, max_logprobs=5, enforce_eager=True, enable_prefix_caching=True,
                   kv_cache_dtype="auto", quantization=None, swap_space=0, max_num_seqs=8, block_size=16,
                   enable_chunked_prefill=True, max_num_batched_tokens=512, disable_log_stats=True,
                   num_scheduler_steps=4, kv_cache_memory_gib=0.05)  # steps in flight, as on a GPU


def test_a_hub_id_resolves_offline_through_the_cache(hub_cache, monkeypatch):
    from huggingface_hub import constants

    cache, snapshot, _ = hub_cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_path(REPO, download_dir=str(cache)) == str(snapshot)
    assert resolve_model_path(REPO, revision=COMMIT, download_dir=str(cache)) == str(snapshot)
    with pytest.raises(FileNotFoundError, match=r"'tiny-org/tiny-llama' at revision v2 is not in the cache .*"
                                                r"HF_HUB_OFFLINE is set"):
        resolve_model_path(REPO, revision="v2", download_dir=str(cache))
    with pytest.raises(FileNotFoundError, match="'other-org/none' at revision main is not in the cache"):
        resolve_model_path("other-org/none", download_dir=str(cache))


VLLM_SERVE = ("serve {repo} --host 0.0.0.0 --port {port} --served-model-name tiny tiny-alias --download-dir {cache} "
              "--revision main --tokenizer {repo} --trust-remote-code --chat-template {template} --response-role bot "
              "--max-logprobs 3 --enable-chunked-prefill --max-model-len 256 --dtype auto --gpu-memory-utilization 0.9 "
              "--tensor-parallel-size 1 --kv-cache-dtype auto --generation-config auto --disable-log-stats "
              "--enable-log-requests --allowed-origins [\"*\"] --root-path / --seed 0 --max-num-seqs 4 "
              "--enable-auto-tool-choice --tool-call-parser hermes")


def test_every_flag_has_help_and_no_flag_is_abbreviated():
    parsers = all_parsers(build_parser())
    missing = [f"{p.prog} {a.option_strings or a.dest}" for p in parsers for a in p._actions
               if a.help is None and not isinstance(a, argparse._SubParsersAction)]
    assert missing == []
    assert all(not p.allow_abbrev for p in parsers)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-num-seq", "4"])  # argparse would take it for --max-num-seqs
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "hi", "--max-tok", "3"])


def test_a_vllm_command_line_parses_to_the_same_settings(tmp_path):
    argv = VLLM_SERVE.format(repo=REPO, port=8000, cache=tmp_path, template=tmp_path / "t.jinja").split()
    args = build_parser().parse_args(argv)
    assert (args.model_tag, args.host, args.served_model_name, args.response_role) == (
        REPO, "0.0.0.0", ["tiny", "tiny-alias"], "bot")
    assert (args.max_logprobs, args.enable_chunked_prefill, args.allowed_origins, args.revision) == (
        3, True, ["*"], "main")
    assert build_parser().parse_args(["serve"]).host is None  # uvicorn is given 0.0.0.0: every interface
    assert main(["serve", "a/b", "--model", "c/d"]) == 2  # the model twice, differently: an error, not a guess
    assert main(["generate", "hi", "--no-enable-chunked-prefill"]) == 2
    assert main(["generate", "hi", "--tensor-parallel-size", "0"]) == 2
    assert main(["serve", "--enable-auto-tool-choice"]) == 2  # vLLM's rule: it needs --tool-call-parser
    assert main(["serve", "--disable-log-requests", "--enable-log-requests"]) == 2
    assert build_parser().parse_args(["serve", "--disable-log-requests"]).enable_log_requests is False


def test_vllm_serve_command_runs_a_hub_model_offline(hub_cache, vllm_llm, tmp_path, monkeypatch, caplog, capsys):
    """The serve command line as parsed, built and served in this process (the subprocess costs seconds)."""
    from huggingface_hub import constants

    from tachyon.server.cli import build_app

    cache, snapshot, _ = hub_cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    argv = VLLM_SERVE.format(repo=REPO, port=0, cache=cache, template=template).split()
    args = build_parser().parse_args([*argv, "--kv-cache-memory-gib", "0.05", "--swap-space", "0",
                                      "--no-engine-process"])
    caplog.set_level("INFO", logger="tachyon")
    app = build_app(args)
    assert "Loading safetensors checkpoint shards: 100%" in capsys.readouterr().err  # progress while loading
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["tiny", "tiny-alias"]
        messages = [{"role": "user", "content": "Hello there"}]
        # no temperature, no max_tokens: generation_config.json's (greedy, 5 tokens)
        r = client.chat.completions.create(model="tiny-alias", messages=messages, extra_body={"ignore_eos": True})
        assert r.model == "tiny" and r.choices[0].message.role == "bot"
        assert r.usage.completion_tokens == 5
        # the prompt went through --chat-template, not the tokenizer's own
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(snapshot)
        ids = tok.encode("<user>Hello there\n<assistant>")
        assert r.usage.prompt_tokens == len(ids)
        with pytest.raises(openai.BadRequestError, match=r"top_logprobs=4 is out of range.*\[0, 3\]"):
            client.chat.completions.create(model="tiny", messages=messages, logprobs=True, top_logprobs=4)
    assert "Received request chatcmpl-" in caplog.text  # --enable-log-requests
    # the offline API reads the same Hub id and, greedy, agrees token for token
    from tachyon import SamplingParams

    out = vllm_llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert out[0].outputs[0].text == r.choices[0].message.content


def test_a_vllm_offline_script_runs_unchanged(vllm_llm, hub_cache, capsys):
    """What a vLLM offline script does: generate with logprobs (Logprob objects, ranks checked against
    transformers' full distribution), chat with its own template, the engine, the prefix cache reset."""
    import torch

    from tachyon import LLM, SamplingParams

    llm = vllm_llm
    assert llm.llm_engine is llm.engine
    prompts = ["Hello, my name is", "The future of AI is"]
    outputs = llm.generate(prompts, SamplingParams(temperature=1.0, seed=7, max_tokens=6, logprobs=3,
                                                   ignore_eos=True))
    assert "Processed prompts" in capsys.readouterr().err  # use_tqdm=True by default, as vLLM's
    model, tok = hub_cache[2], llm.get_tokenizer()
    for output in outputs:
        ids = output.prompt_token_ids + output.outputs[0].token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        n = len(output.prompt_token_ids)
        for pos, (token, entry) in enumerate(zip(output.outputs[0].token_ids, output.outputs[0].logprobs,
                                                 strict=True)):
            assert token in entry and 3 <= len(entry) <= 4
            row = logits[n - 1 + pos]
            for tid, lp in entry.items():
                assert lp.logprob == pytest.approx(row[tid].item(), abs=1e-4)
                # 1 + the tokens more likely than it, up to float noise between the two implementations
                above, near = int((row > row[tid] + 1e-4).sum()), int((row > row[tid] - 1e-4).sum())
                assert above + 1 <= lp.rank <= near, (pos, tid, lp.rank, above, near)
                assert lp.decoded_token == tok.decode([tid])
    # no sampling params: the model's generation_config.json (greedy, 5 tokens)
    default = llm.generate(prompts[0], use_tqdm=False)[0].outputs[0]
    greedy = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0].outputs[0]
    assert len(default.token_ids) <= 5 and default.token_ids == greedy.token_ids
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    out = llm.chat(chat, SamplingParams(max_tokens=2),
                   chat_template=TEMPLATE + "{{ suffix }}{% for t in tools %}[{{ t.function.name }}]{% endfor %}",
                   chat_template_kwargs={"suffix": "!"}, add_generation_prompt=False, use_tqdm=False, tools=tools)
    assert out[0].prompt_token_ids == tok.encode("<user>Hi\n<assistant>Hello\n<assistant>![get_weather]")
    # the prefix cache: a repeat hits it; after reset_prefix_cache it does not
    long_prompt = {"prompt_token_ids": list(range(100, 140))}
    params = SamplingParams(max_tokens=1)
    assert llm.generate(long_prompt, params, use_tqdm=False)[0].num_cached_tokens == 0
    assert llm.generate(long_prompt, params, use_tqdm=False)[0].num_cached_tokens == 32
    assert llm.reset_prefix_cache() is True
    assert llm.generate(long_prompt, params, use_tqdm=False)[0].num_cached_tokens == 0
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    with pytest.raises(TypeError, match=r"\['enable_lora', 'hf_overrides'\] are vLLM's and not supported"):
        LLM(model=REPO, enable_lora=True, hf_overrides={}, speculative_config={"method": "ngram"})


def test_prompt_logprobs_offline_as_vllm_gives_them(vllm_llm, hub_cache):
    """SamplingParams(prompt_logprobs=k): None, then per prompt token {token_id: Logprob} of it and the top k,
    against transformers' log_softmax; the prompt is computed even when the prefix cache holds it; 4 steps in
    flight; bounded by max_logprobs."""
    from tachyon import SamplingParams
    from tachyon.sampling_params import InvalidRequestError
    from tests.integration.test_prompt_logprobs import check_position, reference

    llm, tok = vllm_llm, vllm_llm.get_tokenizer()
    prompt = "The lighthouse keeper climbed the stairs every evening and lit the lamp before the ships came."
    first = llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)[0]  # now in the prefix cache
    assert first.prompt_logprobs is None
    ids = first.prompt_token_ids
    asked, plain = llm.generate([prompt, prompt], [SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3, n=2),
                                                   SamplingParams(max_tokens=2, temperature=0)], use_tqdm=False)
    assert plain.num_cached_tokens == len(ids) // 16 * 16 > 0 and plain.prompt_logprobs is None
    assert asked.num_cached_tokens == 0  # computed, so every position has its logits
    assert len(asked.prompt_logprobs) == len(ids) and asked.prompt_logprobs[0] is None
    ref = reference(hub_cache[2], ids)
    for p in range(1, len(ids)):
        entry = asked.prompt_logprobs[p]
        check_position(ref[p - 1], ids[p], {t: (x.logprob, x.rank) for t, x in entry.items()}, 3)
        assert all(x.decoded_token == tok.decode([t]) for t, x in entry.items())
    assert asked.outputs[0].token_ids == asked.outputs[1].token_ids == plain.outputs[0].token_ids  # greedy, n=2
    zero = llm.generate({"prompt_token_ids": ids[:5]}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                        use_tqdm=False)[0].prompt_logprobs
    assert [None if e is None else list(e) for e in zero] == [None, *([t] for t in ids[1:5])]
    with pytest.raises(InvalidRequestError, match=r"prompt_logprobs=6 is more than the 5 .*--max-logprobs"):
        llm.generate(prompt, SamplingParams(prompt_logprobs=6), use_tqdm=False)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_bench_serve_takes_vllm_flags_and_writes_vllm_keys(tmp_path, capsys):
    from tests.integration.test_bench_serve import FakeServer

    fake = FakeServer()
    try:
        port = fake.url.rsplit(":", 1)[1]  # vLLM's --backend vllm --host --port: the fake's URL
        argv = ["bench", "serve", "--backend", "vllm", "--host", "127.0.0.1", "--port", port, "--dataset-name",
                "random", "--random-input-len", "8", "--random-output-len", "3", "--random-range-ratio", "0.5", "--num-prompts", "3", "--ignore-eos",
                "--save-result", "--result-dir", str(tmp_path), "--result-filename", "vllm.json",
                "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90", "--vocab-size", "5000",
                "--num-warmups", "0", "--no-progress", "--max-concurrency", "3", "--metadata", "gpu=none", "run=a=b"]
        assert main(argv) == 0
        assert all(b["ignore_eos"] and 4 <= len(b["prompt"]) <= 12 and 2 <= b["max_tokens"] <= 4
                   for b in fake.bodies)
        assert main([*argv, "--no-ignore-eos"]) == 0 and not fake.bodies[-1]["ignore_eos"]
    finally:
        fake.stop()
    res = json.loads((tmp_path / "vllm.json").read_text())
    # every key vLLM's benchmark_serving.py / `vllm bench serve` writes (besides the percentile keys)
    vllm_keys = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "best_of", "num_prompts",
                 "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
                 "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
                 "output_throughput", "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
                 "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"}
    assert vllm_keys <= set(res), sorted(vllm_keys - set(res))
    assert (res["gpu"], res["run"], res["request_goodput"], res["endpoint_type"]) == ("none", "a=b", None, "openai")
    # the fake streams " t0", " t1", ... one token a chunk
    assert res["generated_texts"] == ["".join(f" t{i}" for i in range(n)) for n in res["output_lens"]]
    assert (res["backend"], res["model_id"], res["num_prompts"], res["request_rate"], res["max_concurrency"]) == (
        "openai", "fake-model", 3, "inf", 3)
    assert res["completed"] == 3 and res["failed"] == 0 and res["total_output_tokens"] == sum(
        b["max_tokens"] for b in fake.bodies[-3:])
    flat = {k for k in res if k.endswith("_ms")}
    assert flat == {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p50", "p90") for m in ("ttft", "e2el")}
    assert res["median_ttft_ms"] == res["runs"][0]["metrics"]["median_ttft_ms"] >= 200  # the fake's 250 ms
    assert sorted(res["output_lens"]) == sorted(b["max_tokens"] for b in fake.bodies[-3:])
    assert res["errors"] == ["", "", ""] and len(res["input_lens"]) == 3
    assert all(t >= 0.2 for t in res["ttfts"]) and [len(i) + 1 for i in res["itls"]] == res["output_lens"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "serve", "--dataset-name", "sharegpt"])
    assert main([*argv, "--metadata", "novalue"]) != 0 and "--metadata 'novalue': give KEY=VALUE" in capsys.readouterr().err


def test_logit_processors_hold_with_steps_in_flight(vllm_llm):
    """logit_bias, allowed_token_ids and bad words with 4 steps in flight: a two-token bad word needs the output
    so far, which the scheduler then keeps known (no step ahead)."""
    from tachyon import SamplingParams

    llm, prompt = vllm_llm, {"prompt_token_ids": list(range(300, 320))}
    greedy = dict(temperature=0, max_tokens=10, ignore_eos=True)
    base = llm.generate(prompt, SamplingParams(**greedy), use_tqdm=False)[0].outputs[0].token_ids
    word = [base[0], base[1]]
    out = llm.generate([prompt] * 3, [SamplingParams(**greedy, bad_words_token_ids=[word]),
                                      SamplingParams(**greedy, allowed_token_ids=[7, 8, 9], logit_bias={8: 100}),
                                      SamplingParams(temperature=1.0, seed=1, max_tokens=10, ignore_eos=True,
                                                     allowed_token_ids=[7, 8, 9])], use_tqdm=False)
    banned = out[0].outputs[0].token_ids
    assert banned[0] == base[0] and banned[1] != base[1]  # decided after token 0 came back, not ahead of it
    assert all(banned[j:j + 2] != word for j in range(len(banned) - 1))
    assert out[1].outputs[0].token_ids == [8] * 10
    assert set(out[2].outputs[0].token_ids) <= {7, 8, 9}
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
