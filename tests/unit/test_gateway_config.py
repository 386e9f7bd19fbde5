"""gateway.yaml: every mistake is named with what to change; a good config loads with its defaults."""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("pydantic")
from tachyon.gateway.config import load_config, parse_config  # noqa: E402

SHA = hashlib.sha256(b"k").hexdigest()


def test_good_config_loads(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
pools:
  main: {{backends: [{{url: "http://10.0.0.1:8000/v1/"}}, {{url: "http://10.0.0.2:8000", weight: 2}}]}}
  canary: {{backends: [{{url: "https://c:8000"}}]}}
routes:
  - {{model: smol, split: [{{pool: main, weight: 95}}, {{pool: canary, weight: 5}}]}}
  - {{model: "*", when: {{header: {{X-Scenario: batch}}}}, pool: canary}}
keys:
  - {{id: alice, sha256: "{SHA.upper()}", tier: gold, requests_per_second: 5}}
""")
    cfg = load_config(path)
    assert [b.url for b in cfg.pools["main"].backends] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert cfg.routes[1].when.header == {"x-scenario": "batch"}
    assert cfg.keys[0].sha256 == SHA and cfg.keys[0].tokens_per_minute is None
    assert cfg.health_check.interval_s == 5.0 and cfg.max_attempts == 3


@pytest.mark.parametrize("raw, message", [
    ({"pools": {"a": {"backends": [{"url": "x:1"}]}}},
     "  pools.a.backends.0.url: 'x:1' is not an http(s) URL: write it as http://HOST:PORT"),
    ({"pools": {"a": {"backends": [{"url": "http://h", "wieght": 2}]}}},
     "  pools.a.backends.0.wieght: unknown field: remove it or check its spelling"),
    ({"pools": {"a": {"backends": [{"url": "http://h"}]}}, "routes": [{"model": "m", "pool": "b"}]},
     "  (top level): routes[0] (model 'm') names pool 'b', which is not under 'pools:' (pools: a)"),
    ({"pools": {"a": {"backends": [{"url": "http://h"}]}}, "routes": [{"model": "m"}]},
     "  routes.0: give a route either 'pool: NAME' or 'split: [{pool: NAME, weight: W}, ...]', not both or neither"),
    ({"pools": {"a": {"backends": [{"url": "http://h"}]}}, "keys": [{"id": "k", "sha256": "secret"}]},
     "  keys.0.sha256: not a sha256 in hex (64 characters 0-9a-f): store the key's hash, "
     "printf %s \"$KEY\" | sha256sum, never the key itself"),
    ({"pools": {"a": {"backends": [{"url": "http://h"}]}},
      "keys": [{"id": "k", "sha256": SHA}, {"id": "j", "sha256": SHA}]},
     "  (top level): keys 'k' and 'j' have the same sha256: each key must differ"),
])
def test_mistakes_say_what_to_change(raw, message):
    with pytest.raises(ValueError) as e:
        parse_config(raw, "gateway.yaml")
    assert str(e.value) == f"gateway.yaml: 1 problem(s):\n{message}"


def test_not_a_mapping(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="expected a mapping with 'pools:'"):
        load_config(path)


def test_names_a_backend_reports_and_what_it_is_sent():
    """NAME@VERSION is sent as NAME to an OpenAI server, as NAME@VERSION to a Tachyon one (which then answers from
    that version or 404); a non-default Tachyon version's card already carries it in its id."""
    from tachyon.gateway.backends import model_ids

    cards = {"data": [{"id": "smol", "version": "v1", "owned_by": "tachyon"},
                      {"id": "smol@v2", "version": "v2", "owned_by": "tachyon"},
                      {"id": "big", "version": "2024", "owned_by": "vllm"}, {"id": "plain"}, {"no": "id"}]}
    assert model_ids(cards) == {"smol": "smol", "smol@v1": "smol@v1", "smol@v2": "smol@v2", "big": "big",
                                "big@2024": "big", "plain": "plain"}
