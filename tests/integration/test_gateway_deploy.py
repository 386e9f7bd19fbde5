"""deploy/: the alert rules fire and clear (promtool), every alert has a fixture and the seeds' thresholds, the
Prometheus config is valid, a real Prometheus scrapes a server and the gateway, nginx (TLS) in front of a backend
passes a stream through chunk by chunk, and the Kubernetes manifests validate against the Kubernetes schemas.
Each check skips when its tool is absent.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian: apt-get install {'prometheus' if name == 'promtool' else name})")
    return path


def _alerts() -> dict[str, dict]:
    doc = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_alert_rules_fire_and_clear():
    promtool = _tool("promtool")
    out = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=DEPLOY / "prometheus",
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=DEPLOY / "prometheus",
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_fires_and_clears_in_the_fixtures_and_the_seed_thresholds_hold():
    tests = yaml.safe_load((DEPLOY / "prometheus/alerts_test.yml").read_text())["tests"]
    fired, cleared = set(), set()
    for t in tests:
        for case in t["alert_rule_test"]:
            (fired if case["exp_alerts"] else cleared).add(case["alertname"])
    alerts = _alerts()
    assert fired == cleared == set(alerts)
    squashed = {name: re.sub(r"\s+", " ", r["expr"]).strip() for name, r in alerts.items()}
    assert squashed["TachyonHighTTFT"].startswith("histogram_quantile(0.99, sum by (le, model_name, instance) "
                                                   "( rate(tachyon:time_to_first_token_seconds_bucket[5m]))) > 2")
    assert squashed["TachyonHighE2ELatency"].endswith("rate(tachyon:e2e_request_latency_seconds_bucket[5m]))) > 5")
    assert squashed["TachyonGPUMemoryHigh"].endswith(
        "(tachyon:gpu_memory_used_bytes / tachyon:gpu_memory_total_bytes) > 0.95")


def test_grafana_dashboard_shows_gpu_and_gateway():
    dash = json.loads((DEPLOY / "grafana/tachyon.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", ()))
    for metric in ("tachyon:gpu_memory_used_bytes", "tachyon:gpu_utilization_perc", "tachyon_gateway:requests_total",
                   "tachyon_gateway:backend_healthy", "tachyon_gateway:time_to_first_token_seconds_bucket",
                   "tachyon:e2e_request_latency_seconds_bucket"):
        assert metric in exprs, metric
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


@pytest.fixture
def tls(tmp_path):
    openssl = _tool("openssl")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", tmp_path / "tachyon.key", "-out", tmp_path / "tachyon.crt"], check=True,
                   capture_output=True)
    return tmp_path


def test_nginx_tls_in_front_passes_streams_chunk_by_chunk(tls):
    nginx = _tool("nginx")
    pytest.importorskip("fastapi")
    from tachyon.bench.fake_openai import FakeState, create_fake_app
    from tests.integration.conftest import _bound_socket, serve_in_thread

    ports = []
    for _ in range(2):
        s = _bound_socket()
        ports.append(s.getsockname()[1])
        s.close()
    state = FakeState("n", ["m"], ttft_s=0.4, itl_s=0.4, num_chunks=3)
    with serve_in_thread(create_fake_app(state)) as backend:
        conf = (DEPLOY / "nginx/nginx.conf").read_text()
        conf = re.sub(r"server 127\.0\.0\.1:8080 [^;]*;\s*server 127\.0\.0\.1:8081 [^;]*;",
                      f"server {backend.removeprefix('http://')};", conf)
        conf = (conf.replace("listen 80;", f"listen 127.0.0.1:{ports[0]};")
                .replace("listen 443 ssl", f"listen 127.0.0.1:{ports[1]} ssl")
                .replace("/etc/nginx/tls", str(tls)).replace("/tmp/tachyon-nginx", str(tls / "nginx")))
        (tls / "nginx.conf").write_text(conf)
        check = subprocess.run([nginx, "-t", "-c", str(tls / "nginx.conf")], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        proc = subprocess.Popen([nginx, "-c", str(tls / "nginx.conf"), "-g", "daemon off;"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            url = f"https://127.0.0.1:{ports[1]}"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", verify=False, timeout=1).status_code == 200:
                        break
                time.sleep(0.05)
            assert httpx.get(f"http://127.0.0.1:{ports[0]}/v1/models").status_code == 301  # plain HTTP: to TLS
            assert httpx.get(f"{url}/metrics", verify=False).status_code == 403
            start, seen = time.monotonic(), []
            with httpx.stream("POST", f"{url}/v1/completions", verify=False, timeout=30,
                              json={"model": "m", "prompt": "hi", "stream": True}) as r:
                for line in r.iter_lines():
                    if line:
                        seen.append((time.monotonic() - start, line))
            assert [line for _, line in seen][-1] == "data: [DONE]" and len(seen) == 4
            # chunk i leaves the backend at 0.4 * (i + 1) s, the next 0.4 s later: each arrives before the next is made
            for i, (t, _) in enumerate(seen[:3]):
                assert 0.4 * (i + 1) - 0.05 < t < 0.4 * (i + 1) + 0.35, seen
            assert state.bodies[-1]["prompt"] == "hi"
        finally:
            proc.terminate()
            proc.wait(10)


def _k8s_documents() -> list[dict]:
    """The base as kustomize renders it (kubectl), else its resource files as they are."""
    base = DEPLOY / "k8s/base"
    kubectl = shutil.which("kubectl")
    if kubectl:
        out = subprocess.run([kubectl, "kustomize", str(base)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    return [d for f in kustomization["resources"] for d in yaml.safe_load_all((base / f).read_text()) if d]


def test_kubernetes_manifests_validate_against_the_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _k8s_documents()
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)  # raises, naming the field, if a manifest is wrong
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    serve = by_kind["Deployment"]["tachyon-serve"]["spec"]["template"]["spec"]
    container = serve["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    timeout = float(container["args"][container["args"].index("--shutdown-timeout") + 1])
    assert serve["terminationGracePeriodSeconds"] > timeout + 5  # running requests finish before the kill
    assert "tachyon-serve" in by_kind["PodDisruptionBudget"]
    hpa = by_kind["HorizontalPodAutoscaler"]["tachyon-serve"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "tachyon_num_requests_waiting"


def test_the_clusters_gateway_config_loads():
    pytest.importorskip("pydantic")
    from tachyon.gateway.config import load_config

    cfg = load_config(DEPLOY / "k8s/base/gateway-config.yaml")
    assert cfg.pools["main"].backends[0].url == "http://tachyon-serve:8000"


def test_prometheus_scrapes_a_server_and_the_gateway(server, tmp_path):
    """A real Prometheus with deploy/'s alert rules scrapes `server` (conftest) and a gateway in front of it; its query
    API returns their series, and it loaded every alert group."""
    prometheus = _tool("prometheus")
    from tachyon.gateway.app import create_gateway_app
    from tachyon.gateway.config import parse_config
    from tests.integration.conftest import API_KEY, _bound_socket, serve_in_thread

    s = _bound_socket()
    port = s.getsockname()[1]
    s.close()
    gw_cfg = {"pools": {"p": {"backends": [{"url": server.url, "api_key": API_KEY}]}}}
    with serve_in_thread(create_gateway_app(parse_config(gw_cfg))) as gw:
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(DEPLOY / "prometheus/alerts.yml")],
                  "scrape_configs": [
                      {"job_name": "tachyon", "static_configs": [{"targets": [server.url.removeprefix("http://")]}]},
                      {"job_name": "tachyon-gateway", "static_configs": [{"targets": [gw.removeprefix("http://")]}]}]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=(tmp_path / "log").open("w"))
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            def query(q: str) -> list[dict]:
                return httpx.get(f"{api}/query", params={"query": q}, timeout=5).json()["data"]["result"]

            deadline = time.monotonic() + 30
            results: dict[str, list] = {}
            wanted = ("tachyon:kv_cache_num_blocks", 'tachyon_gateway:backend_healthy{backend="p/0"}')
            while time.monotonic() < deadline and not all(results.get(q) for q in wanted):
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    results = {q: query(q) for q in wanted}
                time.sleep(0.25)
            blocks = results.get(wanted[0])
            assert blocks, (tmp_path / "log").read_text()[-3000:]
            assert float(blocks[0]["value"][1]) == server.engine.kv.num_blocks
            assert blocks[0]["metric"]["job"] == "tachyon" and blocks[0]["metric"]["model_name"]
            assert float(results[wanted[1]][0]["value"][1]) == 1.0
            groups = httpx.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
            assert {g["name"] for g in groups} == {"tachyon", "tachyon-gateway"}
            assert {r["name"] for g in groups for r in g["rules"]} == set(_alerts())
        finally:
            proc.terminate()
            proc.wait(10)


def test_every_gateway_series_in_deploy_exists():
    """Every `tachyon_gateway:` name in the alerts and the dashboard is one the gateway exports (catches renames)."""
    pytest.importorskip("fastapi")
    from prometheus_client import generate_latest

    from tachyon.gateway.app import Gateway
    from tachyon.gateway.config import parse_config

    gw = Gateway(parse_config({"pools": {"p": {"backends": [{"url": "http://127.0.0.1:1"}]}}}))
    text = generate_latest(gw.metrics.registry).decode()
    exported = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            exported |= {name} | ({f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else set())
            exported |= {f"{name}_total"} if kind == "counter" else set()
    for path in (DEPLOY / "prometheus/alerts.yml", DEPLOY / "grafana/tachyon.json"):
        used = set(re.findall(r"tachyon_gateway:[a-z0-9_]+", path.read_text()))
        assert used and used <= exported, f"{path.name}: {sorted(used - exported)} not exported by the gateway"
