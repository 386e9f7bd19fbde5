"""Model management on a live server: the admin API loads, unloads and swaps model versions at run time.

Two tiny random Llamas (the embedded model's tokenizer, different seeds: their greedy tokens differ) stand for
two models or two versions of one. The server starts with `tiny` v1 in this process; what the admin API loads
runs in its own engine-core process, as under `tachyon serve`. Each answer is checked token for token against
transformers' greedy decoding of the weights that should have produced it.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import shutil

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tachyon.engine.async_engine import AsyncEngine  # noqa: E402
from tests.conftest import hf_greedy  # noqa: E402
from tests.integration.conftest import API_KEY, serve_in_thread  # noqa: E402

ADMIN = "admin-key"
PROMPT = [1, 422, 108, 314, 302, 30]
NUM_TOKENS = 12
TOKENS_AS_IDS = {"return_tokens_as_token_ids": True, "ignore_eos": True}


def _tiny(path, seed: int, embedded_dir: str):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=False, initializer_range=0.2, bos_token_id=1,
                                   eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(embedded_dir, name), path / name)
    return hf_greedy(model, PROMPT, NUM_TOKENS)


@pytest.fixture(scope="module")
def managed(tmp_path_factory, embedded_dir):
    """(url, app, {"a": (dir, greedy ids), "b": ...}): `tiny` v1 (checkpoint a) served, with the admin API."""
    from tachyon.build import build_engine
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app
    from tachyon.server.cli import model_loader
    from tachyon.server.frontend import FrontendOptions

    root = tmp_path_factory.mktemp("models")
    ckpts = {}
    for seed, name in enumerate("ab"):
        (root / name).mkdir()
        ckpts[name] = (str(root / name), _tiny(root / name, seed, embedded_dir))
    assert ckpts["a"][1] != ckpts["b"][1]
    args = EngineArgs(model=ckpts["a"][0], kv_cache_memory_gib=0.05, swap_space=0, max_model_len=256)
    load = model_loader(args, FrontendOptions(), engine_process=True)  # what /admin/models/load runs
    app = create_app(AsyncEngine(build_engine(args)), "tiny", api_key=API_KEY, model_path=ckpts["a"][0],
                     model_version="v1", admin_api_key=ADMIN, model_loader=load)
    with serve_in_thread(app) as url:
        yield url, app, ckpts


def admin(url: str, path: str, key: str | None = ADMIN, **body) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/admin/models/{path}", json=body, headers=headers, timeout=120)


def greedy_ids(client, model: str) -> list[int]:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=NUM_TOKENS, temperature=0, logprobs=0,
                                  extra_body=TOKENS_AS_IDS)
    return [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]


def error(status: int, type_: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


def test_admin_api_refuses_without_the_admin_key(managed):
    url, app, ckpts = managed
    r = admin(url, "load", key=None, model=ckpts["b"][0])
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == error(401, "AuthenticationError", "the admin API needs the header 'Authorization: Bearer "
                                                         "ADMIN_KEY' (--admin-api-key)")
    forbidden = error(403, "PermissionDeniedError", "this key may not use the admin API: send the admin key "
                                                    "(--admin-api-key)")
    for path in ("load", "unload", "swap"):  # the API key of /v1 is not the admin key
        r = admin(url, path, key=API_KEY, model=ckpts["b"][0])
        assert (r.status_code, r.json()) == (403, forbidden)
    r = httpx.get(f"{url}/admin/models", headers={"Authorization": "Bearer wrong"})
    assert (r.status_code, r.json()) == (403, forbidden)
    # the admin key is no /v1 key
    r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 401
    # bodies it cannot act on
    r = admin(url, "load", model=ckpts["b"][0], served_model_name="x", version="v@2")
    assert r.status_code == 400 and r.json()["error"]["param"] == "version"
    r = admin(url, "load", model=ckpts["b"][0], gpu="0")
    assert r.status_code == 400 and r.json()["error"]["param"] == "gpu"
    r = admin(url, "load", model=ckpts["b"][0], served_model_name="tiny", version="v1")
    assert (r.status_code, r.json()) == (409, error(409, "ConflictError", "tiny@v1 is already loaded: unload it "
                                                                          "first, or give another version"))
    r = admin(url, "load", model="/no/such/checkpoint", served_model_name="x")
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("could not load the model "
                                                                           "'/no/such/checkpoint'")
    r = admin(url, "unload", model="nothing@v9")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = admin(url, "swap", served_model_name="tiny", version="v7")  # no checkpoint: promote a loaded version
    assert (r.status_code, r.json()["error"]["message"]) == (404, "tiny@v7 is not loaded: give its checkpoint as "
                                                                  "'model'")
    # a swap whose new version fails to start leaves the old one serving
    r = admin(url, "swap", model="/no/such/checkpoint", served_model_name="tiny", version="v2")
    assert r.status_code == 400 and "could not load the model" in r.json()["error"]["message"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert greedy_ids(client, "tiny@v1") == ckpts["a"][1]
    # a server started without an admin key has no admin API
    from tachyon.server.app import create_app

    bare = create_app(AsyncEngine(app.state.engine), "tiny")

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(bare), base_url="http://t") as c:
            return await c.post("/admin/models/load", json={"model": "x"}, headers={"Authorization": "Bearer x"})

    r = asyncio.run(post())
    assert (r.status_code, r.json()) == (404, error(404, "NotFoundError", "the admin API is off: start the server "
                                                                          "with --admin-api-key (or $TACHYON_ADMIN_KEY)"))


def test_load_a_second_model_serve_both_then_unload(managed):
    url, app, ckpts = managed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    r = admin(url, "load", model=ckpts["b"][0], served_model_name="other", version="v1")
    assert r.status_code == 200, r.text
    loaded = r.json()["loaded"]
    assert loaded["model"] == "other@v1" and loaded["default_for"] == ["other"] and loaded["state"] == "serving"
    pid = loaded["engine_pid"]
    assert pid in [p.pid for p in mp.active_children()]  # its own engine-core process
    assert {(m.id, m.model_extra["version"]) for m in client.models.list()} == {("tiny", "v1"), ("other", "v1")}
    # both serve, each with its own weights, under NAME and NAME@VERSION
    assert greedy_ids(client, "tiny") == greedy_ids(client, "tiny@v1") == ckpts["a"][1]
    assert greedy_ids(client, "other") == greedy_ids(client, "other@v1") == ckpts["b"][1]
    text = httpx.get(f"{url}/metrics").text
    families = {f.name for f in text_string_to_metric_families(text)}  # one family per name: it parses
    assert "tachyon:request_success" in families and 'model_name="other@v1"' in text

    r = admin(url, "unload", model="other")
    assert (r.status_code, r.json()) == (200, {"unloaded": "other@v1", "in_flight": 0, "aborted": 0})
    for name in ("other", "other@v1"):
        with pytest.raises(openai.NotFoundError) as e:
            greedy_ids(client, name)
        assert e.value.body == {"message": f"the model {name!r} does not exist; this server serves 'tiny', 'tiny@v1'",
                                "type": "NotFoundError", "param": "model", "code": 404}
    assert [m.id for m in client.models.list()] == ["tiny"]
    # its engine-core process is gone: exited and reaped, no orphan left
    assert pid not in [p.pid for p in mp.active_children()] and not os.path.exists(f"/proc/{pid}")
    assert 'model_name="other@v1"' not in httpx.get(f"{url}/metrics").text
    assert greedy_ids(client, "tiny") == ckpts["a"][1]


def test_swap_under_load_loses_nothing_and_the_gateway_follows(managed):
    """16 streams run on tiny v1 in a loop while tiny is swapped to v2: every stream completes with all its
    tokens (v1's or v2's), every one started after the swap gets v2, v1 is drained (not aborted) and shut down."""
    from tachyon.gateway.app import create_gateway_app
    from tachyon.gateway.config import parse_config

    url, app, ckpts = managed
    v1, v2 = ckpts["a"][1], ckpts["b"][1]
    gw_cfg = {"pools": {"p": {"backends": [{"url": url, "api_key": API_KEY}]}},
              "health_check": {"interval_s": 60, "ejected_interval_s": 60}}
    gw_app = create_gateway_app(parse_config(gw_cfg), seed=0)
    with serve_in_thread(gw_app) as gw_url:
        gw = openai.OpenAI(base_url=f"{gw_url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert greedy_ids(gw, "tiny@v1") == v1  # the gateway read tiny's version from the server's /v1/models

        async def run():
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
            swapped = asyncio.Event()

            async def one() -> list[int]:
                stream = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=NUM_TOKENS,
                                                         temperature=0, logprobs=0, stream=True,
                                                         extra_body=TOKENS_AS_IDS)
                ids, finish = [], None
                async for chunk in stream:
                    for c in chunk.choices:
                        ids += [int(t.removeprefix("token_id:")) for t in c.logprobs.tokens]
                        finish = c.finish_reason or finish
                assert finish == "length"
                return ids

            async def worker() -> list[tuple[bool, list[int]]]:
                results = []
                while True:
                    after = swapped.is_set()
                    results.append((after, await one()))
                    if after:
                        return results

            workers = [asyncio.create_task(worker()) for _ in range(16)]
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient(timeout=120) as http:
                swap = await http.post(f"{url}/admin/models/swap", headers={"Authorization": f"Bearer {ADMIN}"},
                                       json={"model": ckpts["b"][0], "served_model_name": "tiny", "version": "v2"})
            swapped.set()
            return swap, [r for w in await asyncio.gather(*workers) for r in w]

        swap, results = asyncio.run(run())
        assert swap.status_code == 200, swap.text
        body = swap.json()
        assert body["swapped"] == {"from": ["tiny@v1"], "to": "tiny@v2"} and body["aborted"] == 0
        assert body["in_flight"] >= 1  # streams were running on v1 when it was switched off; all drained
        assert all(ids in (v1, v2) for _, ids in results)  # every stream complete, from one version or the other
        assert [ids for after, ids in results if after] == [v2] * 16
        assert any(ids == v1 for _, ids in results)

        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
        assert greedy_ids(client, "tiny") == greedy_ids(client, "tiny@v2") == v2
        with pytest.raises(openai.NotFoundError):
            greedy_ids(client, "tiny@v1")
        assert [(m.id, m.model_extra["version"]) for m in client.models.list()] == [("tiny", "v2")]
        assert [m["model"] for m in httpx.get(f"{url}/admin/models", headers={"Authorization": f"Bearer {ADMIN}"})
                .json()["data"]] == ["tiny@v2"]
        # the gateway has not probed since: tiny@v1 reaches the server, whose 404 makes it re-read /v1/models
        with pytest.raises(openai.NotFoundError):
            greedy_ids(gw, "tiny@v1")
        assert {m.id for m in gw.models.list()} == {"tiny", "tiny@v2"}
        assert greedy_ids(gw, "tiny@v2") == greedy_ids(gw, "tiny") == v2
